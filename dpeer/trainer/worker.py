"""Worker process entry: ``python -m dpeer.trainer.worker --node-id ID --job demo|MODULE:FUNCTION
--views SPEC``. The daemon starts one per node; every flag may also come from DPEER_* env vars.

The job is imported and built before the first view is requested, so peers already training never
wait on this process's ``import torch``. Exit codes: 0 all steps done, 1 gave up (no usable view
within the idle limit), 2 bad usage (or a job that exact reduction cannot run), 75 the NCCL abort
watchdog fired (restart me).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Callable

import torch

from dpeer.trainer.exact import ExactModeError, configure_process
from dpeer.trainer.loop import JobContext, LoopConfig, Trainer, TrainSpec
from dpeer.trainer.stepping import Reduction
from dpeer.trainer.viewsource import make_view_source


def load_job(name: str) -> Callable[[JobContext], TrainSpec]:
    """``demo`` or ``MODULE:FUNCTION`` -> the job function."""
    if name == "demo":
        from dpeer.trainer.demo import build

        return build
    module, sep, func = name.partition(":")
    if not sep or not module or not func:
        raise ValueError(f"job must be 'demo' or MODULE:FUNCTION, got {name!r}")
    return getattr(importlib.import_module(module), func)


def _parse_opts(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"job option must be KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The worker's flags, with DPEER_* environment defaults."""
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m dpeer.trainer.worker", description=__doc__.splitlines()[0])
    p.add_argument("--node-id", default=env("DPEER_NODE_ID"))
    p.add_argument("--job", default=env("DPEER_JOB", "demo"))
    p.add_argument("--views", default=env("DPEER_VIEWS"), help="dir:PATH or py:MODULE:FACTORY[:ARG]")
    p.add_argument("--job-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--ledger", default=env("DPEER_LEDGER"))
    p.add_argument("--ckpt-dir", default=env("DPEER_CKPT_DIR"))
    p.add_argument("--ckpt-every", type=int, default=int(env("DPEER_CKPT_EVERY", "0")))
    p.add_argument("--digest-every", type=_positive, default=env("DPEER_DIGEST_EVERY", str(LoopConfig.digest_every)),
                   help="steps between parameter digests; the last step always has one")
    p.add_argument("--reduction", choices=[r.value for r in Reduction], default=Reduction.EXACT.value,
                   help="exact: the same bits in any world size (default); fast: float32 sums in the collective's order")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op CPU threads (0: torch's default, the core count); exact needs one count on every box")
    p.add_argument("--init-timeout", type=float, default=30.0)
    p.add_argument("--timeout-floor", type=float, default=2.0)
    p.add_argument("--timeout-mult", type=float, default=5.0)
    p.add_argument("--idle-limit", type=float, default=600.0)
    p.add_argument("--final-out", default=None, help="write the final model state_dict here (torch.save)")
    args = p.parse_args(argv)
    if not args.node_id or not args.views:
        p.error("--node-id and --views (or DPEER_NODE_ID and DPEER_VIEWS) are required")
    return args


def main(argv: list[str] | None = None) -> int:
    """Build the job, then train under the views of the given source."""
    imported_cpu = time.process_time()  # interpreter start and every import, torch's included
    try:
        args = parse_args(argv)
        options = _parse_opts(args.job_opt)
        job = load_job(args.job)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"dpeer worker: {exc}", file=sys.stderr)
        return 2
    reduction = Reduction(args.reduction)
    if reduction is Reduction.EXACT:
        configure_process(args.threads)
    elif args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    t_build = time.monotonic()
    spec = job(JobContext(args.node_id, device, options))
    source = make_view_source(args.views, args.node_id)
    report = getattr(source, "report_event", None)
    if report is not None:
        report("built", import_cpu_s=imported_cpu, build_cpu_s=time.process_time() - imported_cpu,
               build_s=time.monotonic() - t_build)
    cfg = LoopConfig(
        init_timeout=args.init_timeout, timeout_floor=args.timeout_floor, timeout_mult=args.timeout_mult,
        idle_limit=args.idle_limit, ledger_path=args.ledger, ckpt_dir=args.ckpt_dir, ckpt_every=args.ckpt_every,
        digest_every=args.digest_every, reduction=reduction,
    )
    try:
        trainer = Trainer(spec, source, args.node_id, cfg)
    except ExactModeError as exc:
        print(f"dpeer worker {args.node_id}: {exc}", file=sys.stderr)
        return 2
    try:
        trainer.run()
    except TimeoutError as exc:
        print(f"dpeer worker {args.node_id}: {exc}", file=sys.stderr)
        return 1
    if args.final_out:
        torch.save(spec.model.state_dict(), args.final_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
