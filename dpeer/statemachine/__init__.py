"""Durable, deterministic node state: the log, term/vote, snapshots, the applied cluster state."""
