"""A classifier on seeded synthetic data: the example of docs/jobs.md, "Port your own script"."""

import torch

import dpeer.job as dj


class Blobs(torch.utils.data.Dataset):
    """Seeded points labelled by a fixed rule, with a little noise added on each fetch."""

    def __init__(self, samples: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, 16, generator=g)
        self.y = (self.x @ torch.randn(16, generator=g) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.05 * torch.randn(16), self.y[i]


def main() -> None:
    run = dj.connect()
    torch.manual_seed(run.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, run.total_steps)
    run.register(model=model, optimizer=opt, scheduler=sched)
    data = Blobs(4096, run.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=run.micro_batch, num_workers=2)
    for step in run.steps(loader, loss="mean"):
        with step:
            for x, y in step.micro_batches():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                step.backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if run.is_writer and step.number % 20 == 0:
                print(f"step {step.number}: loss {loss.item():.4f}")
    run.finish()


if __name__ == "__main__":
    main()
