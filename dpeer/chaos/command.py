"""`dpeer chaos` end to end: validate, run, stop every node, check, report; and the script entry point."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from typing import Any

from dpeer import chaos
from dpeer.chaos.checks import (after_the_last_step, check_kv_history, check_liveness, check_protocol, check_training,
                                protocol_notes)
from dpeer.chaos.options import ChaosOptions, add_arguments, options_from, validate
from dpeer.chaos.report import violations, write_report
from dpeer.chaos.run import Run
from dpeer.chaos.schedule import Fault


def run_chaos(opts: ChaosOptions) -> int:
    """Run, check, print the summary, write the JSON timeline; 0 without violations, 1 with."""
    validate(opts)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _terminate)
    opts.out.mkdir(parents=True, exist_ok=True)
    run = Run(opts)
    try:
        checks = _drive(run)
    finally:
        run.close()  # the namespaces and the bridge of --netns, whatever happened
    notes = {"acknowledged kv writes readable from every node":
             f"{len(run.acked)} acknowledged writes read back through every node",
             "every faulted node back in a group": f"{len(run.faults)} faults",
             "training resumes after every fault (liveness)": _liveness_note(run.faults, opts)}
    skipped: dict[str, str] = {}
    _history_and_logs(run, checks, notes, skipped)
    _stranger_row(run, checks, notes, skipped)
    checks.update(check_protocol(run.samples))
    notes.update(protocol_notes(run.samples))
    rows, figures = check_training(run)
    for name, outcome in rows.items():
        if outcome["ran"]:
            checks[name], notes[name] = outcome["problems"], outcome["note"]
        else:
            skipped[name] = outcome["note"]
    write_report(run, checks, figures, time.monotonic() - started, notes, skipped)
    return 1 if violations(checks) else 0


def _history_and_logs(run: Run, checks: dict[str, list[str]], notes: dict[str, str], skipped: dict[str, str]) -> None:
    """The rows "kv history linearizable" and "committed prefixes equal", each with its figures;
    a check that could not run fully has a problem that says so."""
    lin, prefixes = "kv history linearizable", "committed prefixes equal"
    if run.opts.kv_clients == 0:
        skipped[lin] = "not run (--kv-clients 0)"
    else:
        checks[lin], notes[lin] = check_kv_history(run.history, run.opts.kv_clients)
    if run.prefixes is None:
        checks[prefixes] = ["not run: the run stopped before the logs were read"]
        notes[prefixes] = "nothing compared"
    else:
        checks[prefixes], notes[prefixes] = run.prefixes.problems, run.prefixes.note


def _stranger_row(run: Run, checks: dict[str, list[str]], notes: dict[str, str], skipped: dict[str, str]) -> None:
    """The row "stranger's store requests refused": every request the stranger made on the store's
    wire under a guessed key was refused or not served; "not run" when no store met one."""
    name, tally = "stranger's store requests refused", run.stranger
    if "stranger" not in run.opts.kinds:
        skipped[name] = "not run (stranger is not among --kinds)"
    elif tally.answered() == 0:
        skipped[name] = (f"not run: no rendezvous store met the stranger's requests "
                         f"({sum(tally.requests.values())} made, none greeted and answered)")
    else:
        checks[name], notes[name] = list(tally.ran), tally.requests_note()


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the run like Ctrl-C: every node is still stopped


def _liveness_note(faults: list[Fault], opts: ChaosOptions) -> str:
    """What the liveness check compared: the faults, the limit, and those it could not judge."""
    last = after_the_last_step(faults, opts.steps)
    late = f" ({len(last)} hit after the job's last step was committed: no step follows them)" if last else ""
    return f"{len(faults) - len(last)} faults, limit {opts.max_recovery:.0f}s{late}"


def _drive(run: Run) -> dict[str, list[str]]:
    """The run itself, then every node stopped (even on Ctrl-C); the kv and liveness checks."""
    checks: dict[str, list[str]] = {}
    try:
        try:
            asyncio.run(run.main())
        except TimeoutError as exc:
            checks["cluster formed"] = [str(exc)]
        checks["acknowledged kv writes readable from every node"] = run.kv_check_result
        checks.update(check_liveness(run.faults, run.opts.max_recovery, run.opts.steps))
    finally:
        for node in run.cluster.nodes:
            if node.node_id in run.stopped:
                run.cluster.kill(node, signal.SIGCONT)
        run.cluster.stop_all()
    return checks


def main(argv: list[str] | None = None) -> int:
    """Entry point of scripts/chaos.py and `python -m dpeer.chaos`; returns the exit code."""
    p = argparse.ArgumentParser(prog="chaos", description=(chaos.__doc__ or "").splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_chaos(options_from(args))
    except ValueError as exc:
        print(f"dpeer chaos: {exc}", file=sys.stderr)
        return 2
