"""`dpeer demo`: a local cluster on loopback training the demo job (or --job), shown live in the terminal.

--job takes what `dpeer start --job` does: demo, MODULE:FUNCTION or PATH.py. It is checked before
anything starts (a script that is not there, a module not found from here: exit 2), and the
daemons get the working directory on PYTHONPATH, so a job module beside the user is found as
`python -m` would find it. --steps is the run's training.steps, whatever the job.

With --chaos, a seeded schedule kills a node (SIGKILL of its daemon and worker) and restarts it
on its data dir a little later, never taking down more nodes than a quorum allows; each
recovery is measured from the kill to the survivors' next committed step, and each rejoin from
the restart to the restarted node training again. SIGINT, SIGTERM and SIGHUP (the terminal
closing) stop every process the demo started. The exit code is 0 only when every replica ends
with the job's committed final step and digest; a daemon that exits on its own (one the chaos
schedule did not kill) ends the demo at once with its error, exit 1. With --json, stdout carries
one JSON object a line: the start, each event, the progress every 2 s, and last the end of the
run with its exit code, final step and digest; errors go to stderr as {error, exit_code}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live

from dpeer.launch.cluster import LocalCluster, LocalNode
from dpeer.daemon import job_name
from dpeer.daemon.config import TrainingConfig
from dpeer.daemon.decide.job_status import JobStatus
from dpeer.cli.parser import UsageError
from dpeer.cli.demo_events import Docs, EventLog, Kill, newest_step, train_of
from dpeer.cli.demo_screen import Frame, final_table, newest_committed, plain, progress_record, render
from dpeer.cli.output import report

REFRESH = 0.5
PLAIN_EVERY = 2.0
RATE_WINDOW = 5.0


class Stopped(BaseException):
    """A signal asked the demo to stop (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class DaemonExited(Exception):
    """A daemon of the demo exited although the demo did not stop it: the run cannot go on."""

    def __init__(self, node: LocalNode, during_start: bool, log_tail: str) -> None:
        code = node.proc.returncode if node.proc is not None else None
        when = "while starting" if during_start else "while the demo ran"
        super().__init__(f"{node.node_id}'s daemon exited {when} (exit code {code})")
        self.node, self.log_tail = node, log_tail


@dataclass
class Chaos:
    """A seeded schedule: a kill every `every` seconds, the node restarted `down_for` seconds later."""

    rng: random.Random
    every: float = 12.0
    down_for: float = 4.0
    next_at: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """How the run ended: its exit code, the verdict, and the committed final step and digest
    (the failed step and no digest for a failed job)."""

    code: int
    verdict: str
    step: int | None = None
    digest: str | None = None


def _outcome(docs: Docs) -> Outcome | None:
    """The run's end once every node is up and agrees the job ended."""
    if not docs or any(d is None for d in docs.values()):
        return None
    jobs = [d.get("job") or {} for d in docs.values() if d]
    failed = next((j for j in jobs if j.get("state") == JobStatus.FAILED), None)
    if failed is not None:
        return Outcome(1, f"the job failed: {failed.get('error')}", failed.get("step"))
    if not all(j.get("state") == JobStatus.FINISHED for j in jobs):
        return None
    step, digest = jobs[0]["step"], jobs[0]["digest"]
    if not all(d and (d.get("worker") or {}).get("done") for d in docs.values()):
        return None
    held = {n: (train_of(d).get("step"), train_of(d).get("params_digest")) for n, d in docs.items()}
    wrong = {n: h for n, h in held.items() if h != (step, digest)}
    if wrong:
        listed = "; ".join(f"{n} at step {s} with {str(dg)[:12]}" for n, (s, dg) in sorted(wrong.items()))
        return Outcome(1, f"training finished, but not every replica holds the final state: {listed}", step, digest)
    return Outcome(0, f"training finished: every replica holds step {step} with digest {digest[:12]}, "
                   "the final state the cluster committed", step, digest)


def emit(record: dict[str, Any]) -> None:
    """One --json line on stdout."""
    print(json.dumps(record, sort_keys=True), flush=True)


def end_line(code: int, verdict: str, step: int | None, digest: str | None, elapsed: float, kills: list[Kill],
             **more: Any) -> int:
    """--json's last line: the exit code, the verdict, the final step and digest (a run that did
    not finish: its newest committed step, no digest), the kills; a failed run's verdict also
    goes to stderr as the error. Returns code."""
    emit({"type": "end", "t": round(elapsed, 3), "exit_code": code, "ok": code == 0, "verdict": verdict,
          "step": step, "digest": digest, "kills": len(kills), "recovered": sum(k.recovered for k in kills), **more})
    return report(verdict, code, True) if code else code


class Demo:
    """One run: the cluster, the chaos schedule, the event log and the screen."""

    def __init__(self, cluster: LocalCluster, steps: int, chaos: Chaos | None, console: Console,
                 as_json: bool = False, job: str = "demo") -> None:
        self.cluster, self.steps, self.chaos, self.console = cluster, steps, chaos, console
        self.as_json, self.job = as_json, job
        self.started = time.monotonic()
        self.log = EventLog(self.started)
        self.history: list[tuple[float, int]] = []
        self.losses: list[float] = []
        self.docs: Docs = {}
        self._last_loss_step = -1
        self._answered: set[str] = set()

    def frame(self, now: float) -> Frame:
        """What the screen shows now."""
        return Frame(now - self.started, self.docs, self.steps, self._rate(), self.losses, self.log.events,
                     job_label(self.job))

    def _rate(self) -> float:
        if len(self.history) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.history[0], self.history[-1]
        return (s1 - s0) / max(1e-9, t1 - t0)

    async def observe(self) -> list:
        """Read every node's status and fold it into the history and the event log."""
        docs = dict(await self.cluster.statuses(timeout=1.0))
        self._check_exits()
        docs.update({n.node_id: None for n in self.cluster.nodes if not n.running})
        self.docs = docs
        self._answered.update(n for n, d in docs.items() if d is not None)
        now = time.monotonic()
        step = newest_step(docs)
        self.history = [(t, s) for t, s in self.history if now - t < RATE_WINDOW] + [(now, step)]
        losses = [train_of(d).get("loss") for d in docs.values() if train_of(d).get("step") == step]
        if losses and losses[0] is not None and (not self.losses or step != self._last_loss_step):
            self.losses.append(float(losses[0]))
            self._last_loss_step = step
        events = self.log.update(now, docs)
        if self.chaos is not None:
            self._chaos_step(now)
        return events

    def _check_exits(self) -> None:
        """Raise DaemonExited for a daemon that ended although the chaos schedule did not kill it."""
        killed = {k.node for k in self.log.kills if k.restarted_at is None}
        for node in self.cluster.nodes:
            if node.proc is not None and not node.running and node.node_id not in killed:
                raise DaemonExited(node, node.node_id not in self._answered, self.cluster.tail(node, 12))

    def _chaos_step(self, now: float) -> None:
        assert self.chaos is not None
        for kill in self.log.kills:
            if kill.restarted_at is None and now - kill.at >= self.chaos.down_for:
                self.cluster.start(self.cluster.node(kill.node))
                self.log.restarted(now, kill.node)
        finished = any(((d or {}).get("job") or {}).get("state") == JobStatus.FINISHED for d in self.docs.values())
        down = [n for n in self.cluster.nodes if not n.running]
        quorum_safe = len(down) < (len(self.cluster.nodes) - 1) // 2 + (len(self.cluster.nodes) == 2)
        if now >= self.chaos.next_at and quorum_safe and not finished:
            victim = self.chaos.rng.choice([n for n in self.cluster.nodes if n.running])
            self.cluster.kill(victim, signal.SIGKILL)
            self.log.killed(now, victim.node_id, newest_step(self.docs))
            self.chaos.next_at = now + self.chaos.every

    async def run(self) -> int:
        """Show the cluster until the job ends; returns the exit code."""
        if self.chaos is not None:
            self.chaos.next_at = self.started + self.chaos.every
        if self.console.is_terminal and not self.as_json:
            return await self._run_live()
        return await self._run_plain()

    async def _run_live(self) -> int:
        with Live(render(self.frame(time.monotonic())), console=self.console, auto_refresh=False,
                  transient=False) as live:
            while True:
                await self.observe()
                live.update(render(self.frame(time.monotonic())), refresh=True)
                end = _outcome(self.docs)
                if end is not None:
                    break
                await asyncio.sleep(REFRESH)
        return self._finish(end)

    async def _run_plain(self) -> int:
        """A line per event and a progress line every PLAIN_EVERY seconds: text, or JSON under --json."""
        last_line = 0.0
        while True:
            for event in await self.observe():
                if self.as_json:
                    emit({"type": "event", "t": round(event.at, 3), "text": event.text})
                else:
                    print(f"  {event.at:7.1f}s  {event.text}", flush=True)
            now = time.monotonic()
            if now - last_line >= PLAIN_EVERY:
                if self.as_json:
                    emit(progress_record(self.frame(now)))
                else:
                    print(plain(self.frame(now)), flush=True)
                last_line = now
            end = _outcome(self.docs)
            if end is not None:
                return self._finish(end)
            await asyncio.sleep(REFRESH)

    def _finish(self, end: Outcome) -> int:
        recovered = [k for k in self.log.kills if k.recovered]
        if self.as_json:
            return self.ended(end.code, end.verdict, end.step, end.digest)
        print("\n" + final_table(self.docs) + "\n\n" + end.verdict, flush=True)
        if self.log.kills:
            print(f"{len(self.log.kills)} kills, {len(recovered)} recovered", flush=True)
        return end.code

    def ended(self, code: int, verdict: str, step: int | None, digest: str | None = None, **more: Any) -> int:
        """--json's last line (see end_line), from this run's time and kills."""
        return end_line(code, verdict, step, digest, time.monotonic() - self.started, self.log.kills, **more)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def _checked(args: argparse.Namespace) -> tuple[int, Path]:
    """The steps to train and the demo's folder, or UsageError for flags that could never run."""
    if args.nodes < 1 or args.nodes > 9:
        raise UsageError("--nodes must be between 1 and 9")
    steps = TrainingConfig().steps if args.steps is None else args.steps
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, not {steps}")
    if args.base_port is not None:
        top = 65535 - 2 * (args.nodes - 1)
        if not 1 <= args.base_port <= top:
            raise UsageError(f"--base-port must be between 1 and {top} for {args.nodes} nodes (node i listens "
                             f"on --base-port + 2i), not {args.base_port}")
    if args.dir is None:
        return steps, Path(tempfile.mkdtemp(prefix="dpeer-demo-"))
    if args.dir.exists() and not args.dir.is_dir():
        raise UsageError(f"--dir {args.dir} is a file, not a folder; name a folder (made if absent) for the "
                         "nodes' data and logs")
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--dir {args.dir} cannot be made: {exc.strerror or exc}") from None
    return steps, args.dir


def checked_job(text: str) -> str:
    """--job as the daemons get it (a script's path made absolute), or UsageError when it could
    never start: a name of no job form, a script that is not a readable file, a module not found
    from here. Checked before any daemon starts, instead of failing every build until the job halts."""
    try:
        job = job_name.resolve(text)
    except ValueError as exc:
        raise UsageError(f"--job: {exc}") from None
    refusal = job_name.job_refusal(job)
    if refusal is not None:
        raise UsageError(f"--job: {refusal}")
    return job


def job_label(job: str) -> str:
    """How the screen names the job: a script by its file name, any other job as it is named."""
    return Path(job).name if job_name.is_script(job) else job


def daemon_env(cwd: str | None = None) -> dict[str, str]:
    """What the demo adds to its daemons' environment (their workers inherit it): the working
    directory first on PYTHONPATH, so `--job mymodule:build` finds mymodule.py beside the user
    whatever the daemons' own sys.path holds."""
    here = cwd or os.getcwd()
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join([here, rest]) if rest else here}


def run_demo(args: argparse.Namespace) -> int:
    """Start the cluster, show it until the job ends (or a signal, or a daemon's exit), then stop every node."""
    job = checked_job(args.job)
    steps, root = _checked(args)
    cluster = LocalCluster(root, args.nodes, job=job, base_port=args.base_port,
                           config={"training": {"steps": steps}}, env=daemon_env())
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    chaos = Chaos(random.Random(args.seed)) if args.chaos else None
    if args.json:
        emit({"type": "start", "nodes": args.nodes, "steps": steps, "dir": str(root), "chaos": args.chaos,
              "seed": args.seed, "job": job})
    else:
        print(f"starting {args.nodes} nodes on 127.0.0.1 training job {job_label(job)} (data and logs in {root}); "
              "Ctrl-C stops them", flush=True)
    demo = None
    try:
        cluster.start_all()
        demo = Demo(cluster, steps, chaos, Console(), args.json, job)
        return asyncio.run(demo.run())
    except Stopped as stop:
        if args.json and demo is not None:
            return demo.ended(128 + stop.signum, f"stopped by {stop}", newest_committed(demo.docs))
        if args.json:
            return end_line(128 + stop.signum, f"stopped by {stop} while the nodes started", None, None, 0.0, [])
        _tell(f"\nstopped by {stop}; stopping the cluster")
        return 128 + stop.signum
    except DaemonExited as exited:
        advice = "fix what the log says (a port in use: free it or pick another --base-port) and run the demo again"
        if args.json and demo is not None:
            return demo.ended(1, f"{exited}; the end of its log is in {exited.node.log_path}: {advice}",
                              newest_committed(demo.docs), log_tail=exited.log_tail.splitlines())
        tail = "\n".join(f"  | {line}" for line in exited.log_tail.splitlines()) or "  | (its log is empty)"
        _tell(f"\ndpeer: {exited}; the end of its log ({exited.node.log_path}):\n{tail}\n"
              f"dpeer: stopping the other nodes; {advice}")
        return 1
    finally:
        for sig in previous:  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _tell(text: str) -> None:
    """Say something on stderr if it still leads anywhere (a closed terminal's does not)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass
