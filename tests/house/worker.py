"""The modelled worker: what the daemon sees of a training process, without a process.

Implements dpeer.daemon.worker.supervisor.Worker. A worker builds its job (ready after BUILD_S), takes
committed views, forms a group once every member of the view took that generation (a Gloo
rendezvous that waits for all), and steps together with its group every STEP_S while all members
still run it and reach each other; a member that left (crash, fence, restart, newer view,
partition of the data plane) makes the others' collective fail, and each reports the failure.
Every CKPT_EVERY steps each member reports a checkpoint; after SPEED_AFTER steps a worker reports
its box's speed, so views carry shares. The Training world keeps the ledger the invariants read:
which generations stepped at which tick, and every view handed to a worker.
"""

from __future__ import annotations

import contextvars
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailurePhase, FailureReport, LastFailure
from dpeer.daemon.worker.supervisor import RESTART_BACKOFF, TrainStatus, WorkerEvents
from dpeer.statemachine.state import Checkpoint
from dpeer.view import View

BUILD_S, STEP_S, CKPT_EVERY, FORM_TIMEOUT_S = 0.3, 0.05, 20, 3.0
SPEED_AFTER = 5  # steps a worker takes in a process's life before it reports its speed (trainer/pace.py WARMUP)


def digest(step: int) -> str:
    """Every replica's parameter digest at `step` (replicas agree; the model trains exactly)."""
    return hashlib.sha256(f"step {step}".encode()).hexdigest()


class SimWorker:
    """One box's worker; see the module docstring."""

    def __init__(self, world: Training, node_id: str, store_port: int, build_s: float = BUILD_S) -> None:
        """build_s: how long its job takes to build (inf: never ready, a box that cannot train)."""
        self.world, self.node_id, self._port, self.build_s = world, node_id, store_port, build_s
        self.events: WorkerEvents | None = None
        self.ready = self.done = self.fenced = self.alive = False
        self.halted = ""
        self.store_port = 0
        self.given_generation = 0
        self.train: TrainStatus | None = None
        self.last_failure: LastFailure | None = None  # the modelled job never raises: group failures only
        self.latest_step = self.reforms = self.restarts = self.starts = 0
        self.speed: float | None = None  # micro-batches a second, reported once it stepped SPEED_AFTER times
        self.base_speed = 8.0  # what it measures when it reports (the house draws it per box; a "slow" fault moves it)
        self._stepped = 0  # steps in this process's life
        self.gen = 0  # the generation it is in (handed and not failed), 0: none
        self.members: tuple[str, ...] = ()
        self.formed = False
        self.joined_at = 0.0
        self._ready_at: float | None = None
        self._restart_at: float | None = None
        self.resume_step = 0
        self._pending: View | None = None  # a view file written while the worker built its job
        self.context = contextvars.Context()  # its daemon's: what it tells the daemon runs as the box's work
        self.bell: Callable[[], None] = lambda: None  # the daemon's doorbell (WorkerLink.ring)
        self.exited: Callable[[], None] = lambda: None  # the daemon's exit watch (WorkerLink.worker_exited)
        self._life = 0
        self.cluster = "house"  # which cluster's groups it forms (a stranger's are its own)

    @property
    def running(self) -> bool:
        """True while the modelled process runs."""
        return self.alive

    def attach(self, events: WorkerEvents) -> None:
        """The daemon hears of failures and checkpoints from now on."""
        self.events = events

    def status(self) -> dict[str, Any]:
        """The status document's `worker`."""
        return {"ready": self.ready, "fenced": self.fenced, "gen": self.gen, "formed": self.formed,
                "restarts": self.restarts, "halted": self.halted or None}

    def take_recoveries(self) -> list[float]:
        """Not modelled."""
        return []

    def start(self, now: float) -> None:
        """A new process: builds, then waits for a view."""
        self.alive, self.ready, self.formed = True, False, False
        self.gen, self.members, self.given_generation, self.store_port = 0, (), 0, 0
        self.speed, self._stepped = None, 0  # a new process measures anew
        self._ready_at, self._restart_at, self._pending = now + self.build_s, None, None
        self.starts += 1
        self._life += 1
        life = self._life
        if self.build_s < float("inf"):
            self.world.later(self.build_s, lambda: self._life == life and self.alive and self.context.run(self.bell))

    def kill(self, now: float | None = None) -> None:
        """The process dies (a crash of the box, or of the worker alone when `now` is given:
        the supervisor then restarts it after its backoff)."""
        self.alive, self.ready, self.formed, self.gen = False, False, False, 0
        if now is not None and not self.halted:
            self._restart_at = now + RESTART_BACKOFF[min(self.restarts, len(RESTART_BACKOFF) - 1)]
            self.context.run(self.exited)

    def publish(self, view: View, checkpoint: Checkpoint | None = None) -> None:
        """A committed view reaches the worker: it joins that generation when it names this box."""
        if not self.alive:
            return
        self.given_generation = view.generation
        if self.cluster == "house":
            self.world.handed.append((self.node_id, view.generation, (tuple(view.members), view.sites, view.shares)))
        if checkpoint is not None:
            self.resume_step = max(self.resume_step, checkpoint.step)
        self._pending = view
        if view.generation > self.gen and self.node_id not in view.members:
            self.gen, self.formed = 0, False  # a newer view without this box: it leaves its group
        if self.ready:
            self._take(view)

    def _take(self, view: View) -> None:
        if self.node_id in view.members:
            self.gen, self.members, self.formed = view.generation, tuple(view.members), False
            self.joined_at = self.world.now()

    def publish_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The newest committed checkpoint: where a fresh worker resumes."""
        self.resume_step = max(self.resume_step, checkpoint.step)

    def poll(self, now: float) -> None:
        """Become ready after the build; restart after a crash (unless fenced or halted)."""
        if self.alive and not self.ready and self._ready_at is not None and now >= self._ready_at:
            self.ready, self.store_port = True, self._port
            if self._pending is not None:
                self._take(self._pending)
        if not self.alive and self._restart_at is not None and now >= self._restart_at and not self.fenced \
                and not self.halted:
            self.restarts += 1
            self.start(now)

    def stepped(self) -> None:
        """One more step in this life: past SPEED_AFTER, its speed is what it measures."""
        self._stepped += 1
        if self._stepped >= SPEED_AFTER:
            self.speed = self.base_speed

    def fence(self, fenced: bool, why: str, now: float) -> None:
        """Stop training while no quorum is reachable; start again once one is."""
        if fenced == self.fenced:
            return
        self.fenced = fenced
        if fenced:
            self.kill()
            self._restart_at = None
        else:
            self._restart_at = now

    def halt(self, why: str) -> None:
        """The job was committed as failed."""
        self.halted = why
        self.kill()

    def resume(self, now: float) -> None:
        """The job runs again."""
        if self.halted:
            self.halted, self._restart_at = "", now

    def restart(self, now: float, why: str) -> None:
        """Replace the process now."""
        self.kill()
        self._restart_at = now

    def stop(self) -> None:
        """Daemon shutdown."""
        self.kill()

    def fail(self, why: str) -> None:
        """Its group's collective failed: report it and wait for a new view."""
        gen, self.gen, self.formed = self.gen, 0, False
        self.world.failures += 1
        report = FailureReport(self.node_id, FailurePhase.GROUP, self.latest_step, why, gen)
        if self.events is not None:
            self.context.run(self.events.worker_failed, gen, report)
        self.context.run(self.bell)


@dataclass
class Training:
    """The data plane of every modelled worker: rendezvous, collective steps, the ledger."""

    now: Callable[[], float]
    later: Callable[[float, Callable[[], object]], object]  # loop.call_later
    reaches: Callable[[str, str], bool]  # whether the data plane carries a -> b
    workers: dict[str, SimWorker] = field(default_factory=dict)
    handed: list[tuple[str, int, tuple]] = field(default_factory=list)  # (box, generation, (members, sites, shares))
    stepped: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)  # per tick: generations that stepped
    failures: int = 0
    steps: int = 0

    def tick(self) -> None:
        """One STEP_S: groups form, step, or fail."""
        now, gens = self.now(), {}
        for w in self.workers.values():
            if w.alive and w.gen:
                gens.setdefault((w.cluster, w.gen), []).append(w)
        moved = []
        for (cluster, gen), ws in sorted(gens.items()):
            members = ws[0].members
            here = {w.node_id: w for w in ws}
            whole = set(here) == set(members) and all(
                self.reaches(a, b) for a in members for b in members if a != b)
            if not whole:
                for w in ws:
                    lost = w.formed or now - w.joined_at > FORM_TIMEOUT_S
                    if lost:
                        missing = sorted(set(members) - set(here)) or ["(a cut link)"]
                        w.fail(f"collective of generation {gen} failed: {', '.join(missing)} gone")
                continue
            if not all(w.formed for w in ws):
                start = max(max(w.resume_step, w.latest_step) for w in ws)
                for w in ws:
                    w.formed, w.latest_step = True, start
                    w.reforms += 1
                continue
            step = ws[0].latest_step + 1
            if cluster == "house":
                moved.append(gen)
            self.steps += 1
            for w in ws:
                w.latest_step = step
                w.train = TrainStatus(step, step, 0.0, digest(step))
                w.stepped()
                if step % CKPT_EVERY == 0 and w.events is not None:
                    w.context.run(w.events.checkpoint_written, Held(step, digest(step)))
                    w.context.run(w.bell)
        if moved:
            self.stepped.append((now, tuple(moved)))
