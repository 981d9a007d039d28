"""Worker process entry: ``python -m dpeer.trainer.worker --node-id ID --job demo|MODULE:FUNCTION|PATH.py
--views SPEC``. The daemon starts one per node; every flag may also come from DPEER_* env vars.

The job is imported and built before the first view is requested, so peers already training never
wait on this process's ``import torch``. A script job (PATH.py) runs as ``__main__`` and builds
itself; it is built when it first asks for its steps (script.py). Exit codes: 0 all steps done, 1 gave up (no usable view
within the idle limit, or the daemon that started it is gone), 2 bad usage, 3 the job could not
be built, or exact reduction cannot run it (reported to the daemon first), 75 the NCCL abort
watchdog fired (restart me).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import resource
import runpy
import signal
import socket
import sys
import time
import traceback
import warnings
from typing import Callable

# dpeer does not depend on numpy; torch warns at import when it is absent, which says nothing useful
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

from dpeer.address import Address  # noqa: E402
from dpeer.channel.local import SPARE_GO  # noqa: E402
from dpeer.trainer.exact import ExactModeError, configure_process  # noqa: E402
from dpeer.trainer.group import bind_store_socket  # noqa: E402
from dpeer.trainer.jobspec import JobSpecError, prepare  # noqa: E402
from dpeer.trainer.loop import JobContext, LoopConfig, StateTorn, Trainer, TrainSpec, default_collate  # noqa: E402
from dpeer.trainer.portable import load_initial  # noqa: E402
from dpeer.trainer.script import JobUsageError, Launch, offer, taken  # noqa: E402
from dpeer.trainer.stepping import Reduction  # noqa: E402
from dpeer.trainer.viewsource import ViewSource, make_view_source  # noqa: E402

EXIT_GAVE_UP, EXIT_USAGE, EXIT_BUILD_FAILED = 1, 2, 3
_PR_SET_PDEATHSIG = 1


def load_job(name: str) -> Callable[[JobContext], TrainSpec]:
    """``demo`` or ``MODULE:FUNCTION`` -> the job function."""
    if name == "demo":
        from dpeer.trainer.demo import build

        return build
    module, sep, func = name.partition(":")
    if not sep or not module or not func:
        raise ValueError(f"job must be 'demo' or MODULE:FUNCTION, got {name!r}")
    return getattr(importlib.import_module(module), func)


def _job_spec(text: str) -> str:
    """``demo``, ``MODULE:FUNCTION`` or ``PATH.py`` (checked as usage; whether it imports is the
    build's business)."""
    module, sep, func = text.partition(":")
    if text != "demo" and not text.endswith(".py") and (not sep or not module or not func):
        raise argparse.ArgumentTypeError(f"job must be 'demo', MODULE:FUNCTION or PATH.py, got {text!r}")
    return text


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
    p.add_argument("--job", type=_job_spec, default=env("DPEER_JOB", "demo"))
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
    p.add_argument("--init-from", default=env("DPEER_INIT_FROM"),
                   help="start the run's model (and optimizer) from this file: torch.save, safetensors or a dpeer checkpoint")
    p.add_argument("--store-bind", default=None, metavar="HOST:PORT",
                   help="bind the rendezvous store's socket now (port 0: any free port) and report the port")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the daemon) is gone")
    p.add_argument("--spare", action="store_true",
                   help="a warm spare: import what training needs, then wait for the daemon's go on stdin")
    args = p.parse_args(argv)
    if not args.node_id or not args.views:
        p.error("--node-id and --views (or DPEER_NODE_ID and DPEER_VIEWS) are required")
    return args


def die_with_parent(parent: int) -> None:
    """Have the kernel send SIGTERM when the daemon that started this worker dies (Linux), and exit
    now if it is already gone: a worker never outlives its daemon."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(EXIT_GAVE_UP)


def await_takeover() -> bool:
    """Spare mode: pay for the imports the first step needs now, then wait for the daemon's go on
    stdin. False on end of file (the daemon discarded this spare): exit without a word."""
    try:
        importlib.import_module("torch._dynamo")  # the optimizer's first step imports it (about 1.5 CPU-s)
    except ImportError:
        pass
    return sys.stdin.buffer.readline() == SPARE_GO


def _store_socket(spec: str | None) -> socket.socket | None:
    if spec is None:
        return None
    host, port = Address.parse(spec, any_port=True)
    return bind_store_socket(host, port)


def _setup(args: argparse.Namespace) -> tuple[JobContext, LoopConfig]:
    """The kernels' determinism, the job's context and the loop's config, from the flags."""
    reduction = Reduction(args.reduction)
    if reduction is Reduction.EXACT:
        configure_process(args.threads)
    elif args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    cfg = LoopConfig(
        init_timeout=args.init_timeout, timeout_floor=args.timeout_floor, timeout_mult=args.timeout_mult,
        idle_limit=args.idle_limit, ledger_path=args.ledger, ckpt_dir=args.ckpt_dir, ckpt_every=args.ckpt_every,
        digest_every=args.digest_every, reduction=reduction,
    )
    return JobContext(args.node_id, device, _parse_opts(args.job_opt)), cfg


def _reporter(source: ViewSource, store: socket.socket | None, imported_cpu: float) -> Callable[[float], None]:
    """Tell the daemon the job is built (the import and build costs, the store's port)."""
    def built(build_s: float) -> None:
        report = getattr(source, "report_event", None)
        if report is not None:
            report("built", import_cpu_s=imported_cpu, build_cpu_s=time.process_time() - imported_cpu,
                   build_s=build_s, store_port=store.getsockname()[1] if store else 0)
    return built


def _build(args: argparse.Namespace, source: ViewSource, imported_cpu: float) -> tuple[Trainer, TrainSpec]:
    """Bind the store, import and build the job, and check that the chosen reduction can run it
    (exact refuses a model it cannot make exact); report the store's port with the build."""
    store = _store_socket(args.store_bind)
    job = load_job(args.job)
    ctx, cfg = _setup(args)
    t_build = time.monotonic()
    spec = job(ctx)
    spec = prepare(spec, ctx, spec.collate or default_collate)
    if args.init_from:
        print(f"dpeer worker: starting from {load_initial(args.init_from, spec.model, spec.optimizer)}", flush=True)
    trainer = Trainer(spec, source, args.node_id, cfg, store_socket=store)
    _reporter(source, store, imported_cpu)(time.monotonic() - t_build)
    return trainer, spec


def _build_failed(args: argparse.Namespace, source: ViewSource, exc: BaseException) -> int:
    """Report a job that could not be built (its error in one line, its traceback to the log)."""
    error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    if not isinstance(exc, (ExactModeError, JobSpecError, JobUsageError)):  # sentences about the job, not bugs
        traceback.print_exception(exc)
    report = getattr(source, "report_job_error", None)
    if report is not None:
        report(error)
    print(f"dpeer worker {args.node_id}: the job could not be built: {error}", file=sys.stderr)
    return EXIT_BUILD_FAILED


def run_script(args: argparse.Namespace, source: ViewSource, imported_cpu: float) -> int:
    """Run a script job as ``__main__`` with this worker's Launch for its ``dpeer.job.connect()``.
    An error before its steps start is a build failure; after, its steps report their own."""
    try:
        ctx, cfg = _setup(args)
        store = _store_socket(args.store_bind)
    except Exception as exc:  # noqa: BLE001 - the daemon must hear it
        return _build_failed(args, source, exc)
    offer(Launch(ctx, cfg, source, store, _reporter(source, store, imported_cpu), args.init_from))
    sys.argv = [args.job]
    try:
        try:
            runpy.run_path(args.job, run_name="__main__")
        except SystemExit as exc:  # sys.exit(0) or exit(): the script's end, checked as one; another code, a failure
            if exc.code not in (None, 0):
                raise RuntimeError(f"the script called sys.exit({exc.code!r})") from exc
        launch = taken()
        if launch is None or launch.run is None:
            raise JobUsageError(f"{args.job} ended without calling dpeer.job.connect(): a script job connects, "
                                f"registers its model and optimizer, and loops over run.steps(loader)")
        launch.run.finish()
    except StateTorn as exc:  # reported as the step's failure already; a fresh worker resumes the committed state
        print(f"dpeer worker {args.node_id}: {exc}", file=sys.stderr)
        return EXIT_GAVE_UP
    except TimeoutError as exc:
        print(f"dpeer worker {args.node_id}: {exc}", file=sys.stderr)
        return EXIT_GAVE_UP
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever the script raises, the daemon must hear it
        # (a KeyboardInterrupt too: uncaught, it left the worker restarted for ever with no reason given)
        launch = taken()
        run = launch.run if launch is not None else None
        if run is None or run.trainer is None:
            return _build_failed(args, source, exc)
        if run.finished:  # after the loop: every step is committed; a restart would only raise it again, for ever
            traceback.print_exception(exc)
            print(f"dpeer worker {args.node_id}: the script failed after its last step (the training is complete "
                  f"and committed): {type(exc).__name__}: {' '.join(str(exc).split())}"[:400], file=sys.stderr)
            if args.final_out and run.model is not None:
                torch.save(run.model.state_dict(), args.final_out)
            return 0
        traceback.print_exception(exc)  # here, whole: uncaught, torch's hook would prefix each line with its rank
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        # a worker that resumed after the end never joins a generation (-1), which the daemon cannot send on
        source.report_failure(f"the script failed at step {run.trainer.step}: {error}", max(run.trainer.generation, 0),
                              phase="train", step=run.trainer.step, error=error)
        return EXIT_GAVE_UP
    if args.final_out and launch.run.model is not None:
        torch.save(launch.run.model.state_dict(), args.final_out)
    return 0


def raise_open_files() -> None:
    """The soft open-file limit up to the hard one: Gloo's listener aborts the process when accept()
    runs out of descriptors, and strangers' connections pile up there until the watch re-forms the
    group (watched.FOREIGN_LIMIT), so the margin should be wide."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit the kernel caps lower (nr_open): keep what we have
            pass


def main(argv: list[str] | None = None) -> int:
    """Build the job, then train under the views of the given source."""
    imported_cpu = time.process_time()  # interpreter start and every import, torch's included
    raise_open_files()
    try:
        args = parse_args(argv)
        if args.parent_pid is not None:
            die_with_parent(args.parent_pid)
        source = make_view_source(args.views, args.node_id)
    except ValueError as exc:
        print(f"dpeer worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.spare and not await_takeover():
        return 0
    if args.job.endswith(".py"):
        return run_script(args, source, imported_cpu)
    try:
        trainer, spec = _build(args, source, imported_cpu)
    except Exception as exc:  # noqa: BLE001 - whatever the job's build raises, the daemon must hear it
        return _build_failed(args, source, exc)
    try:
        trainer.run()
    except (TimeoutError, StateTorn) as exc:
        print(f"dpeer worker {args.node_id}: {exc}", file=sys.stderr)
        return EXIT_GAVE_UP
    if args.final_out:
        torch.save(spec.model.state_dict(), args.final_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
