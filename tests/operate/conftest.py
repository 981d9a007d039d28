"""Operating dpeer as a user does: real `dpeer` processes on 127.0.0.1, driven through the CLI
(the helpers live in tests/support/daemons.py).

Every daemon a test starts is a process of its own session; the fixtures SIGKILL exactly those
at the end, whatever happened, and print their logs when the test failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.daemons import Daemons, tear_down


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Remember each phase's outcome on the item, so fixtures can print logs on failure."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test's call phase failed (the hook above records it)."""
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and rep.failed


@pytest.fixture
def daemons(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemons]:
    """A Daemons whose processes are all SIGKILLed at the end; their logs printed on failure."""
    made = Daemons(tmp_path)
    yield made
    tear_down([made], failed(request))
