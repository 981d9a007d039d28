"""A GPT-2 built from its config by Hugging Face transformers (no weights downloaded), trained as
a dpeer script job on the text of ``examples/lm/corpus.txt``.

    pip install 'dpeer[examples]'        # transformers is not a dpeer dependency
    dpeer demo --job examples/hf/train.py --nodes 3 --steps 100 --chaos

The model takes dict batches (``input_ids``, ``labels``) and returns an output whose ``.loss``
is the mean next-token loss, as Hugging Face models do; the schedule is transformers' own
``get_linear_schedule_with_warmup`` (a LambdaLR). GPT-2's dropout draws from torch's generator,
which dpeer seeds per micro-batch, so the run is exact with dropout on. GPT-2 keeps no buffers
that its forward changes, so exact reduction (the default) runs it.

Options (``training.options``): block (32), width (64), layers (2), heads (2), peak_lr (1e-3),
warmup (10), eval_every (20), eval_windows (64).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

import dpeer.job as dj

CORPUS = Path(__file__).resolve().parent.parent / "lm" / "corpus.txt"


class TextWindows(torch.utils.data.Dataset):
    """Windows of ``block`` character ids as Hugging Face batches: the model shifts the labels."""

    def __init__(self, ids: torch.Tensor, block: int, stride: int = 1) -> None:
        self.ids, self.block, self.stride = ids, block, stride

    def __len__(self) -> int:
        return (len(self.ids) - self.block) // self.stride + 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.ids[i * self.stride:i * self.stride + self.block]
        return {"input_ids": window, "labels": window}


def gpt2(vocab: int, block: int, run: dj.Run) -> GPT2LMHeadModel:
    """A small GPT-2 from a config: random weights from torch's generator, nothing fetched."""
    config = GPT2Config(vocab_size=vocab, n_positions=block, n_embd=run.option("width", 64),
                        n_layer=run.option("layers", 2), n_head=run.option("heads", 2),
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


@torch.no_grad()
def evaluate(model: GPT2LMHeadModel, held_out: TextWindows, windows: int, device: str) -> float:
    """Mean loss over the first ``windows`` held-out windows (dropout off): the same on every rank."""
    model.eval()
    batch = torch.utils.data.default_collate([held_out[i] for i in range(min(windows, len(held_out)))])
    loss = model(**{k: v.to(device) for k, v in batch.items()}).loss.item()
    model.train()
    return loss


def main() -> None:
    """Build the data, the model, its optimizer and schedule, then train every step of the run."""
    run = dj.connect()
    text = CORPUS.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)
    block, cut = run.option("block", 32), int(len(ids) * 0.9)
    train, held_out = TextWindows(ids[:cut], block), TextWindows(ids[cut:], block, stride=block)

    torch.manual_seed(run.seed)
    model = gpt2(len(vocab), block, run).to(run.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=run.option("peak_lr", 1e-3))
    sched = get_linear_schedule_with_warmup(opt, run.option("warmup", 10), run.total_steps)
    run.register(model=model, optimizer=opt, scheduler=sched)

    loader = torch.utils.data.DataLoader(train, batch_size=run.micro_batch, num_workers=2, persistent_workers=True)
    every, windows = run.option("eval_every", 20), run.option("eval_windows", 64)
    for step in run.steps(loader, loss="mean"):
        with step:
            for batch in step.micro_batches():
                step.backward(model(**{k: v.to(run.device) for k, v in batch.items()}).loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if (step.number + 1) % every == 0 or step.number + 1 == run.total_steps:
                val = evaluate(model, held_out, windows, run.device)
                if run.is_writer:
                    print(f"hf step {step.number + 1}/{run.total_steps}: held-out loss {val:.4f}, "
                          f"world {step.world}", flush=True)
    run.finish()


if __name__ == "__main__":
    main()
