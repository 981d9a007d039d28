"""A training script of the user's own as the job (issue 36), on real daemons: its DataLoader's
worker processes, its evaluation sharded over the group (step.evaluate, feeding a ReduceLROnPlateau)
and a SIGKILLed box change nothing in exact mode (the final digest of a 1-box run, every sample once
by the ledgers' audit), and fast mode trains it too."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dpeer.trainer.audit import audit, read_records
from dpeer.trainer.sampler import GlobalBatchSampler
from tests.support.daemons import Daemons, run

STEPS, GLOBAL, MICRO, SEED, SAMPLES = 40, 32, 4, 7, 512
TIMEOUT = 120.0

SCRIPT = '''import torch, dpeer.job as dj
run = dj.connect()
torch.manual_seed(run.seed)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
run.register(model=model, optimizer=opt, scheduler=sched)
held = torch.Generator().manual_seed(99)
hx, hy = torch.randn(60, 8, generator=held), torch.randint(0, 2, (60,), generator=held)


def held_out(items):
    """Per-item loss of one batch of the held-out set, evaluated sharded over the group."""
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(hx[items.start:items.stop]), hy[items.start:items.stop],
                                                 reduction="none")


class Noisy(torch.utils.data.Dataset):
    """Seeded augmentation in the loader's worker processes: the same draw on any box."""

    def __init__(self):
        g = torch.Generator().manual_seed(run.seed)
        self.x, self.y = torch.randn(%d, 8, generator=g), torch.randint(0, 2, (%d,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(8), self.y[i]


loader = torch.utils.data.DataLoader(Noisy(), batch_size=run.micro_batch, num_workers=2)
for step in run.steps(loader):
    with step:
        for x, y in step.micro_batches():
            step.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        if step.number %% 5 == 4:
            sched.step(float(step.evaluate(60, held_out, batch=8).mean()))
run.finish()
''' % (SAMPLES, SAMPLES)


def config(reduction: str = "exact") -> dict:
    return {"training": {"steps": STEPS, "global_batch": GLOBAL, "micro_batch": MICRO, "seed": SEED,
                         "checkpoint_every": 10, "reduction": reduction}}


def job(doc: dict | None) -> dict:
    return (doc or {}).get("job") or {}


def step_of(doc: dict | None) -> int:
    return ((doc or {}).get("train") or {}).get("step") or 0


async def finished(cluster: Daemons, kill_at: int | None = None) -> dict:
    """The job's finished doc; with kill_at, n2's worker is SIGKILLed once the boxes pass that step."""
    names = [n.node_id for n in cluster.nodes]
    if kill_at is not None:
        docs = await cluster.wait_for(lambda d: all(step_of(d.get(n)) >= kill_at for n in names), TIMEOUT,
                                      "training under way")
        pid = docs["n2"]["worker"]["pid"]
        os.kill(pid, signal.SIGKILL)
    done = await cluster.wait_for(lambda d: all(job(d.get(n)).get("state") == "finished" for n in names), TIMEOUT,
                                  "the job finished on every box")
    return job(done["n1"])


def ledgers(cluster: Daemons) -> dict:
    return {n.node_id: read_records(str(n.data_dir / "worker" / "ledger.jsonl")) for n in cluster.nodes}


def test_a_script_job_with_loader_workers_and_a_killed_box_ends_as_one_box_does(make_cluster, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    alone = make_cluster(1, job=str(script), config=config())
    alone.start_all()
    reference = run(finished(alone))
    alone.stop_all()
    three = make_cluster(3, job=str(script), config=config())
    three.start_all()
    final = run(finished(three, kill_at=12))
    assert final["step"] == reference["step"] == STEPS
    assert final["digest"] == reference["digest"], (final, reference)
    problems = audit(ledgers(three), STEPS, GlobalBatchSampler(SAMPLES, GLOBAL, SEED), MICRO)
    assert problems == [], problems[:10]
    log = three.node("n2").log_path.read_text()
    assert "worker exited with code -9" in log, "n2's worker was killed and restarted"


def test_fast_mode_trains_a_script_job(make_cluster, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cluster = make_cluster(2, job=str(script), config=config("fast"))
    cluster.start_all()
    final = run(finished(cluster))
    assert final["step"] == STEPS
    problems = audit(ledgers(cluster), STEPS, GlobalBatchSampler(SAMPLES, GLOBAL, SEED))
    assert problems == [], problems[:10]


def test_a_compiled_model_trains_the_same_bits_on_two_boxes_as_on_one(make_cluster, tmp_path: Path) -> None:
    """torch.compile'd model (inductor kernels, the same on every box of one kind): the 1-box bits."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("run.register(model=model", "model = torch.compile(model)\nrun.register(model=model"))
    shape = {"training": {**config()["training"], "steps": 12}}
    finals = []
    for boxes in (1, 2):
        cluster = make_cluster(boxes, job=str(script), config=shape)
        cluster.start_all()
        finals.append(run(finished(cluster)))
        cluster.stop_all()
    assert finals[0]["step"] == finals[1]["step"] == 12
    assert finals[0]["digest"] == finals[1]["digest"], finals
