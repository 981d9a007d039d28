"""A real partition: three boxes in network namespaces, one cut off with `ip link set down`, so
its gRPC, the rendezvous store, Gloo and the heal are all cut (the chaos tool's transport hook
cuts only the daemons' own messages). The minority stops training, the majority goes on, the cut
box comes back, heals and trains with the others; committed logs and replicas agree."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpeer import errors
from dpeer.channel.local import read_reports
from dpeer.chaos import netns
from dpeer.transport.client import NodeClient
from dpeer.transport.options import Security
from dpeer.trainer.audit import audit, read_ledger, read_records
from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.sampler import GlobalBatchSampler
from tests.support.netns_boxes import Boxes

BATCH, WAIT = 16, 120.0
CONFIG = {"job": "demo", "training": {"steps": 100000, "global_batch": BATCH, "micro_batch": 8,
                                      "checkpoint_every": 0, "digest_every": 5}}


def status(addr: str) -> dict[str, Any] | None:
    async def get() -> dict[str, Any] | None:
        try:
            async with NodeClient(addr, Security(), timeout=2.0) as client:
                return json.loads((await client.status()).json)
        except errors.PeerError:
            return None
    return asyncio.run(get())


def wait(what: str, check: Any, timeout: float = WAIT) -> Any:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def step_in_world(doc: dict | None, world: int) -> int:
    if not doc or (doc.get("group") or {}).get("world_size") != world:
        return -1
    return (doc.get("train") or {}).get("latest_step", -1)


def progress_times(root: Path, node: str) -> list[float]:
    return [float(r["t"]) for r in read_reports(str(root / node / "worker"), node) if r.get("kind") == "progress"]


@pytest.fixture
def boxes(tmp_path: Path):
    reason = netns.why_not()
    if reason:
        pytest.skip(reason)
    boxes = Boxes(netns.Net(tmp_path, 3))
    yield boxes
    boxes.close()


def test_a_cut_off_box_stops_training_the_majority_goes_on_and_the_box_heals_back(boxes: Boxes, tmp_path: Path):
    net = boxes.net
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump(CONFIG))
    addrs = {i: f"{net.addr_of(i)}:7100" for i in (1, 2, 3)}
    for i in (1, 2, 3):  # off loopback: --insecure (certificates are tests/security's business)
        args = ["start", "--node-id", f"n{i}", "--listen", addrs[i], "--data-dir", str(tmp_path / f"n{i}"),
                "--config", str(conf), "--insecure"]
        boxes.run(i, args + ([] if i == 1 else ["--join", addrs[1]]), tmp_path / f"n{i}.log")
    wait("three boxes training together", lambda: all(step_in_world(status(addrs[i]), 3) >= 20 for i in (1, 2, 3)))

    net.cut(3)
    cut_at = time.time()
    before = max(step_in_world(status(addrs[i]), 2) for i in (1, 2))
    wait("n1 and n2 training on as two", lambda: min(step_in_world(status(addrs[i]), 2) for i in (1, 2)) > before + 30)

    def n3_fenced() -> bool:
        doc = json.loads(boxes.cli(3, "status", "--addr", addrs[3], "--json").stdout or "null")
        return bool(doc and doc["worker"]["fenced"] and doc["worker"]["pid"] is None)
    wait("n3, cut off, stops its worker (it cannot reach a quorum)", n3_fenced)

    net.heal(3)
    healed_at = time.time()
    leader_step = max(step_in_world(status(addrs[i]), 3) for i in (1, 2))
    wait("n3 back in a group of three, at the others' step", lambda: all(
        step_in_world(status(addrs[i]), 3) > leader_step + 10 for i in (1, 2, 3)), timeout=2 * WAIT)

    late = [t for t in progress_times(tmp_path, "n3") if cut_at + 0.5 < t < healed_at]
    assert not late, f"n3 committed {len(late)} steps while it was cut off (the minority must not train)"
    logs = [boxes.cli(i, "log", "--addr", addrs[i], "--json").stdout.splitlines() for i in (1, 2, 3)]
    shortest = min(len(lines) for lines in logs)
    assert shortest > 5 and all(lines[:shortest] == logs[0][:shortest] for lines in logs), "committed logs differ"
    paths = {f"n{i}": str(tmp_path / f"n{i}" / "worker" / "ledger.jsonl") for i in (1, 2, 3)}
    done = min(max(e["step"] for e in read_ledger(path)) for path in paths.values())
    sampler = GlobalBatchSampler(DEFAULTS["dataset_len"], BATCH, DEFAULTS["seed"])
    # audited up to `done`: the boxes train on while the ledgers are read one after another, so a
    # later read can hold a step whose trained record an earlier read missed
    records = {name: read_records(path) for name, path in paths.items()}
    assert not audit(records, done + 1, sampler, CONFIG["training"]["micro_batch"])
