"""GPU check of the NCCL path, world size 1 on one GPU: ``python -m dpeer.trainer.gpu_check``.

Trains the demo job through the full loop (form, heal, steps), then aborts the NCCL group under
the watchdog, re-forms a new generation in place and trains again, checking that parameters stay
finite and move. Exits 0 with a SKIP line when no CUDA device is present, 1 on a failed check.
"""

from __future__ import annotations

import math
import socket
import sys
import tempfile
import time

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_check() -> list[str]:
    """Run the check; returns a list of problems (empty when it passed)."""
    from dpeer.trainer import demo
    from dpeer.trainer.allreduce import allreduce_step
    from dpeer.trainer.group import GroupManager
    from dpeer.trainer.loop import JobContext, LoopConfig, Trainer
    from dpeer.trainer.sampler import GlobalBatchSampler
    from dpeer.trainer.state import params_digest
    from dpeer.address import Address
    from dpeer.trainer.viewsource import Assignment, DirViewSource, View, publish_view

    problems: list[str] = []
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        spec = demo.build(JobContext("gpu0", device, {"steps": 20, "global_batch": 32, "micro_batch": 8}))
        source = DirViewSource(tmp, "gpu0")
        publish_view(tmp, Assignment(View(1, ("gpu0",), Address("127.0.0.1", port))))
        t0 = time.monotonic()
        trainer = Trainer(spec, source, "gpu0", LoopConfig(init_timeout=60.0, idle_limit=60.0))
        step = trainer.run()
        print(f"loop: {step} steps on {torch.cuda.get_device_name(device)} in {time.monotonic() - t0:.2f}s")
        if step != 20:
            problems.append(f"loop stopped at step {step}, expected 20")

        gm = GroupManager("gpu0", backend="nccl", init_timeout=60.0)
        sampler = GlobalBatchSampler(len(spec.dataset), 32, spec.seed)
        params = [p for p in spec.model.parameters()]
        before = params_digest(spec.model)
        for gen in (2, 3):
            t1 = time.monotonic()
            m = gm.form(View(gen, ("gpu0",), Address("127.0.0.1", port + 1)))
            for s in range(5):
                idx = sampler.indices_for_step(100 * gen + s)
                x, y = demo.collate([spec.dataset[i] for i in idx])
                spec.optimizer.zero_grad()
                loss = spec.loss_fn(spec.model(x.to(device)), y.to(device))
                loss.backward()
                red = allreduce_step(params, float(loss), gen, m.rank, m.world, len(idx), gm.device)
                spec.optimizer.step()
                if not math.isfinite(red.loss_mean):
                    problems.append(f"generation {gen}: non-finite loss {red.loss_mean}")
            t2 = time.monotonic()
            gm.destroy()
            print(f"generation {gen}: formed+5 steps {t2 - t1:.2f}s, abort {time.monotonic() - t2:.2f}s")
        gm.close()
        if params_digest(spec.model) == before:
            problems.append("parameters did not change across re-formed generations")
    return problems


def main() -> int:
    """Entry point: skip cleanly without a GPU."""
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible; the NCCL path was not checked")
        return 0
    problems = run_check()
    for p in problems:
        print(f"FAIL: {p}")
    if not problems:
        print("OK: NCCL form, train, abort, re-form on one GPU")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
