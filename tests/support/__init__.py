"""Helpers the tests share: real daemons driven through the CLI (daemons.py), local clusters
(cluster.py), training through them (training.py), a test PKI and raw channels (pki.py), chaos
runs (chaos.py), ExactStep in one process (exact.py, with its 1-rank group fixture) and the
trainer's state as the heal takes it (heal_state.py). Per-folder fixtures stay in conftest.py."""
