"""The training side: worker, group (re)formation, healing, exact-once data, checkpoints."""
