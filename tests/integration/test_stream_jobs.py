"""Iterable datasets and parallel streams (issue 36) on real daemons: a plain streaming dataset (no
seek, sharding itself by loader worker) and a truncated-BPTT GRU whose hidden state is carried
from step to step, each on 3 boxes with one SIGKILLed worker, end with the digest of a 1-box run and
every item once per epoch by the ledgers' audit."""

from __future__ import annotations

from pathlib import Path

from dpeer.trainer.audit import audit
from dpeer.trainer.sampler import InOrderSampler, StreamsSampler
from tests.integration.test_script_job import finished, ledgers
from tests.support.daemons import run

SEED = 7

STREAM_STEPS, STREAM_GLOBAL, STREAM_MICRO, ITEMS = 40, 32, 4, 200
STREAM = '''import torch, dpeer.job as dj
from torch.utils.data import IterableDataset, get_worker_info
run = dj.connect()
torch.manual_seed(run.seed)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
run.register(model=model, optimizer=opt)


class Lines(IterableDataset):
    """A stream read in order (a file's records, say): no seek, and it shards itself by loader worker
    as torch's docs teach; each epoch is shuffled from set_epoch."""

    def __init__(self):
        g = torch.Generator().manual_seed(run.seed)
        self.x, self.y = torch.randn(%(items)d, 8, generator=g), torch.randint(0, 2, (%(items)d,), generator=g)
        self.epoch = 0

    def __len__(self):
        return len(self.x)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(1000 + self.epoch))
        info = get_worker_info()
        for n, i in enumerate(order.tolist()):
            if info is None or n %% info.num_workers == info.id:
                yield self.x[i] + 0.1 * torch.randn(8), self.y[i]


loader = torch.utils.data.DataLoader(Lines(), batch_size=run.micro_batch, num_workers=2)
for step in run.steps(loader):
    with step:
        for x, y in step.micro_batches():
            step.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
run.finish()
''' % {"items": ITEMS}

BPTT_STEPS, STREAMS, BPTT_MICRO, WINDOWS, T = 40, 8, 2, 80, 6
BPTT = '''import torch, dpeer.job as dj
run = dj.connect()
torch.manual_seed(run.seed)
V, H, T = 12, 16, %(T)d


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(V, 8), torch.nn.Linear(H, V)
        self.gru = torch.nn.GRU(8, H, batch_first=True)

    def forward(self, x, h):
        y, h = self.gru(self.emb(x), h.unsqueeze(0))
        return self.out(y), h[0]


class Windows(torch.utils.data.Dataset):
    """A token corpus cut into windows of T (inputs, next tokens), in order."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(run.seed)
        self.tokens = torch.randint(0, V, (n * T + 1,), generator=g)

    def __len__(self):
        return (len(self.tokens) - 1) // T

    def __getitem__(self, i):
        return self.tokens[i * T:(i + 1) * T], self.tokens[i * T + 1:(i + 1) * T + 1]


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=run.lr)
hidden = dj.Carried(torch.zeros(run.global_batch, H))
run.register(model=model, optimizer=opt, hidden=hidden)
loader = torch.utils.data.DataLoader(Windows(%(windows)d), batch_size=run.micro_batch, num_workers=1)
for step in run.steps(loader, order="streams"):
    with step:
        for x, y in step.micro_batches():
            logits, h = model(x, hidden.read())
            hidden.write(h)
            step.backward(torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)))
        opt.step()
run.finish()
''' % {"T": T, "windows": WINDOWS}


def config(steps: int, batch: int, micro: int, lr: float = 0.05) -> dict:
    return {"training": {"steps": steps, "global_batch": batch, "micro_batch": micro, "seed": SEED, "lr": lr,
                         "checkpoint_every": 10, "reduction": "exact"}}


def one_and_three(make_cluster, script: Path, cfg: dict) -> tuple[dict, dict, object]:
    alone = make_cluster(1, job=str(script), config=cfg)
    alone.start_all()
    reference = run(finished(alone))
    alone.stop_all()
    three = make_cluster(3, job=str(script), config=cfg)
    three.start_all()
    final = run(finished(three, kill_at=12))
    return reference, final, three


def test_a_streaming_dataset_killed_mid_epoch_ends_as_one_box_does(make_cluster, tmp_path: Path) -> None:
    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    reference, final, three = one_and_three(make_cluster, script, config(STREAM_STEPS, STREAM_GLOBAL, STREAM_MICRO))
    assert final["step"] == reference["step"] == STREAM_STEPS
    assert final["digest"] == reference["digest"], (final, reference)
    problems = audit(ledgers(three), STREAM_STEPS, InOrderSampler(ITEMS, STREAM_GLOBAL, SEED), STREAM_MICRO)
    assert problems == [], problems[:10]
    assert "worker exited with code -9" in three.node("n2").log_path.read_text()


def test_a_carried_gru_state_on_three_boxes_with_a_kill_ends_as_one_box_does(make_cluster, tmp_path: Path) -> None:
    script = tmp_path / "bptt.py"
    script.write_text(BPTT)
    reference, final, three = one_and_three(make_cluster, script, config(BPTT_STEPS, STREAMS, BPTT_MICRO, 0.01))
    assert final["step"] == reference["step"] == BPTT_STEPS
    assert final["digest"] == reference["digest"], (final, reference)
    problems = audit(ledgers(three), BPTT_STEPS, StreamsSampler(WINDOWS, STREAMS, SEED), BPTT_MICRO)
    assert problems == [], problems[:10]
    assert "worker exited with code -9" in three.node("n2").log_path.read_text()
