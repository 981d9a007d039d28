"""The daemon's pure decisions, table-tested: each takes what a driver observed and returns what to
do and why. No asyncio, grpc, lmdb, torch or clock here, and no import of a driver (tests/test_layers.py)."""
