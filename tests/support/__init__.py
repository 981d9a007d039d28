"""Helpers the tests share: real daemons driven through the CLI (daemons.py), a test PKI (pki.py),
local clusters (cluster.py) and chaos runs (chaos.py). Fixtures stay in the conftest.py files."""
