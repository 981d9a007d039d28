"""The options of a chaos run and the `dpeer chaos` flags.

Imported when the `dpeer` parser is built (every command), so it stays light: argparse,
dataclasses and pathlib only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

KINDS = ("kill", "restart", "wipe", "stop", "partition", "loss", "slow", "stranger")
REDUCTIONS = ("exact", "fast")
DISRUPTIVE = {"kill", "restart", "wipe", "stop", "partition"}


@dataclass
class ChaosOptions:
    """What a run does; see `dpeer chaos --help`."""

    nodes: int = 3
    duration: float = 120.0
    seed: int = 1
    fault_every: float = 12.0
    kinds: tuple[str, ...] = KINDS
    steps: int = 3000
    global_batch: int = 16
    micro_batch: int = 8
    lr: float = 0.05
    reduction: str = "exact"
    out: Path = Path("chaos-out")
    dir: Path | None = None
    base_port: int | None = None
    poll: float = 0.25
    kv_every: float = 2.0
    kv_clients: int = 3
    kv_op_every: float = 0.5
    warmup_timeout: float = 180.0
    finish_timeout: float = 900.0
    reference: bool = True
    reference_cache: Path | None = None
    max_recovery: float = 60.0
    keep_dirs: bool = True
    netns: bool = False


def validate(opts: ChaosOptions) -> None:
    """Raise ValueError for unknown fault kinds or a node count the faults cannot survive."""
    bad = set(opts.kinds) - set(KINDS)
    if bad or not opts.kinds:
        raise ValueError(f"unknown fault kinds {sorted(bad)}; choose from {','.join(KINDS)}")
    if opts.nodes < 1 or opts.nodes > 9:
        raise ValueError("--nodes must be between 1 and 9")
    if opts.nodes < 3 and set(opts.kinds) & DISRUPTIVE:
        raise ValueError("disruptive faults need at least 3 nodes (a majority must survive)")
    if not 0 <= opts.kv_clients <= 16 or opts.kv_op_every <= 0:
        raise ValueError("--kv-clients must be between 0 and 16 and --kv-op-every above 0")
    if opts.reduction not in REDUCTIONS:
        raise ValueError(f"--reduction must be one of {', '.join(REDUCTIONS)}, got {opts.reduction!r}")
    if opts.reduction == "exact" and opts.global_batch % opts.micro_batch:
        raise ValueError(f"--reduction exact needs --global-batch ({opts.global_batch}) to be a multiple of "
                         f"--micro-batch ({opts.micro_batch})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `dpeer chaos` (and scripts/chaos.py)."""
    d = ChaosOptions()
    p.add_argument("--nodes", type=int, default=d.nodes, help=f"daemons to start (default {d.nodes})")
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of fault injection")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the fault schedule")
    p.add_argument("--fault-every", type=float, default=d.fault_every, help="mean seconds between faults")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated fault kinds ({','.join(KINDS)})")
    p.add_argument("--steps", type=int, default=d.steps,
                   help="training steps (size it so training outlasts the chaos window)")
    p.add_argument("--global-batch", type=int, default=d.global_batch)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument("--lr", type=float, default=d.lr, help="demo learning rate")
    p.add_argument("--reduction", choices=REDUCTIONS, default=d.reduction,
                   help="exact (default): the final model must equal the fault-free run's bit for bit; fast: "
                        "within a max relative difference of 1e-4")
    p.add_argument("--out", type=Path, default=d.out, help="where timeline.json and summary.md go")
    p.add_argument("--dir", type=Path, default=None, help="data dirs and logs (default: a new temp dir)")
    p.add_argument("--base-port", type=int, default=None, help="first gRPC port (default: a free block)")
    p.add_argument("--kv-every", type=float, default=d.kv_every, help="seconds between background kv puts")
    p.add_argument("--kv-clients", type=int, default=d.kv_clients,
                   help=f"concurrent clients putting, reading and deleting a few keys during the chaos window, "
                        f"whose history must be linearizable (default {d.kv_clients}; 0: none, the check is not run)")
    p.add_argument("--kv-op-every", type=float, default=d.kv_op_every,
                   help=f"mean seconds between one kv client's operations (default {d.kv_op_every})")
    p.add_argument("--warmup-timeout", type=float, default=d.warmup_timeout,
                   help="seconds allowed for every node to train in one group before the faults start")
    p.add_argument("--finish-timeout", type=float, default=d.finish_timeout,
                   help="seconds allowed for training to finish after the chaos window")
    p.add_argument("--max-recovery", type=float, default=d.max_recovery,
                   help="seconds within which the survivors must commit a step after any fault")
    p.add_argument("--no-reference", action="store_true", help="skip the fault-free reference comparison")
    p.add_argument("--reference-cache", type=Path, default=None,
                   help="reuse/keep the reference model here, keyed by the training config")
    p.add_argument("--netns", action="store_true",
                   help="each daemon in a network namespace of its own (needs root): a partition sets the "
                        "node's link down, cutting Gloo, the store and the heal too, not just the daemons' messages")


def options_from(args: argparse.Namespace) -> ChaosOptions:
    """ChaosOptions from parsed flags."""
    return ChaosOptions(
        nodes=args.nodes, duration=args.duration, seed=args.seed, fault_every=args.fault_every,
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()), steps=args.steps,
        global_batch=args.global_batch, micro_batch=args.micro_batch, lr=args.lr, out=args.out, dir=args.dir,
        base_port=args.base_port, kv_every=args.kv_every,
        kv_clients=args.kv_clients, kv_op_every=args.kv_op_every, finish_timeout=args.finish_timeout,
        warmup_timeout=args.warmup_timeout, max_recovery=args.max_recovery,
        reference=not args.no_reference, reference_cache=args.reference_cache, reduction=args.reduction,
        netns=args.netns,
    )
