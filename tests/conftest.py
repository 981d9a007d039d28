"""Shared test setup: the slow marker runs only with DPEER_SLOW=1; property tests draw the same
examples on every run (so a red run is a regression, not an unlucky draw) unless DPEER_EXPLORE=1
asks for fresh ones."""

from __future__ import annotations

import logging
import os
from typing import Iterator

import pytest
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("DPEER_EXPLORE") == "1" else "repeatable")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked slow unless DPEER_SLOW=1 asks for the long variants."""
    if os.environ.get("DPEER_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant: set DPEER_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _dpeer_logger_restored() -> Iterator[None]:
    """Each test starts with the `dpeer` logger as Python makes it (propagating, so caplog sees its
    records) and leaves it so: a test that runs the CLI in-process sets it up as a daemon does
    (dpeer.daemon.logs.setup: its own handler, no propagation), which would hide later tests' records."""
    root = logging.getLogger("dpeer")
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:], root.level, root.propagate = [], logging.NOTSET, True
    try:
        yield
    finally:
        root.handlers[:], root.level, root.propagate = saved
