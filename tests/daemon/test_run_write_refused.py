"""`dpeer start` on a disk that refuses the founding write (a new store created, the first entry
refused): one sentence and exit 1, the store closed, no traceback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dpeer.daemon import run
from dpeer.daemon.config import NodeConfig
from dpeer.statemachine.store import Store
from tests.support.failing_disk import failing
from tests.support.trainer_cluster import free_ports


def test_a_founding_write_the_disk_refuses_exits_1_with_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    opened: list[Store] = []
    real_open = Store.open

    def open_failing(path: Any, **kw: Any) -> Store:
        store = real_open(path, **kw)
        failing(store).failing = True
        opened.append(store)
        return store

    monkeypatch.setattr(run.Store, "open", open_failing)
    config = NodeConfig(node_id="n1", listen=f"127.0.0.1:{free_ports(1)[0]}", data_dir=tmp_path / "n1")
    try:
        code = run.run_daemon(config)
    finally:
        logging.getLogger("dpeer").handlers[:] = []
        logging.getLogger("dpeer").propagate = True
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("dpeer: cannot write the state store"), err
    assert opened and opened[0].disk._closed, "the store is closed"
