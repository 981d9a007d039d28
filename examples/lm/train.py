"""A character-level language model over the bundled corpus, trained as a dpeer script job.

    dpeer demo --job examples/lm/train.py --nodes 3 --steps 300 --chaos

A two-layer causal transformer reads windows of the text in ``corpus.txt`` (this folder) and
learns to predict the next character. The first 90% of the text trains, the rest is held out.
What it shows: a DataLoader with worker processes, gradient clipping, a warm-up + cosine
learning-rate schedule (LambdaLR), and evaluation on the held-out split every ``eval_every``
steps, on every rank, printed by the writer only.

Options (``training.options`` in the config): block (64), width (64), layers (2), heads (4),
peak_lr (3e-3: AdamW's peak rate; ``training.lr`` is tuned for the SGD jobs), warmup (20),
eval_every (25), eval_windows (128).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

import dpeer.job as dj

CORPUS = Path(__file__).with_name("corpus.txt")


class Windows(torch.utils.data.Dataset):
    """Every window of ``block + 1`` characters in ``ids[start:stop]``: input and next-character target."""

    def __init__(self, ids: torch.Tensor, block: int, stride: int = 1) -> None:
        self.ids, self.block, self.stride = ids, block, stride

    def __len__(self) -> int:
        return (len(self.ids) - self.block - 1) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        at = i * self.stride
        chunk = self.ids[at:at + self.block + 1]
        return chunk[:-1], chunk[1:]


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class CharLM(torch.nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear read-out."""

    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(block, width)
        self.blocks = torch.nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        where = torch.arange(x.shape[1], device=x.device)
        return self.head(self.norm(self.blocks(self.tokens(x) + self.positions(where))))


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next character over every position."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def warmup_cosine(warmup: int, total: int):
    """LambdaLR's factor: linear from 0 to 1 over ``warmup`` steps, then a cosine down to 10%."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))
    return factor


@torch.no_grad()
def evaluate(model: torch.nn.Module, held_out: Windows, windows: int, device: str) -> float:
    """Mean loss over the first ``windows`` held-out windows: every rank gets the same number."""
    model.eval()
    x, y = (torch.stack(z) for z in zip(*(held_out[i] for i in range(min(windows, len(held_out))))))
    loss = loss_of(model, x.to(device), y.to(device)).item()
    model.train()
    return loss


def main() -> None:
    """Build the data, the model and its optimizer, then train every step of the run."""
    run = dj.connect()
    text = CORPUS.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)
    block, cut = run.option("block", 64), int(len(ids) * 0.9)
    train, held_out = Windows(ids[:cut], block), Windows(ids[cut:], block, stride=block // 2)

    torch.manual_seed(run.seed)  # the same initial weights on every box
    model = CharLM(len(vocab), block, run.option("width", 64), run.option("layers", 2), run.option("heads", 4))
    model = model.to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=run.option("peak_lr", 3e-3), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(run.option("warmup", 20), run.total_steps))
    run.register(model=model, optimizer=opt, scheduler=sched)

    loader = torch.utils.data.DataLoader(train, batch_size=run.micro_batch, num_workers=2, persistent_workers=True)
    every, windows = run.option("eval_every", 25), run.option("eval_windows", 128)
    for step in run.steps(loader, loss="mean"):
        with step:
            for x, y in step.micro_batches():
                step.backward(loss_of(model, x.to(run.device), y.to(run.device)))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if (step.number + 1) % every == 0 or step.number + 1 == run.total_steps:
                val = evaluate(model, held_out, windows, run.device)
                if run.is_writer:
                    print(f"lm step {step.number + 1}/{run.total_steps}: held-out loss {val:.4f}, "
                          f"lr {sched.get_last_lr()[0]:.2e}, world {step.world}", flush=True)
    run.finish()


if __name__ == "__main__":
    main()
