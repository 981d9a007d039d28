"""Fixtures for real-process tests: a LocalCluster of daemons on 127.0.0.1, always torn down; or
`dpeer start` processes one by one (tests/support/daemons.py) with a fresh PKI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from dpeer.launch.cluster import LocalCluster
from tests.operate.conftest import daemons, pytest_runtest_makereport  # noqa: F401 (fixture, hook)
from tests.support.pki import Pki, make_pki


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Build clusters that are SIGKILLed at the end of the test, printing logs on failure."""
    made: list[LocalCluster] = []

    def make(size: int, **kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"c{len(made)}", size, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    """A fresh PKI in the test's temp dir (the secured setup README documents)."""
    yield make_pki(tmp_path / "pki")
