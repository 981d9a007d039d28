"""Shared test setup: the slow marker runs only with DPEER_SLOW=1."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked slow unless DPEER_SLOW=1 asks for the long variants."""
    if os.environ.get("DPEER_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long variant: set DPEER_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
