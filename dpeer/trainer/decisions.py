"""Pure decisions of the training side, in the TorchFT manner: each takes plain values and returns
its answer together with a human-readable reason, so they are table-tested and logged as is."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping


@dataclass(frozen=True)
class HealPlan:
    """Who copies state from whom after a re-form; ``assignment`` maps each receiver rank to
    ``(donor_rank, first_chunk, end_chunk)`` ranges that together cover ``range(n_chunks)``."""

    max_step: int
    donors: list[int]
    receivers: list[int]
    assignment: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    reason: str = ""

    @property
    def needed(self) -> bool:
        """True when at least one rank must receive state."""
        return bool(self.receivers)


def pick_lineage(
    steps_by_rank: Mapping[int, int], digests: Mapping[int, str], vouched: Collection[int] = ()
) -> tuple[list[int], str]:
    """The ranks whose state every other rank copies: those at the highest step holding the winning
    parameter digest, and why it won.

    Ranks at the same step can hold different parameters (two lineages: a step that committed on
    some ranks only and was redone elsewhere, a replica restored from another checkpoint). Without
    a tie-break the heal's digest check fails, the leader re-forms the same members and the error
    repeats for ever. The winner, in order: the lineage that holds the committed checkpoint (a
    majority of the group vouched for it, and a full power loss resumes from it); else the lineage
    most of those ranks hold (fewest copies); else the one held by the lowest rank (survivors keep
    their old rank order, so it is the longest-standing member). Every rank computes the same
    answer from the same allgathered values."""
    max_step = max(steps_by_rank.values())
    holders: dict[str, list[int]] = {}
    for rank in sorted(r for r, s in steps_by_rank.items() if s == max_step):
        holders.setdefault(digests[rank], []).append(rank)
    if len(holders) == 1:
        return next(iter(holders.values())), "one lineage"

    def rank_of(digest: str) -> tuple[bool, int, int]:
        ranks = holders[digest]
        return (not any(r in vouched for r in ranks), -len(ranks), ranks[0])

    winner = min(holders, key=rank_of)
    ranks = holders[winner]
    if any(r in vouched for r in ranks):
        why = "it holds the committed checkpoint"
    elif len(ranks) > max(len(h) for d, h in holders.items() if d != winner):
        why = f"most ranks at the step hold it ({len(ranks)} of {sum(map(len, holders.values()))})"
    else:
        why = f"its lowest holder, rank {ranks[0]}, is the lowest rank"
    rivals = ", ".join(f"{d[:12]} on {h}" for d, h in sorted(holders.items()) if d != winner)
    return ranks, f"{len(holders)} lineages at step {max_step}: {winner[:12]} on {ranks} wins ({why}) over {rivals}"


def plan_heal(
    steps_by_rank: dict[int, int],
    n_chunks: int = 1,
    max_donors: int | None = None,
    digests: Mapping[int, str] | None = None,
    vouched: Collection[int] = (),
) -> HealPlan:
    """Ranks behind the highest step receive full state, its chunks spread over the ranks at it.

    With ``digests`` (every rank's parameter digest) ranks at the highest step that hold another
    lineage than the winner (see pick_lineage) receive too. Each receiver's chunks are split into
    contiguous ranges over the donors, the donor order being rotated per receiver so several
    receivers do not all start on the same donor.
    """
    if not steps_by_rank:
        raise ValueError("plan_heal needs at least one rank")
    if n_chunks <= 0:
        raise ValueError(f"n_chunks must be positive, got {n_chunks}")
    max_step = max(steps_by_rank.values())
    lineage = ""
    if digests is not None:
        donors, lineage = pick_lineage(steps_by_rank, digests, vouched)
    else:
        donors = sorted(r for r, s in steps_by_rank.items() if s == max_step)
    receivers = sorted(r for r in steps_by_rank if r not in donors)
    if not receivers:
        return HealPlan(max_step, donors, [], {}, f"all {len(donors)} ranks at step {max_step}; no heal")
    usable = donors[: max_donors] if max_donors else donors
    assignment: dict[int, list[tuple[int, int, int]]] = {}
    for i, recv in enumerate(receivers):
        k = min(len(usable), n_chunks)
        order = [usable[(i + j) % len(usable)] for j in range(k)]
        base, extra = divmod(n_chunks, k)
        ranges, start = [], 0
        for j, donor in enumerate(order):
            end = start + base + (1 if j < extra else 0)
            ranges.append((donor, start, end))
            start = end
        assignment[recv] = ranges
    behind = ", ".join(f"{r}@{steps_by_rank[r]}" for r in receivers)
    reason = (
        f"ranks {behind} behind or apart from max step {max_step}; {n_chunks} chunks each from "
        f"{min(len(usable), n_chunks)} of donors {donors}"
    ) + (f"; {lineage}" if lineage and lineage != "one lineage" else "")
    return HealPlan(max_step, donors, receivers, assignment, reason)


@dataclass(frozen=True)
class SwitchDecision:
    """Whether the group leaves its generation after the current step, and for which one."""

    switch: bool
    target: int
    reason: str


def should_switch(current_generation: int, newest_seen_by_rank: list[int]) -> SwitchDecision:
    """Every rank shares the newest committed generation it has seen (piggybacked on the step's
    allreduce); all ranks compute the same answer, so they leave the old group at the same step."""
    if not newest_seen_by_rank:
        return SwitchDecision(False, current_generation, "no ranks reported")
    newest = max(newest_seen_by_rank)
    if newest > current_generation:
        seers = [r for r, g in enumerate(newest_seen_by_rank) if g == newest]
        return SwitchDecision(True, newest, f"ranks {seers} saw generation {newest} > {current_generation}")
    return SwitchDecision(False, current_generation, f"generation {current_generation} is the newest seen")


JOIN_PATIENCE = 8  # a collective stuck this many patiences past a join's view is given up too


@dataclass(frozen=True)
class CutDecision:
    """Whether an overdue collective is given up (collective_watch), and why."""

    cut: bool
    reason: str


def should_cut(members: tuple[str, ...], newer_members: tuple[str, ...] | None, overdue: float = 0.0,
               patience: float = 0.0, drops_only: bool = False) -> CutDecision:
    """An overdue collective of a group of ``members`` is given up once a newer committed view
    drops one of them or re-forms the same members (their group failed): nobody will complete it.
    A newer view that only adds members is most often a planned switch, which the step's allreduce
    makes at a step boundary, so a collective slowed down (a newcomer's start-up taking the CPU)
    goes on; but a failed group re-formed with a newcomer looks the same, so past JOIN_PATIENCE
    times its patience such a collective is given up too. An empty newer view (training paused)
    is a planned switch as well. ``drops_only`` (a heal, which may rightly run long and ends before
    any switch): only a view that drops a member gives it up."""
    if newer_members is None:
        return CutDecision(False, "no newer view is committed")
    if drops_only:
        gone = sorted(set(members) - set(newer_members)) if newer_members else []
        if gone:
            return CutDecision(True, f"the newer view drops {', '.join(gone)}")
        return CutDecision(False, "the newer view drops no member: the heal goes on (a pause or a join waits for it)")
    far_overdue = overdue >= JOIN_PATIENCE * patience > 0
    if not newer_members and not far_overdue:
        return CutDecision(False, "the newer view pauses training: the step's allreduce ends the group")
    dropped = sorted(set(members) - set(newer_members))
    if dropped:
        return CutDecision(True, f"the newer view drops {', '.join(dropped)}")
    if set(newer_members) == set(members):
        return CutDecision(True, "the newer view re-forms the same members: their group failed")
    if far_overdue:
        return CutDecision(True, f"the newer view adds members and the collective is {overdue:.2f}s overdue")
    return CutDecision(False, "the newer view only adds members: a planned switch")


def collective_timeout(
    step_times: list[float],
    floor: float = 2.0,
    mult: float = 5.0,
    initial: float = 30.0,
    ceiling: float = 600.0,
    min_samples: int = 5,
    window: int = 200,
) -> tuple[float, str]:
    """Adaptive collective timeout: ``mult`` times the p99 of recent step times, within
    ``[floor, ceiling]``; ``initial`` until ``min_samples`` steps were measured."""
    recent = sorted(step_times[-window:])
    if len(recent) < min_samples:
        return initial, f"only {len(recent)} step times (< {min_samples}); initial {initial:.1f}s"
    p99 = recent[min(len(recent) - 1, math.ceil(0.99 * len(recent)) - 1)]
    raw = mult * p99
    seconds = min(ceiling, max(floor, raw))
    bound = "floor" if raw < floor else ("ceiling" if raw > ceiling else "scaled")
    return seconds, f"{mult:g} x p99 {p99 * 1e3:.1f}ms over {len(recent)} steps = {raw:.3f}s ({bound}) -> {seconds:.3f}s"


@dataclass(frozen=True)
class ResumePlan:
    """Local checkpoint steps a starting worker tries, in order; ``verify_step``'s file must also
    hold the committed parameter digest."""

    steps: list[int]
    verify_step: int
    reason: str


def plan_resume(local_steps: list[int], committed_step: int) -> ResumePlan:
    """Which local checkpoints a starting worker may load, newest first.

    With a committed checkpoint (step > 0) the worker resumes from it, or failing that from an
    older local one (peers at the committed step heal it forward); a local checkpoint newer than
    the committed one is never loaded: no majority of the group vouched for it, so after a
    full-cluster power loss the group resumes from the newest checkpoint a majority verified.
    Without one (a cluster that never recorded a checkpoint) the newest local one is tried first.
    """
    newest_first = sorted(set(local_steps), reverse=True)
    if committed_step <= 0:
        return ResumePlan(newest_first, 0, "no committed checkpoint: newest local first")
    newer = [s for s in newest_first if s > committed_step]
    usable = [s for s in newest_first if s <= committed_step]
    reason = f"committed checkpoint of step {committed_step}"
    if committed_step not in usable:
        reason += " is not on this disk; older local ones first, peers heal the rest"
    if newer:
        reason += f"; ignoring {len(newer)} newer local checkpoint(s) no majority recorded"
    return ResumePlan(usable, committed_step, reason)


@dataclass(frozen=True)
class Failure:
    """A failed generation as the worker reports it: where it came from, the step, one line."""

    phase: str  # a peer.failures.FailurePhase value: "group" or "train"
    step: int
    error: str


_COLLECTIVE_FRAMES = ("torch/distributed/", "dpeer/trainer/group.py")


def classify_failure(exc: BaseException, step: int, group_error: bool) -> Failure:
    """A collective or the group's formation failing (a dead, hung or late peer) is transient:
    "group". Anything raised outside a collective (the job's forward, loss or optimizer, or a bug
    in the runtime around them) is "train", a candidate for a broken job when it repeats. Told
    apart by where it was raised: a frame of torch.distributed or of the group code."""
    error = f"{type(exc).__name__}: {' '.join(str(exc).split())}".strip().rstrip(":")
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    collective = group_error or any(marker in f for f in frames for marker in _COLLECTIVE_FRAMES)
    return Failure("group" if collective else "train", step, error[:300])
