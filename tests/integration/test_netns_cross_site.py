"""Bytes crossing sites, counted from the kernel on real boxes: two boxes in network namespaces
(their own IPs), each in its own configured site, train the demo together. Each box's status and
metrics count what its daemon and its worker moved to the other site, and the worker's count per
step matches what the exact reduction sends for the model's size."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dpeer.chaos import netns
from dpeer.transport.options import Security
from dpeer.transport import calls
from dpeer.transport.client import NodeClient
from tests.integration.test_netns_partition import status, step_in_world, wait
from tests.support.netns_boxes import Boxes

DIM, HIDDEN, CLASSES = 128, 512, 10
PARAMS = DIM * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
CONFIG = {"job": "demo", "training": {"steps": 100000, "global_batch": 16, "micro_batch": 8, "checkpoint_every": 0,
                                      "digest_every": 1, "options": {"dim": DIM, "hidden": HIDDEN}}}


@pytest.fixture
def boxes(tmp_path: Path):
    reason = netns.why_not()
    if reason:
        pytest.skip(reason)
    boxes = Boxes(netns.Net(tmp_path, 2))
    yield boxes
    boxes.close()


def counted(doc: dict) -> tuple[int, dict]:
    return doc["train"]["latest_step"], doc["cross_site_bytes"]


async def _pause(addr: str) -> calls.JobControlReply:
    async with NodeClient(addr, Security(), timeout=10.0) as client:
        return await client.job_control("pause")


def _settled(addr: str) -> tuple[int, dict] | None:
    """The (step, bytes) reading of a paused box whose worker moved no byte and no step across two
    of the counters' beats; None until then."""
    readings = []
    for _ in range(2):
        doc = status(addr)
        if not doc or doc.get("control") != "paused" or not doc.get("train"):
            return None
        readings.append(counted(doc))
        time.sleep(0.6)  # one metrics beat between the two readings
    (step0, bytes0), (step1, bytes1) = readings
    return readings[1] if step0 == step1 and bytes0["worker"] == bytes1["worker"] else None


def test_each_box_counts_the_bytes_its_daemon_and_worker_move_to_the_other_site(boxes: Boxes, tmp_path: Path):
    net = boxes.net
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump(CONFIG))
    addrs = {i: f"{net.addr_of(i)}:7100" for i in (1, 2)}
    for i in (1, 2):
        args = ["start", "--node-id", f"n{i}", "--listen", addrs[i], "--data-dir", str(tmp_path / f"n{i}"),
                "--config", str(conf), "--insecure", "--site", f"lab-{i}", "--metrics-listen", "127.0.0.1:9100"]
        boxes.run(i, args + ([] if i == 1 else ["--join", addrs[1]]), tmp_path / f"n{i}.log")
    wait("two boxes training together", lambda: all(step_in_world(status(addrs[i]), 2) >= 20 for i in (1, 2)),
         timeout=240)

    first = {i: counted(status(addrs[i])) for i in (1, 2)}
    wait("40 more steps", lambda: min(step_in_world(status(addrs[i]), 2) for i in (1, 2)) >= first[1][0] + 40)
    # the counters are read on the metrics' beat (0.5 s) while the step is current: a reading taken
    # mid-training misses up to a beat of steps' bytes (0.79x of the wire's figure on a fast step).
    # So the last reading is taken paused, once the worker's counts and the step held still.
    assert asyncio.run(_pause(addrs[1])).accepted
    last = {i: wait(f"n{i}'s worker paused, its counts settled", lambda i=i: _settled(addrs[i])) for i in (1, 2)}
    for i in (1, 2):
        (step0, bytes0), (step1, bytes1) = first[i], last[i]
        assert bytes1["daemon"]["sent"] > 0 and bytes1["daemon"]["received"] > 0, bytes1  # heartbeats, Raft
        # exact mode, one micro-batch a rank: each step sends the other rank its half of the
        # float32 gradient and gets back the means of its own half: 4 bytes a parameter each way
        per_step = (bytes1["worker"]["sent"] - bytes0["worker"]["sent"]) / max(1, step1 - step0)
        assert 0.8 * 4 * PARAMS <= per_step <= 2.0 * 4 * PARAMS, (per_step, 4 * PARAMS, first[i], last[i])
    scrape = subprocess.run([*net.prefix(1), sys.executable, "-c", "import urllib.request; print(urllib.request."
                             "urlopen('http://127.0.0.1:9100/metrics', timeout=10).read().decode())"],
                            capture_output=True, text=True, timeout=60)
    worker_sent = [line for line in scrape.stdout.splitlines() if line.startswith("dpeer_cross_site_bytes_total{")
                   and 'process="worker"' in line and 'direction="sent"' in line]
    assert worker_sent and float(worker_sent[0].split()[-1]) >= last[1][1]["worker"]["sent"], scrape.stdout[-2000:]
