"""The step loop.

``Trainer.steps()`` yields the run's steps to the job's loop (a script job's own, or ``run()`` for a
``job(ctx) -> TrainSpec``): it waits for a committed view, forms the group, heals, and hands out
each step (step.py). A step is committed by its gradient allreduce. When a step fails (a dead or
hung peer, or the job's code raised) the loop reports it, destroys the group, waits for the next
view, re-forms, heals and yields the in-flight step again with the same indices. A newer view that
arrives while the group is healthy is agreed through the step's allreduce, so every rank leaves the
old group after the same step.

Trainer drives the steps and wires its parts: Generations (here: the views followed, the groups
formed and healed, their failures), Records (records.py), Replica (replica.py), Checkpoints
(checkpoints.py), Pace (pace.py) and Watched (watched.py).
"""

from __future__ import annotations

import gc
import math
import socket
import time
import traceback
from dataclasses import dataclass, replace
from typing import Generator, Iterator

import torch

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.checkpoints import Checkpoints
from dpeer.trainer.decisions import Failure, classify_failure, should_switch
from dpeer.trainer.exact import ExactStep
from dpeer.trainer.feed import InlineFeed, LoaderFeed
from dpeer.trainer.group import GroupError, GroupManager, GroupSeat, Superseded
from dpeer.trainer.heal import heal
from dpeer.trainer.job_api import Dataset, JobContext, TrainSpec, default_collate  # noqa: F401 (re-exported: jobs import them from here)
from dpeer.trainer.pace import Pace
from dpeer.trainer.records import Records
from dpeer.trainer.replica import Replica
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.step import Step, StepUsageError
from dpeer.trainer.stepping import FastStep, Reduction
from dpeer.trainer.viewsource import Assignment, ViewSource
from dpeer.trainer.watched import Watched


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


class Generations:
    """A trainer's groups, one per committed view that seats this node. newest: the newest
    generation a peek saw during this one; given_up: a generation left unformed (superseded), and
    when; idle_since: when the last usable view or group ended (the idle limit counts from it);
    paused: the last view was an operator's pause; torn: a step failed after its reduction, so this
    state is not any step's."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.newest = -1
        self.given_up: tuple[int, float] | None = None
        self.idle_since = 0.0
        self.paused = False
        self.torn: StateTorn | None = None

    def follow(self) -> Generator[Step, None, None]:
        """Yield the steps of each generation in turn until the run's last step is committed."""
        t = self.trainer
        self.idle_since = time.monotonic()
        while t.step < t.spec.steps:
            given = self._next_view()
            if given is None:
                continue
            t.records.settle_digest()  # a resume or a heal may write the parameters
            if t.checkpoints.behind(given):
                t.checkpoints.resume((given.checkpoint_step, given.checkpoint_digest))
            failure = yield from self._generation(given)
            self._end(given.view.generation, failure)

    def peek_newest(self) -> int:
        """The newest committed generation seen so far (a look without waiting)."""
        t = self.trainer
        seen = max(t.generation, self.newest)
        newer = t.source.wait_view(seen, 0.0)
        if newer is not None:
            self.newest = seen = newer.view.generation
        return seen

    def _next_view(self) -> Assignment | None:
        """The next committed view when it seats this node; None while none came (raising
        TimeoutError past the idle limit, a pause aside), or for a pause or a view without it."""
        t = self.trainer
        given = t.source.wait_view(t.generation, t.cfg.view_wait)
        self.newest = -1
        if given is None:
            self._report_stall()
            if time.monotonic() - self.idle_since > t.cfg.idle_limit and not self.paused:
                raise TimeoutError(f"no usable view for {t.cfg.idle_limit:.0f}s")
            return None
        view = given.view
        t.generation, self.given_up = view.generation, None
        was_paused, self.paused = self.paused, not view.members  # an operator's pause: wait, however long
        if self.paused or was_paused:
            self.idle_since = time.monotonic()  # the idle limit counts from the pause's end, not before it
        if self.paused:
            t.records.report_pause()
        return None if view.rank_of(t.node_id) is None else given

    def _report_stall(self) -> None:
        """A generation left unformed as superseded (a member gave up on it) that no newer view
        followed within the init timeout is a group failure, reported so the leader forms a new one:
        never a silent wait while the status says training."""
        t = self.trainer
        if self.given_up is None or time.monotonic() - self.given_up[1] < t.cfg.init_timeout:
            return
        (gen, _), self.given_up = self.given_up, None
        error = f"generation {gen} was given up before it formed and no newer view came in {t.cfg.init_timeout:g}s"
        t.source.report_failure(f"generation {gen} at step {t.step}: {error}", gen, phase="group",
                                step=t.step, error=error)

    def _generation(self, given: Assignment) -> Generator[Step, None, Failure | None]:
        """Form, heal and yield steps in the ``given`` view; returns the failure, or None (done or
        switching).

        Any exception ends the generation, not the worker: a collective's is transient (a peer
        died or hung), and one from the job's code is reported so the leader can tell a broken
        job (the same error at the same step again and again) from bad luck."""
        t, failure, view = self.trainer, None, given.view
        try:
            m = self._form(given)
            while t.step < t.spec.steps:
                step = t.begin_step(m)
                yield step
                if step.error is not None:
                    error, step.error = step.error, None  # the job's loop still holds the step
                    if step.reduced:
                        self.torn = StateTorn(
                            f"step {step.number} failed after its gradients were reduced ({type(error).__name__}: "
                            f"{error}): the job's code may have changed the model or optimizer already, so "
                            f"the worker restarts from the committed state instead of redoing the step")
                    raise error
                if step.reduction is None:
                    raise StepUsageError(f"step {step.number} was not run: run each step's body inside `with step:`")
                if t.commit_step(m, step.reduction):
                    t.records.event("switch", gen=view.generation, step=t.step)
                    return None
            torch.distributed.barrier()
        except Superseded:
            failure, self.given_up = None, (view.generation, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - every failure is reported; the job's own with its traceback
            failure = self._failed(exc, view.generation)
            traceback.clear_frames(exc.__traceback__)  # its frames hold the failed group's works (and its sockets)
        return failure

    def _form(self, given: Assignment) -> GroupSeat:
        """Form the group of ``given``'s view and heal this replica in it; the feed plans from here."""
        t, view = self.trainer, given.view
        t0 = time.monotonic()
        m = t.group.form(view, lambda: self.peek_newest() > view.generation, given.bind_host)
        t_formed = time.monotonic()
        t.group.set_timeout(t.cfg.init_timeout)
        vouched = t.replica.vouches(given.checkpoint_step, given.checkpoint_digest)
        with t.watched.healing(m):  # a donor stopped mid-heal is cut once a newer view drops it
            result = heal(m.rank, m.world, t.step, t.replica, device=t.group.device, key=m.heal_key,
                          vouched=vouched, session=t.replica.session,
                          committed=(given.checkpoint_step, given.checkpoint_digest))
        t.pace.restart()
        t.records.digest_next = True  # a replica that healed wrong differs from its first step on
        t.feed.replan(lambda s: t.stepper.keys(s, m.rank, m.world, m.shares))
        t.records.event(
            "formed", gen=view.generation, rank=m.rank, world=m.world, shares=list(m.shares), step=t.step,
            healed=result.received, heal_bytes=result.received_bytes, heal_resumed_bytes=result.resumed_bytes,
            seconds=time.monotonic() - t0,
            form_s=t_formed - t0, heal_s=result.seconds,
        )
        return m

    def _failed(self, exc: Exception, generation: int) -> Failure:
        """Classify and report a generation's failure (the job's own with its traceback, once)."""
        t = self.trainer
        t_caught = time.time()
        failure = classify_failure(exc, t.step, isinstance(exc, GroupError))
        cut = t.watched.take_cut(generation)
        if cut is not None:
            failure = replace(failure, error=f"cut after {cut[1]:.2f}s in the collective ({cut[2]}): "
                              f"{failure.error}"[:300])
        t.records.event("failed", gen=generation, step=t.step, caught_t=t_caught, format_s=time.time() - t_caught,
                        phase=failure.phase, error=failure.error, cut_after_s=cut[1] if cut else None)
        if failure.phase == "train":  # the job's code raised: its frames reach the daemon's log on stderr
            traceback.print_exception(exc)
        return failure

    def _end(self, generation: int, failure: Failure | None) -> None:
        """A generation ended: report its failure (the leader first: tearing the group down takes
        10-20 ms), destroy the group, and end the worker when the state is torn."""
        t = self.trainer
        if failure is not None:
            t.source.report_failure(f"generation {generation} at step {failure.step}: {failure.error}",
                                    generation, phase=failure.phase, step=failure.step, error=failure.error)
        t_destroy = time.monotonic()
        t.group.destroy()
        if failure is not None:
            t.records.event("destroyed", seconds=time.monotonic() - t_destroy)
        if self.torn is not None:
            raise self.torn
        self.idle_since = time.monotonic()


class Trainer:
    """Runs a job's steps on this node across however many group generations it takes. ``feed``: a
    script job's data loader (None: the spec's dataset and collate, fetched inline), whose loss is a
    mean over its micro-batch when ``mean_loss`` (a TrainSpec's loss_fn is already scaled to a sum).

    It holds what its parts read (spec, source, node_id, cfg, group, sampler, stepper, feed, step,
    generation, last_loss) and drives each step (begin_step, reduce, all_sum, commit_step: what a
    Step calls); its parts: records (ledger, events, progress, digests), replica (the state a heal
    and a checkpoint take), checkpoints, pace (step times, timeout), watched (the collective watch)
    and generations (views, groups, heals, failures)."""

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
        self.last_loss = float("nan")
        self.records = Records(self)
        self.replica = Replica(self, self.records.heal_progress)
        self.checkpoints = Checkpoints(self)
        self.pace = Pace(self)
        self.watched = Watched(self)  # its watch started by steps() for a Gloo group
        self.generations = Generations(self)
        collate = spec.collate or default_collate
        self.feed: InlineFeed | LoaderFeed = feed or InlineFeed(spec.dataset, collate)
        self._mean_loss = mean_loss
        if self.cfg.reduction is Reduction.EXACT:  # the worker calls exact.configure_process first
            probe = collate if feed is None else None  # a script's forward is its own: no probe
            self.stepper: ExactStep | FastStep = ExactStep(spec, self.params, self.sampler, self.group.device, probe)
        else:
            self.stepper = FastStep(spec, self.params, self.sampler, self.group.device)

    def peek_newest(self) -> int:
        """The newest committed generation seen so far (a look without waiting)."""
        return self.generations.peek_newest()

    def begin_step(self, m: GroupSeat) -> Step:
        """Plan the next step in the group ``m`` and record what this rank trains of it, before any of
        its sums can leave."""
        self.pace.begin()
        self.records.trained(self.stepper.plan(self.step, m.rank, m.world, m.shares), m)
        return Step(self, m, self.step, self._mean_loss)

    def reduce(self, m: GroupSeat) -> StepReduction | None:
        """Wait for the step's sums under the watch; None: the micro-batches run again (exact redo).
        Once the step is reduced, the digest hashed meanwhile is settled: the job's optimizer is
        about to write the parameters it hashes."""
        self.watched.arm(m)
        try:
            red = self.stepper.reduce(m.rank, m.world)
        finally:
            self.watched.disarm()
        if red is not None:
            self.records.settle_digest()
        return red

    def all_sum(self, m: GroupSeat, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group ``m`` in place, under the watch (step.evaluate's collective)."""
        self.watched.arm(m)
        try:
            torch.distributed.all_reduce(tensor)
        finally:
            self.watched.disarm()

    def commit_step(self, m: GroupSeat, red: StepReduction) -> bool:
        """The job ended a reduced step: count it, digest, record, report, checkpoint; True when the
        group agreed to switch to a newer view."""
        self.step += 1
        self.last_loss = red.loss_mean
        self.pace.end(self.step)
        digest = self.records.committed(m)
        self.checkpoints.write(digest)
        self.records.fold()
        return should_switch(m.generation, red.newest_seen_by_rank).switch

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
        hint = self.checkpoints.committed_hint()
        if hint[0] > 0:
            self.checkpoints.resume(hint)
        # Keep the collector off the step path: freeze what the imports and the build left (torch:
        # ~300k objects). Only the young generations are collected first; a full pass found nothing
        # to free here and costs 0.2 CPU-s before the worker can report ready.
        gc.collect(1)
        gc.freeze()
        started_at = self.step
        self.watched.start()
        try:
            yield from self.generations.follow()
            if started_at == self.step:  # resumed at the last step (a box back after the end)
                self.source.report_progress(self.step, self.sampler.cursor_after(self.step), math.nan,
                                            self.replica.digest())
        finally:
            self.records.settle_digest()
            self.records.digests.close()
            self.watched.close()
            self.stepper.close()
            self.feed.close()
            self.group.close()
            self.records.close()
