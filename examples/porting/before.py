"""A classifier on seeded synthetic data: the example of docs/jobs.md, "Port your own script"."""

import torch

STEPS, BATCH, SEED, LR = 100, 64, 1234, 0.05


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
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    data = Blobs(4096, SEED)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2)
    step = 0
    while step < STEPS:
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % 20 == 0:
                print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step == STEPS:
                break
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
