"""The step loop.

``Trainer.steps()`` yields the run's steps to the job's loop (a script job's own, or ``run()`` for a
``job(ctx) -> TrainSpec``): it waits for a committed view, forms the group, heals, and hands out
each step (step.py). A step is committed by its gradient allreduce. When a step fails (a dead or
hung peer, or the job's code raised) the loop reports it, destroys the group, waits for the next
view, re-forms, heals and yields the in-flight step again with the same indices. A newer view that
arrives while the group is healthy is agreed through the step's allreduce, so every rank leaves the
old group after the same step.
"""

from __future__ import annotations

import gc
import math
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Generator, Iterator

import torch

from dpeer.trainer import state as st
from dpeer.trainer.collective_watch import CollectiveWatch, Intrusion, patience
from dpeer.trainer.digests import BackgroundDigest
from dpeer.trainer.decisions import Failure, classify_failure, collective_timeout, plan_resume, should_switch
from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.exact import ExactStep
from dpeer.trainer.feed import InlineFeed, LoaderFeed
from dpeer.trainer.group import GroupError, GroupManager, GroupSeat, Superseded
from dpeer.trainer.heal import HealProgress, HealSession, heal
from dpeer.trainer.job_api import Dataset, JobContext, TrainSpec, default_collate  # noqa: F401 (re-exported: jobs import them from here)
from dpeer.trainer.ledger import LedgerFile
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.step import Step, StepUsageError
from dpeer.trainer.stepping import FastStep, Reduction, Trained
from dpeer.trainer.viewsource import Assignment, ViewSource


STEP_TIME_WINDOW = 200
ADAPT_EVERY = 8  # steps between re-computations of the adaptive timeout (a sort of the window: ~5 us)
FOREIGN_LIMIT = 64  # strangers' connections on the data-plane port that make the group re-form (closing them)
LINEAGE_KEPT = 8  # checkpoint digests a replica remembers of its lineage (for the heal's tie-break)
FOLD_EVERY = 1000  # steps between ledger compactions when no checkpoints are written (else at each checkpoint)


class StateTorn(BaseException):
    """A step failed after its gradients were reduced: the job's code (its optimizer's step, a
    scheduler) may have changed the state already, so the step cannot be redone from it. The worker
    exits and its restart resumes from the committed state (a peer's, or a checkpoint). A
    BaseException: a script's ``except Exception`` around its loop does not keep it."""


@dataclass
class LoopConfig:
    """Runtime knobs of the loop (timeouts in seconds)."""

    init_timeout: float = 30.0
    timeout_floor: float = 2.0
    timeout_mult: float = 5.0
    view_wait: float = 1.0
    idle_limit: float = 600.0
    ledger_path: str | None = None
    ckpt_dir: str | None = None
    ckpt_every: int = 0
    ckpt_keep: int = 2
    digest_every: int = 10  # steps between parameter digests; also the last step and each group's first
    reduction: Reduction = Reduction.EXACT  # how gradients are summed (stepping.Reduction)


class Trainer:
    """Runs a job's steps on this node across however many group generations it takes. ``feed``: a
    script job's data loader (None: the spec's dataset and collate, fetched inline), whose loss is a
    mean over its micro-batch when ``mean_loss`` (a TrainSpec's loss_fn is already scaled to a sum)."""

    def __init__(
        self, spec: TrainSpec, source: ViewSource, node_id: str, config: LoopConfig | None = None,
        store_socket: socket.socket | None = None, feed: LoaderFeed | None = None, mean_loss: bool = False,
    ) -> None:
        self.spec = spec
        self.source = source
        self.node_id = node_id
        self.cfg = config or LoopConfig()
        self.group = GroupManager(node_id, init_timeout=self.cfg.init_timeout, store_socket=store_socket)
        self.sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
        self.params = [p for p in spec.model.parameters() if p.requires_grad]
        self.step = 0
        self.generation = -1
        self.step_times: list[float] = []
        self.last_loss = float("nan")
        self._newest = -1  # the newest generation a peek saw during this one
        self._t0 = 0.0  # when the step in flight began
        self._timeout = self.cfg.init_timeout
        self._collate = spec.collate or default_collate
        self._resumed_for: tuple[int, str] = (0, "")
        self._planned = False
        self._ledger = LedgerFile(self.cfg.ledger_path) if self.cfg.ledger_path else None
        self._folded_below = 0  # the ledger's steps below this are folded into ranges
        self._digest_next = False
        self._digests = BackgroundDigest()  # a step's digest, hashed while the next step computes
        self._digest_seat: Any = None  # the group that committed the step being hashed
        self._lineage: dict[int, str] = {}  # checkpoint step -> parameter digest, along this replica's lineage
        self._heal = HealSession(self._heal_progress)  # a torn state from an interrupted heal, resumed by the next
        self._cut: tuple[int, float, str] | None = None  # the watch's last cut: generation, overdue s, why
        self._given_up: tuple[int, float] | None = None  # a generation left unformed (superseded), and when
        self.watch: CollectiveWatch | None = None  # started by run() for a Gloo group
        self.feed: InlineFeed | LoaderFeed = feed or InlineFeed(spec.dataset, self._collate)
        self._mean_loss = mean_loss
        self._torn: StateTorn | None = None  # a step failed after its reduction: this state is not any step's
        if self.cfg.reduction is Reduction.EXACT:  # the worker calls exact.configure_process first
            probe = self._collate if feed is None else None  # a script's forward is its own: no probe
            self.stepper: ExactStep | FastStep = ExactStep(spec, self.params, self.sampler, self.group.device, probe)
        else:
            self.stepper = FastStep(spec, self.params, self.sampler, self.group.device)

    def _event(self, kind: str, **fields: Any) -> None:
        report = getattr(self.source, "report_event", None)
        if report is not None:
            report(kind, **fields)

    def parts(self) -> st.StateParts:
        """The full training state at the current step, its tensors live (a heal donor's view)."""
        s = self.spec
        parts = st.capture_parts(s.model, s.optimizer, s.scheduler, s.scaler, self.step,
                                 self.sampler.cursor_after(self.step))
        parts.header["reduction"] = self.stepper.state()
        parts.header["lineage"] = sorted(self._lineage.items())
        return parts

    def capture(self) -> st.StateBlob:
        """The full training state at the current step, in one buffer."""
        return st.flatten(self.parts())

    def targets(self, header: dict) -> list[torch.Tensor]:
        """Where a heal receives each tensor of a peer's state: this replica's own, where they fit."""
        s = self.spec
        return st.receive_targets(header, s.model, s.optimizer, s.scheduler, s.scaler)

    def digest_order(self, header: dict, targets: list[torch.Tensor]) -> list[int] | None:
        """Which received tensors digest() hashes, in its order, when all are received in place."""
        return st.digest_order(header, targets, self.spec.model)

    def load(self, parts: st.StateParts) -> None:
        """Replace the training state with received ``parts``."""
        s = self.spec
        self.step, _cursor = st.restore_parts(parts, s.model, s.optimizer, s.scheduler, s.scaler)
        self._take_header(parts.header)

    def apply(self, blob: st.StateBlob) -> None:
        """Replace the training state with ``blob``."""
        s = self.spec
        self.step, _cursor = st.restore(blob, s.model, s.optimizer, s.scheduler, s.scaler)
        self._heal.forget()
        self._take_header(blob.header)

    def _take_header(self, header: dict) -> None:
        self.stepper.load_state(header.get("reduction"))
        self._lineage = {int(k): str(v) for k, v in header.get("lineage", [])}
        if header.get("params_digest"):
            self._remember(self.step, header["params_digest"])

    def _newer_members(self, generation: int) -> tuple[str, ...] | None:
        """The members of the newest committed view after ``generation`` (the watch's thread)."""
        newer = self.source.wait_view(generation, 0.0)
        return None if newer is None else tuple(newer.view.members)

    def _intruded(self) -> Intrusion | None:
        """The current group, when strangers opened FOREIGN_LIMIT connections to its data-plane port
        (Gloo's listener keeps them all until the group goes, then the process dies of too many
        open files): cut, it is reported and re-formed, and destroying it closes them (the watch's thread)."""
        m, count = self.group.membership, self.group.foreign_connections()
        if m is None or count < FOREIGN_LIMIT:
            return None
        return Intrusion(m.generation, f"{count} connections from outside the group to its data-plane port",
                         self.group.cutter())

    def _on_cut(self, generation: int, overdue: float, why: str) -> None:
        """The watch cuts this generation's overdue collective (its thread): the failure it causes says so."""
        self._cut = (generation, overdue, why)

    def _heal_progress(self, p: HealProgress) -> None:
        """A long heal's progress: a report record, and a line in the daemon's log (the worker's stderr)."""
        self._event("heal_progress", gen=self.generation, done_bytes=p.done_bytes, total_bytes=p.total_bytes,
                    seconds=round(p.seconds, 3), donors=p.donors)
        how = f"from {p.donors} donor(s)" if p.donors else "sent to the ranks behind"  # 0 donors: this rank donates
        print(f"dpeer worker: healing in generation {self.generation}: {p.done_bytes / 1e6:.0f} of "
              f"{p.total_bytes / 1e6:.0f} MB {how} in {p.seconds:.1f} s", file=sys.stderr, flush=True)

    def _remember(self, step: int, digest: str) -> None:
        """Note this replica's digest at a checkpoint step (its lineage), keeping the newest few."""
        self._lineage[step] = digest
        for old in sorted(self._lineage)[:-LINEAGE_KEPT]:
            del self._lineage[old]

    def _report_pause(self) -> None:
        """Training is paused: say at which step, with that step's digest once this worker holds a
        trained or resumed state, so every box's status shows where its replica holds (not as
        progress: no step was committed)."""
        self._event("paused", gen=self.generation, step=self.step, samples=self.sampler.cursor_after(self.step),
                    loss=self.last_loss, digest=self.digest() if self._planned else "")

    def digest(self) -> str:
        """Digest of the model's parameters and buffers."""
        return st.params_digest(self.spec.model)

    def _resume(self, committed: tuple[int, str]) -> None:
        """Load the newest local checkpoint that the plan for the committed (step, digest) allows
        and that is ahead of the state already loaded (see decisions.plan_resume).

        It runs before the worker reports ready when the daemon recorded a committed checkpoint
        for it (so peers never wait on the load), else at the first view, and again whenever a
        view names a newer committed checkpoint than the one planned for."""
        self._resumed_for, self._planned = committed, True
        if not self.cfg.ckpt_dir:
            return
        local = st.list_checkpoints(self.cfg.ckpt_dir)
        plan = plan_resume([s for s, _ in local], committed[0])
        paths = dict(local)
        for step in plan.steps:
            if step <= self.step:
                break
            blob = self._read_checkpoint(paths[step], committed[1] if step == plan.verify_step else None)
            if blob is not None:
                self.apply(blob)
                self._event("checkpoint_loaded", step=self.step, committed=committed[0], reason=plan.reason)
                return
        if self.step == 0:
            self._event("checkpoint_none", committed=committed[0], reason=plan.reason)

    def _committed_hint(self) -> tuple[int, str]:
        """The committed checkpoint the daemon recorded for this worker, if its source offers one."""
        read = getattr(self.source, "committed_checkpoint", None)
        return read() if read is not None else (0, "")

    def _read_checkpoint(self, path: str, params_digest: str | None) -> st.StateBlob | None:
        """The checkpoint at path when it verifies (and holds `params_digest`, if given); else None."""
        try:
            blob = st.StateBlob.from_bytes(st.read_checkpoint(path))
        except (st.StateError, OSError, ValueError) as exc:
            self._event("checkpoint_rejected", path=path, reason=str(exc)[:200])
            return None
        if params_digest is not None and blob.header.get("params_digest") != params_digest:
            self._event("checkpoint_rejected", path=path, reason="its parameters differ from the committed digest")
            return None
        return blob

    def peek_newest(self) -> int:
        """The newest committed generation seen so far (a look without waiting)."""
        seen = max(self.generation, self._newest)
        newer = self.source.wait_view(seen, 0.0)
        if newer is not None:
            self._newest = seen = newer.view.generation
        return seen

    def _adapt_timeout(self) -> None:
        seconds, _reason = collective_timeout(
            self.step_times, floor=self.cfg.timeout_floor, mult=self.cfg.timeout_mult,
            initial=self.cfg.init_timeout, window=STEP_TIME_WINDOW,
        )
        if abs(seconds - self._timeout) > 0.1 * self._timeout:
            self._timeout = seconds
            self.group.set_timeout(seconds)

    def _write(self, entry: dict[str, Any]) -> None:
        """Append one ledger record: one line-buffered write, no open/close per step."""
        if self._ledger is not None:
            self._ledger.write(entry)

    def _fold_ledger(self) -> None:
        """Fold the ledger's steps that a committed checkpoint covers into ranges (ledger.py), at
        each checkpoint this worker writes: those below the committed checkpoint, or below this
        worker's previous checkpoint when the commit lags further (the tail stays within two
        intervals; a range keeps what the audit needs either way). Without checkpoints, every
        FOLD_EVERY steps, up to this one."""
        if self._ledger is None:
            return
        if self.cfg.ckpt_dir and self.cfg.ckpt_every:
            committed = max(self._committed_hint()[0], self.step - self.cfg.ckpt_every)
            below = min(committed, self.step) if self._checkpoint_due() else 0
        else:
            below = self.step if self.step % FOLD_EVERY == 0 else 0
        if below > self._folded_below:
            self._ledger.fold_later(below)
            self._folded_below = below

    def _record_trained(self, trained: Trained, membership: Any) -> None:
        """Before the step's allreduce, record what this rank trained (its micro-batches and their
        samples), so the audit sees it even when the rank dies right after the step commits."""
        self._write({"kind": "trained", "step": trained.step, "gen": membership.generation,
                     "world": membership.world, "rank": membership.rank,
                     "micro_batches": trained.micro_batches, "indices": trained.indices})

    def _record(self, membership: Any, digest: str) -> None:
        """Record the committed step with its digest (every digest_every steps) and loss."""
        self._write({"kind": "committed", "step": self.step - 1, "gen": membership.generation,
                     "world": membership.world, "rank": membership.rank, "digest": digest, "loss": self.last_loss})

    def _checkpoint_due(self) -> bool:
        """Whether this step writes a checkpoint (the final one always: a box back after the end fetches it)."""
        final = self.step == self.spec.steps
        return bool(self.cfg.ckpt_dir) and bool(final or (self.cfg.ckpt_every and self.step % self.cfg.ckpt_every == 0))

    def _settle_digest(self) -> None:
        """Record the digest hashed while this step computed (the ledger, then the status), if any;
        before anything writes the parameters (the optimizer's step, a heal, a resume)."""
        done = self._digests.settle()
        if done is None:
            return
        (step, digest), m = done, self._digest_seat
        self._write({"kind": "digest", "step": step - 1, "gen": m.generation, "world": m.world, "rank": m.rank,
                     "digest": digest})
        self._event("digest", step=step, samples=self.sampler.cursor_after(step), loss=self.last_loss, digest=digest)

    def _checkpoint(self, digest: str) -> None:
        """Write the checkpoint of this step when one is due; `digest` is the step's parameter
        digest when train_step already took it ("" otherwise)."""
        final = self.step == self.spec.steps
        if self._checkpoint_due():
            blob = self.capture()
            params = digest or self.digest()
            self._remember(self.step, params)
            blob.header["params_digest"] = params
            blob.header["lineage"] = sorted(self._lineage.items())
            _, file_digest = st.write_checkpoint(self.cfg.ckpt_dir, self.step, blob.to_bytes())
            st.prune_checkpoints(self.cfg.ckpt_dir, self.cfg.ckpt_keep, protect=self._committed_hint()[0])
            self._event("checkpoint", step=self.step, digest=file_digest, params_digest=params,
                        rank=self.group.membership.rank, final=final)

    @contextmanager
    def _watched(self, m: Any) -> Iterator[None]:
        """Run a heal's collectives under the watch (a Gloo group's): only a newer view that drops a
        member cuts them, once they have run a step's patience (a big heal may rightly run long)."""
        if self.watch is None:
            yield
            return
        self.watch.arm(m.generation, m.members, patience(self.step_times), self.group.cutter(), drops_only=True)
        try:
            yield
        finally:
            self.watch.disarm()

    def begin_step(self, m: GroupSeat) -> Step:
        """Plan the next step in the group ``m`` and record what this rank trains of it, before any of
        its sums can leave."""
        self._t0 = time.monotonic()
        self._record_trained(self.stepper.plan(self.step, m.rank, m.world), m)
        return Step(self, m, self.step, self._mean_loss)

    def reduce(self, m: GroupSeat) -> StepReduction | None:
        """Wait for the step's sums under the watch; None: the micro-batches run again (exact redo).
        Once the step is reduced, the digest hashed meanwhile is settled: the job's optimizer is
        about to write the parameters it hashes."""
        if self.watch is not None:  # inline, not _watched: a generator context costs the step ~0.5 %
            self.watch.arm(m.generation, m.members, patience(self.step_times), self.group.cutter())
        try:
            red = self.stepper.reduce(m.rank, m.world)
        finally:
            if self.watch is not None:
                self.watch.disarm()
        if red is not None:
            self._settle_digest()
        return red

    def all_sum(self, m: GroupSeat, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group ``m`` in place, under the watch (step.evaluate's collective)."""
        if self.watch is not None:
            self.watch.arm(m.generation, m.members, patience(self.step_times), self.group.cutter())
        try:
            torch.distributed.all_reduce(tensor)
        finally:
            if self.watch is not None:
                self.watch.disarm()

    def commit_step(self, m: GroupSeat, red: StepReduction) -> bool:
        """The job ended a reduced step: count it, digest, record, report, checkpoint; True when the
        group agreed to switch to a newer view."""
        spec = self.spec
        self.step += 1
        self.last_loss = red.loss_mean
        self.step_times.append(time.monotonic() - self._t0)
        if len(self.step_times) > 2 * STEP_TIME_WINDOW:
            del self.step_times[:-STEP_TIME_WINDOW]
        if self.step % ADAPT_EVERY == 0:
            self._adapt_timeout()
        digested = self._digest_next or self.step % self.cfg.digest_every == 0 or self.step == spec.steps
        self._digest_next = False
        digest = ""
        if digested and (self._checkpoint_due() or self.step == spec.steps):
            digest = self.digest()  # the checkpoint's header (and the job's end) needs it now
        elif digested:
            self._digests.start(self.step, st.digest_later(spec.model))
            self._digest_seat = m
        self._record(m, digest)
        self.source.report_progress(self.step, self.sampler.cursor_after(self.step), red.loss_mean, digest)
        self._checkpoint(digest)
        self._fold_ledger()
        return should_switch(m.generation, red.newest_seen_by_rank).switch

    def _form(self, given: Assignment) -> GroupSeat:
        """Form the group of ``given``'s view and heal this replica in it; the feed plans from here."""
        view = given.view
        t0 = time.monotonic()
        m = self.group.form(view, lambda: self.peek_newest() > view.generation, given.bind_host)
        t_formed = time.monotonic()
        self.group.set_timeout(self.cfg.init_timeout)
        vouched = (given.checkpoint_step > 0
                   and self._lineage.get(given.checkpoint_step) == given.checkpoint_digest)
        with self._watched(m):  # a donor stopped mid-heal is cut once a newer view drops it
            result = heal(m.rank, m.world, self.step, self, device=self.group.device, key=m.heal_key,
                          vouched=vouched, session=self._heal,
                          committed=(given.checkpoint_step, given.checkpoint_digest))
        self._timeout = self.cfg.init_timeout
        self._adapt_timeout()
        self._digest_next = True  # a replica that healed wrong differs from its first step on
        self.feed.replan(lambda s: self.stepper.keys(s, m.rank, m.world))
        self._event(
            "formed", gen=view.generation, rank=m.rank, world=m.world, step=self.step,
            healed=result.received, heal_bytes=result.received_bytes, heal_resumed_bytes=result.resumed_bytes,
            seconds=time.monotonic() - t0,
            form_s=t_formed - t0, heal_s=result.seconds,
        )
        return m

    def _report_stall(self) -> None:
        """A generation left unformed as superseded (a member gave up on it) that no newer view
        followed within the init timeout is a group failure, reported so the leader forms a new one:
        never a silent wait while the status says training."""
        if self._given_up is None or time.monotonic() - self._given_up[1] < self.cfg.init_timeout:
            return
        (gen, _), self._given_up = self._given_up, None
        error = f"generation {gen} was given up before it formed and no newer view came in {self.cfg.init_timeout:g}s"
        self.source.report_failure(f"generation {gen} at step {self.step}: {error}", gen, phase="group",
                                   step=self.step, error=error)

    def _generation(self, given: Assignment) -> Generator[Step, None, Failure | None]:
        """Form, heal and yield steps in the ``given`` view; returns the failure, or None (done or
        switching).

        Any exception ends the generation, not the worker: a collective's is transient (a peer
        died or hung), and one from the job's code is reported so the leader can tell a broken
        job (the same error at the same step again and again) from bad luck."""
        failure, view = None, given.view
        try:
            m = self._form(given)
            while self.step < self.spec.steps:
                step = self.begin_step(m)
                yield step
                if step.error is not None:
                    error, step.error = step.error, None  # the job's loop still holds the step
                    if step.reduced:
                        self._torn = StateTorn(
                            f"step {step.number} failed after its gradients were reduced ({type(error).__name__}: "
                            f"{error}): the job's code may have changed the model or optimizer already, so "
                            f"the worker restarts from the committed state instead of redoing the step")
                    raise error
                if step.reduction is None:
                    raise StepUsageError(f"step {step.number} was not run: run each step's body inside `with step:`")
                if self.commit_step(m, step.reduction):
                    self._event("switch", gen=view.generation, step=self.step)
                    return None
            torch.distributed.barrier()
        except Superseded:
            failure, self._given_up = None, (view.generation, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - every failure is reported; the job's own with its traceback
            failure = self._failed(exc, view.generation)
            traceback.clear_frames(exc.__traceback__)  # its frames hold the failed group's works (and its sockets)
        return failure

    def _failed(self, exc: Exception, generation: int) -> Failure:
        """Classify and report a generation's failure (the job's own with its traceback, once)."""
        t_caught = time.time()
        failure = classify_failure(exc, self.step, isinstance(exc, GroupError))
        cut, self._cut = self._cut if self._cut is not None and self._cut[0] == generation else None, None
        if cut is not None:
            failure = replace(failure, error=f"cut after {cut[1]:.2f}s in the collective ({cut[2]}): "
                              f"{failure.error}"[:300])
        self._event("failed", gen=generation, step=self.step, caught_t=t_caught, format_s=time.time() - t_caught,
                    phase=failure.phase, error=failure.error, cut_after_s=cut[1] if cut else None)
        if failure.phase == "train":  # the job's code raised: its frames reach the daemon's log on stderr
            traceback.print_exception(exc)
        return failure

    def run(self) -> int:
        """Train a TrainSpec job until ``spec.steps`` steps are committed; returns the final step."""
        spec, device = self.spec, self.group.device
        for step in self.steps():
            with step:
                for x, y in step.micro_batches():
                    step.backward(spec.loss_fn(spec.model(x.to(device)), y.to(device)))
                if spec.scaler is not None:
                    spec.scaler.step(spec.optimizer)
                    spec.scaler.update()
                else:
                    spec.optimizer.step()
                if spec.scheduler is not None:
                    spec.scheduler.step()
        return self.step

    def steps(self) -> Iterator[Step]:
        """The run's steps, each yielded until it is committed (see the module)."""
        hint = self._committed_hint()
        if hint[0] > 0:
            self._resume(hint)
        # Keep the collector off the step path: freeze what the imports and the build left (torch:
        # ~300k objects). Only the young generations are collected first; a full pass found nothing
        # to free here and costs 0.2 CPU-s before the worker can report ready.
        gc.collect(1)
        gc.freeze()
        idle_since = time.monotonic()
        paused = False
        started_at = self.step
        if self.group.backend == "gloo":
            self.watch = CollectiveWatch(self._newer_members, self._on_cut, self._intruded)
        try:
            while self.step < self.spec.steps:
                given = self.source.wait_view(self.generation, self.cfg.view_wait)
                self._newest = -1
                if given is None:
                    self._report_stall()
                    if time.monotonic() - idle_since > self.cfg.idle_limit and not paused:
                        raise TimeoutError(f"no usable view for {self.cfg.idle_limit:.0f}s")
                    continue
                view = given.view
                self.generation, self._given_up = view.generation, None
                was_paused, paused = paused, not view.members  # an operator's pause: wait, however long
                if paused or was_paused:
                    idle_since = time.monotonic()  # the idle limit counts from the pause's end, not before it
                if paused:
                    self._report_pause()
                if view.rank_of(self.node_id) is None:
                    continue
                self._settle_digest()  # a resume or a heal may write the parameters
                if not self._planned or given.checkpoint_step > self._resumed_for[0]:
                    self._resume((given.checkpoint_step, given.checkpoint_digest))
                failure = yield from self._generation(given)
                if failure is not None:  # the leader first: tearing the group down takes 10-20 ms
                    self.source.report_failure(f"generation {view.generation} at step {failure.step}: {failure.error}",
                                               view.generation, phase=failure.phase, step=failure.step,
                                               error=failure.error)
                t_destroy = time.monotonic()
                self.group.destroy()
                if failure is not None:
                    self._event("destroyed", seconds=time.monotonic() - t_destroy)
                if self._torn is not None:
                    raise self._torn
                idle_since = time.monotonic()
            if started_at == self.step:  # resumed at the last step (a box back after the end)
                self.source.report_progress(self.step, self.sampler.cursor_after(self.step), math.nan, self.digest())
        finally:
            self._settle_digest()
            self._digests.close()
            if self.watch is not None:
                self.watch.close()
            self.stepper.close()
            self.feed.close()
            self.group.close()
            if self._ledger is not None:
                self._ledger.close()
