"""Fixtures for real-process tests (tests/support/daemons.py): clusters of daemons on 127.0.0.1,
or `dpeer start` processes one by one, always torn down; a fresh PKI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.operate.conftest import daemons, failed, pytest_runtest_makereport  # noqa: F401 (fixture, hook)
from tests.support.daemons import Daemons, tear_down
from tests.support.pki import Pki, make_pki


@pytest.fixture
def make_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemons]]:
    """Build clusters (Daemons of `size` nodes) that are SIGKILLed at the end of the test,
    printing logs on failure."""
    made: list[Daemons] = []

    def make(size: int, **kwargs: Any) -> Daemons:
        cluster = Daemons(tmp_path / f"c{len(made)}", size, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    tear_down(made, failed(request))


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    """A fresh PKI in the test's temp dir (the secured setup README documents)."""
    yield make_pki(tmp_path / "pki")
