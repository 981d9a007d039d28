"""Fixtures of the security tests: a fresh PKI per test (tests/support/pki.py), and the daemons."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.operate.conftest import daemons, pytest_runtest_makereport  # noqa: F401 (fixture, hook)
from tests.support.pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    """A fresh PKI in the test's temp dir."""
    yield make_pki(tmp_path / "pki")
