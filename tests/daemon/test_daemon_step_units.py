"""Which step the leader weighs a change of shares alone against (speeds.worth_resharing): the
job's, from the config of a box that runs it; a box that runs no job has no step of the job in its
config (its `training` is whatever its file says, the defaults most often), so it takes every change."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from dpeer.daemon.config import NodeConfig
from dpeer.daemon.daemon import Daemon
from dpeer.statemachine.store import Store
from dpeer.transport.options import Security


def _daemon(tmp_path: Path, worker: object | None) -> Daemon:
    config = NodeConfig(node_id="n1", listen="127.0.0.1:7100", data_dir=tmp_path / "n1")
    store = Store.open(tmp_path / "n1" / "store", node_id="n1")
    transport = SimpleNamespace(send=None)
    return Daemon(config, store, Security(), worker, transport=lambda refused: transport)  # type: ignore[arg-type]


def test_a_leader_that_runs_no_job_does_not_judge_shares_by_a_default_step(tmp_path: Path) -> None:
    # n1 runs no job: its training config is the defaults (64 / 16: 4 micro-batches), not the job's
    # (say 1024 / 16: 64). Judged on 4 micro-batches, four boxes one of them 4x slower split 1/1/1/1
    # evenly or by speed, so the leader would keep the even split for good (1.00x), where the job's 64
    # micro-batches take 0.31x of the time by speed.
    daemon = _daemon(tmp_path, None)
    try:
        assert daemon.leader.step_units is None
    finally:
        daemon.store.close()


def test_a_leader_that_runs_the_job_judges_shares_by_its_step(tmp_path: Path) -> None:
    worker = SimpleNamespace(store_port=0, ready=False, attach=lambda link: None)
    daemon = _daemon(tmp_path, worker)
    try:
        assert daemon.leader.step_units == daemon.config.training.step_units == 4
    finally:
        daemon.store.close()
