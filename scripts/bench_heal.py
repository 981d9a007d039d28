"""Heal benchmark (issue 19): a newcomer holding nothing takes model + Adam state from 1, 2 or 3
donors over the runtime's own heal (dpeer.trainer.heal.heal in a Gloo group on loopback), side by
side in the same run with the path a torchrun user would take (torch.save to a file by one donor,
torch.load by the newcomer) and with a raw socket copy of the same bytes (the floor).

Each trial starts fresh processes (donors at step 1, the newcomer at step 0, same model shape),
times the heal on the newcomer from its first collective to the verified digest, and reports the
median over trials, the bytes moved, and the ratios heal/raw and heal/torch.save. Usage:

    python scripts/bench_heal.py [--params 10M,100M] [--donors 1,2,3] [--trials 3] [--json FILE]

Every process it starts is its own child, killed on exit; OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 2048


def _params(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(n_params: int, seed: int):  # noqa: ANN201 - torch is imported only in the children
    """A stack of WIDTHxWIDTH linear layers with about n_params parameters, and Adam with state."""
    import torch

    torch.manual_seed(seed)
    layers = max(1, round(n_params / (WIDTH * WIDTH + WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    return model, opt


class BenchState:
    """Model + Adam at a step, seen by the heal the way the runtime's loop shows its state."""

    def __init__(self, model, opt, step: int) -> None:  # noqa: ANN001 - torch is imported only in the children
        self.model, self.opt, self.step = model, opt, step

    def parts(self):  # noqa: ANN201
        from dpeer.trainer import state as st

        return st.capture_parts(self.model, self.opt, step=self.step)

    def targets(self, header: dict) -> list:
        from dpeer.trainer import state as st

        return st.receive_targets(header, self.model, self.opt)

    def digest_order(self, header: dict, targets: list) -> list | None:
        from dpeer.trainer import state as st

        return st.digest_order(header, targets, self.model)

    def load(self, parts) -> None:  # noqa: ANN001
        from dpeer.trainer import state as st

        self.step = st.restore_parts(parts, self.model, self.opt)[0]

    def digest(self) -> str:
        from dpeer.trainer import state as st

        return st.params_digest(self.model)


def child_heal(rank: int, world: int, port: int, n_params: int, out: str) -> None:
    """One rank of a heal: donors (rank >= 1) at step 1 with seed 1, the newcomer (rank 0) at step 0."""
    import datetime as dt

    import torch.distributed as dist

    from dpeer.trainer.heal import heal

    model, opt = build(n_params, 1 if rank else 2)
    state = BenchState(model, opt, 1 if rank else 0)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=dt.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=dt.timedelta(seconds=300))
    dist.barrier()
    t0 = time.monotonic()
    result = heal(rank, world, state.step, state)
    seconds = time.monotonic() - t0
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": seconds, "bytes": result.received_bytes, "step": state.step}))


def child_save(role: str, path: str, n_params: int, out: str) -> None:
    """torch.save of model + optimizer state by a donor, or torch.load into a fresh job by the newcomer."""
    import torch

    model, opt = build(n_params, 1 if role == "save" else 2)
    t0 = time.monotonic()
    if role == "save":
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        os.sync()
    else:
        blob = torch.load(path, weights_only=True)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
    Path(out).write_text(json.dumps({"seconds": time.monotonic() - t0, "bytes": os.path.getsize(path)}))


def child_raw(role: str, port: int, n_bytes: int, out: str) -> None:
    """A raw loopback TCP copy of n_bytes from a preallocated buffer into a preallocated buffer."""
    if role == "send":
        data = memoryview(bytearray(n_bytes))
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(data)
        return
    buf = memoryview(bytearray(n_bytes))
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(1)
        Path(out + ".ready").write_text("")
        conn, _ = srv.accept()
        t0 = time.monotonic()
        got = 0
        while got < n_bytes:
            n = conn.recv_into(buf[got:], n_bytes - got)
            if n == 0:
                raise RuntimeError("sender closed early")
            got += n
        conn.close()
    Path(out).write_text(json.dumps({"seconds": time.monotonic() - t0, "bytes": n_bytes}))


def spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "PYTHONWARNINGS": "ignore:Failed to initialize NumPy"}
    return subprocess.Popen([sys.executable, __file__, "--child", *args], env=env)


def wait_all(procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"a child exited with {code}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def trial_heal(n_params: int, donors: int, tmp: Path) -> dict:
    out, port = str(tmp / "heal.json"), free_port()
    world = donors + 1
    wait_all([spawn("heal", str(r), str(world), str(port), str(n_params), out) for r in range(world)], 900)
    result = json.loads(Path(out).read_text())
    if result["step"] != 1:  # the heal itself raises unless the newcomer's digest equals the donors'
        raise RuntimeError(f"the newcomer ended at step {result['step']}, not the donors' 1")
    return result


def trial_save(n_params: int, tmp: Path) -> dict:
    path, out = str(tmp / "state.pt"), str(tmp / "save.json")
    wait_all([spawn("save", "save", path, str(n_params), out)], 900)
    saved = json.loads(Path(out).read_text())
    wait_all([spawn("save", "load", path, str(n_params), out)], 900)
    loaded = json.loads(Path(out).read_text())
    os.remove(path)
    return {"seconds": saved["seconds"] + loaded["seconds"], "save_s": saved["seconds"],
            "load_s": loaded["seconds"], "bytes": loaded["bytes"]}


def trial_raw(n_bytes: int, tmp: Path) -> dict:
    out, port = str(tmp / "raw.json"), free_port()
    receiver = spawn("raw", "recv", str(port), str(n_bytes), out)
    deadline = time.monotonic() + 120
    while not Path(out + ".ready").exists():
        if time.monotonic() > deadline or receiver.poll() is not None:
            raise RuntimeError("the raw receiver did not start")
        time.sleep(0.01)
    wait_all([spawn("raw", "send", str(port), str(n_bytes), out), receiver], 600)
    os.remove(out + ".ready")
    return json.loads(Path(out).read_text())


def main_child(args: list[str]) -> None:
    kind, *rest = args
    if kind == "heal":
        child_heal(int(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]), rest[4])
    elif kind == "save":
        child_save(rest[0], rest[1], int(rest[2]), rest[3])
    else:
        child_raw(rest[0], int(rest[1]), int(rest[2]), rest[3])


def median(rows: list[dict], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        main_child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", default="10M,100M", help="model sizes, comma-separated (10M, 100M, ...)")
    p.add_argument("--donors", default="1,2,3", help="donor counts, comma-separated")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write every trial here")
    a = p.parse_args()
    sizes, donor_counts = [_params(s) for s in a.params.split(",")], [int(d) for d in a.donors.split(",")]
    if a.trials < 1 or any(d < 1 for d in donor_counts) or any(s < WIDTH * WIDTH for s in sizes):
        p.error(f"--trials and --donors must be positive and sizes at least {WIDTH * WIDTH}")
    results: dict = {"load": os.getloadavg(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench-heal-") as tmp_name:
        tmp = Path(tmp_name)
        for size in sizes:
            heals = {d: [] for d in donor_counts}
            saves, raws = [], []
            for _ in range(a.trials):  # interleaved, so drift hits every method alike
                for d in donor_counts:
                    heals[d].append(trial_heal(size, d, tmp))
                saves.append(trial_save(size, tmp))
                raws.append(trial_raw(heals[donor_counts[0]][-1]["bytes"], tmp))
            raw = median(raws)
            for d in donor_counts:
                h = median(heals[d])
                row = {"params": size, "method": f"dpeer heal, {d} donor(s)", "median_s": h,
                       "bytes": heals[d][0]["bytes"], "vs_raw": h / raw, "vs_torch_save": h / median(saves),
                       "trials": heals[d]}
                results["rows"].append(row)
            results["rows"].append({"params": size, "method": "torch.save + torch.load (file)", "median_s": median(saves),
                                    "bytes": saves[0]["bytes"], "trials": saves})
            results["rows"].append({"params": size, "method": "raw socket copy (floor)", "median_s": raw,
                                    "bytes": raws[0]["bytes"], "trials": raws})
    results["load"] = [results["load"], os.getloadavg()]
    print(f"{'params':>8}  {'method':<34} {'median s':>9} {'GB':>6} {'vs raw':>7} {'vs save':>8}")
    for r in results["rows"]:
        extra = f"{r['vs_raw']:7.2f} {r['vs_torch_save']:8.2f}" if "vs_raw" in r else ""
        print(f"{r['params'] / 1e6:7.0f}M  {r['method']:<34} {r['median_s']:9.3f} {r['bytes'] / 1e9:6.2f} {extra}")
    print(f"load average before/after: {results['load'][0][0]:.1f} / {results['load'][1][0]:.1f}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
