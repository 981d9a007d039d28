"""The leader's chores: keep committed membership, voters and the training view in line with gossip.

Runs on every node every chore interval and acts only while the node leads, one proposal in
flight at a time, in priority order: admit itself, the next view once the wanted members have
held still for the quiet window (training waits on it; the wanted members already follow
gossip, so a dead member's committed status can come after), reconcile member statuses, adjust
voters, and last the newest checkpoint a majority of the group reported holding.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math

from dpeer.consensus import Role
from dpeer.daemon.decide.checkpoints import Held, decide_checkpoint, still_pending
from dpeer.errors import PeerError
from dpeer.ids import Ids
from dpeer.daemon.decide.failures import (
    REPEAT_LIMIT, FailurePhase, FailureReport, Streak, judge_build, judge_failure, reform_delay,
)
from dpeer.daemon.node.record_sync import Box
from dpeer.daemon.node.driver import Node
from dpeer.daemon.decide.sites import committed_sites
from dpeer.daemon.timing import LeaderTiming
from dpeer.daemon.decide.sightings import Windows
from dpeer.daemon.decide.proposals import (
    Decision, MembershipChange, Observed, Tolerance, change_began, decide_view, fault_tolerance, plan_voters, quiet_window,
    reclaim_seat, reconcile_members, training_members,
)
from dpeer.statemachine.payloads import JobChange, MemberJoined, Payload, ViewChange
from dpeer.statemachine.state import RUNNING_JOB, ClusterState, JobState, MemberStatus

log = logging.getLogger("dpeer.leader")

# The waits (quiet window, dead voter grace, failure grace) are the preset's or the config's
# timing.leader keys: daemon/timing.py LeaderTiming says what each one folds or waits for.
PROPOSAL_TIMEOUT = 5.0
RETRY_AFTER_FAILURE = 0.1
# A group failure more than this long after the previous one, or at a later step, starts the
# re-form backoff again: the job made progress in between.
PROGRESS_RESET = 30.0


class LeaderChores:
    """Callable chore; see the module docstring. Also the leader's intake of the boxes' failure
    and checkpoint reports (node/events.py LeaderIntake)."""

    def __init__(
        self, node: Node, timing: LeaderTiming, box: Box, repeat_limit: int = REPEAT_LIMIT,
        step_units: int | None = None,
    ) -> None:
        """box: this box as the leader's own member record should say it; step_units: the units a
        step's work is split in (TrainingConfig.step_units; None: a change of shares is always taken)."""
        self.node, self.box = node, box
        self.step_units = step_units
        self.quiet = timing.quiet_window
        self.confirmed_quiet = timing.confirmed_quiet
        self._before: list[str] | None = None
        self.grace = timing.dead_voter_grace
        self.failure_grace = timing.failure_grace
        self.failed_generation = 0
        self._failed_at = 0.0
        self.last_decision: Decision | None = None
        self._task: asyncio.Task | None = None
        self._wanted: list[str] | None = None
        self._changed_at = 0.0
        self._last_failure = ""
        self.checkpoints: dict[str, Held] = {}
        self._last_checkpoint_note = ""
        self.repeat_limit = repeat_limit
        self.streak = Streak()
        self.builds: dict[str, Streak] = {}  # each box's failed builds in a row (failures.judge_build)
        self._kept_out: dict[str, str] = {}
        self._halt: Decision | None = None
        self.failures_in_a_row = 0
        self._last_failure_step = -1
        self._job_seen = RUNNING_JOB
        self._led_since: float | None = None
        self._tolerance: Tolerance | None = None  # the last one judged while leading (None before)
        self._sites_note = ""  # the last sites' reason logged
        self._shares: tuple[tuple[int, ...], float] | None = None  # the committed shares, and since when (seen here)

    def __call__(self, now: float) -> None:
        """Decide and start at most one proposal while leading."""
        if self.node.role is not Role.LEADER:
            self._wanted = self._led_since = self._tolerance = self._shares = None
            return
        self._watch_tolerance(now)
        if self._task is not None and not self._task.done():
            return
        decision = self.decide(now)
        if decision is not None:
            self.last_decision = decision
            self._task = asyncio.get_running_loop().create_task(self._carry_out(decision))

    def decide(self, now: float) -> Decision | None:
        """The next entry this leader should propose, or None."""
        node, state = self.node, self.node.reads.state
        me = state.members.get(node.id)
        box = self.box
        wanted = (MemberStatus.ACTIVE, node.addr, box.store_port(), box.ready(), node.reads.uid, *box.site(),
                  box.speed_class())
        if ((me is None or (me.status, me.addr, me.store_port, me.ready, me.uid, me.site, me.near,
                            me.speed_class) != wanted)
                and not box.leaving):
            record = MemberJoined(node.id, node.addr, *wanted[2:])
            return Decision(record, "the leader's own membership record is out of date")
        if state.job != self._job_seen:  # halted, retried or finished: failures before it no longer count
            self._job_seen, self.streak, self._halt = state.job, Streak(), None
            self.builds, self._kept_out = {}, {}
        if self._halt is not None:
            return self._halt
        observed = node.observed()
        for decision in (
            self._view_decision(state, observed, now),
            reconcile_members(state, observed),
            reclaim_seat(state, observed, node.sightings, Windows.of(node.raft_config), now),
            plan_voters(state, observed, now, self.grace, node.raft_config.max_voters),
        ):
            if decision.propose:
                return decision
        return self._checkpoint_decision()

    def _watch_tolerance(self, now: float) -> None:
        """Say when the number of voter failures the cluster survives drops (a warning: a voter is
        dead, its seat names a store no live box holds, or two processes answer for it) or comes
        back; judged once this node has led for an election timeout, by when every live voter has
        answered it."""
        if self._led_since is None:
            self._led_since = now
        answering = self.node.answering_voters(now)
        if answering is None or now - self._led_since < self.node.raft_config.election_timeout_max:
            return
        voters = self.node.reads.state.voters
        tolerance, before = fault_tolerance(voters, answering), self._tolerance
        self._tolerance = tolerance
        previous = before.can_lose if before is not None else (len(voters) - 1) // 2  # taking office: vs. full
        if tolerance.can_lose < previous:
            log.warning("fault tolerance: the cluster survives %d more voter failure(s); %d of %d voters answer "
                        "under their configured store%s", tolerance.can_lose, tolerance.live_voters, tolerance.voters,
                        f", not {', '.join(tolerance.unheld)}" if tolerance.unheld else "")
        elif tolerance.can_lose > previous:
            log.info("fault tolerance: the cluster survives %d voter failure(s) again (%d of %d voters answer)",
                     tolerance.can_lose, tolerance.live_voters, tolerance.voters)

    def _view_decision(self, state: ClusterState, observed: dict[str, Observed], now: float) -> Decision:
        """The next view, from the wanted members and when they last changed. A new leader
        compares them with the committed view, so a member gossip dropped before the election
        does not wait out the quiet window again."""
        train = training_members(state, observed, self.failed_generation)
        members = train.members
        if members != self._wanted:
            if self._wanted is not None:
                log.info("training members now %s: %s", members, train.reason)
            before = self._wanted
            if before is None and state.view is not None:
                before = list(state.view.members)
            self._changed_at = change_began(before, members, observed, now)
            self._wanted, self._before = members, before
        ports = {n: state.members[n].store_port for n in members}
        delay = reform_delay(self.failures_in_a_row, self.failure_grace)
        failed = self.failed_generation if now - self._failed_at >= delay else 0
        reported = state.view is not None and self.failed_generation == state.view.generation
        quiet = quiet_window(self._before, members, observed, reported, self.quiet, self.confirmed_quiet)
        for due in (self._changed_at + quiet, self._failed_at + delay if self.failed_generation else now):
            if due > now:
                self.node.timers.chores_at(due)  # decide when the wait ends, not at the next periodic pass
        sites = committed_sites(state)
        if sites.reason != self._sites_note:
            log.info("sites: %s", sites.reason)
            self._sites_note = sites.reason
        committed = state.view.shares if state.view is not None else ()
        if self._shares is None or self._shares[0] != committed:
            # a new leader cannot know how long the committed shares stood and takes them as old: a
            # cluster's first split by speed need not wait RESHARE_EVERY, at the cost of one re-form
            # for the shares more than the hold allows per election
            self._shares = (committed, now if self._shares is not None else -math.inf)
        classes = {n: state.members[n].speed_class for n in members}
        return decide_view(state, members, self._changed_at, now, quiet, ports, failed, sites.of, classes,
                           self._shares[1], self.step_units)

    def checkpoint_reported(self, node_id: str, held: Held) -> int:
        """A node holds the checkpoint of `held.step`; returns the committed checkpoint's step."""
        committed = self.node.reads.state.checkpoint
        committed_step = committed.step if committed is not None else 0
        before = self.checkpoints.get(node_id)
        if held.step > committed_step and (before is None or held.step >= before.step):
            self.checkpoints[node_id] = held
        return committed_step

    def _checkpoint_decision(self) -> Decision | None:
        state = self.node.reads.state
        committed = state.checkpoint.step if state.checkpoint is not None else 0
        self.checkpoints = still_pending(self.checkpoints, committed)
        if not self.checkpoints:
            return None
        decision = decide_checkpoint(state, self.checkpoints)
        if not decision.propose and decision.reason != self._last_checkpoint_note:
            self._last_checkpoint_note = decision.reason
            if "diverged" in decision.reason:
                log.error("checkpoint reports disagree: %s", decision.reason)
        return decision if decision.propose else None

    def kept_out(self) -> dict[str, str]:
        """Boxes kept out of the group because their build failed `repeat_limit` times in a row and
        that have not built the job since (box -> the newest error); for the leader's status."""
        members = self.node.reads.state.members
        return {n: e for n, e in self._kept_out.items() if n not in members or not members[n].ready}

    def group_failed(self, generation: int, report: FailureReport) -> None:
        """A box reports its group of `generation` failed, or its job's build did: judge whether the
        job is broken (halt it) and re-form a failed current group, backing off while it keeps failing.
        A build that fails only on some boxes keeps those out of the group; the rest train on."""
        state = self.node.reads.state
        if report.phase is FailurePhase.BUILD:
            boxes = {n: m.ready for n, m in state.members.items() if m.status is not MemberStatus.LEFT}
            built = judge_build(self.builds, report, boxes, self.repeat_limit)
            self.builds, self._kept_out = dict(built.streaks), dict(built.kept_out)
            halt, reason = built.halt, built.reason
        else:
            verdict = judge_failure(self.streak, report, self.repeat_limit)
            self.streak, halt, reason = verdict.streak, verdict.halt, verdict.reason
        if halt and self._halt is None and state.job.state is JobState.RUNNING:
            log.error("halting the job: %s", reason)
            halted = JobChange(JobState.FAILED, reason, report.node, report.step)
            self._halt = Decision(halted, f"the job cannot train: {reason}")
            self.node.timers.poke()
            return
        if report.phase is not FailurePhase.GROUP and not halt:
            log.warning("the job failed: %s", reason)
        view = self.node.reads.state.view
        if report.phase is FailurePhase.BUILD or view is None or generation != view.generation:
            return
        if generation != self.failed_generation:
            now = self.node.clock()
            progressed = report.step > self._last_failure_step or now - self._failed_at > PROGRESS_RESET
            self.failures_in_a_row = 1 if progressed else self.failures_in_a_row + 1
            self._last_failure_step = report.step
            log.log(logging.INFO if report.phase is FailurePhase.GROUP else logging.WARNING,
                    "group of generation %d failed (%s: %s); re-forming in %.1fs", generation, report.node,
                    report.error, reform_delay(self.failures_in_a_row, self.failure_grace))
            self.failed_generation = generation
            self._failed_at = now
            self.node.timers.poke()
            self.node.timers.chores_now()  # the next view may be due now: not at the next chore tick

    async def _carry_out(self, decision: Decision) -> None:
        proposal = decision.proposal
        assert proposal is not None
        try:
            if isinstance(proposal, MembershipChange):
                await self.node.commands.change_membership(proposal.op, proposal.node, proposal.uid, PROPOSAL_TIMEOUT)
            else:
                await self.node.commands.propose(_with_secret(proposal, self.node.ids), PROPOSAL_TIMEOUT)
            log.info("committed %s: %s", proposal.KIND.value, decision.reason)
        except PeerError as exc:
            message = f"could not commit {proposal.KIND.value} ({decision.reason}): {exc}"
            if message != self._last_failure:
                log.warning("%s", message)
            self._last_failure = message
            await asyncio.sleep(RETRY_AFTER_FAILURE)
            self.node.timers.poke()


def _with_secret(proposal: Payload, ids: Ids) -> Payload:
    """The payload to propose; a view gets a fresh random secret, which only the cluster's members
    learn (through the log, over the authenticated control plane) and from which the group derives
    its rendezvous keys and heal key (trainer/group.py), so no outsider can take part."""
    if isinstance(proposal, ViewChange):
        return dataclasses.replace(proposal, secret=ids.token_hex(16))
    return proposal
