"""Chaos tests: run `dpeer chaos` as a user would (tests/support/chaos.py), with a shared reference model.

The fault-free reference (a 1-node run of the same training config) is cached for the session,
so the smoke test and the planted-bug test pay for it once.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos-reference")
