"""Leader-side decisions on membership, voters and training views, as pure table-tested functions.

Each function takes the applied ClusterState plus what the leader observes now (gossip states,
times) and returns what to propose and why, in the manner of TorchFT's quorum decisions. The
leader proposes at most one of them at a time; the log's rules make each change take effect
in the same order everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Collection, Mapping, Sequence, Union

from dpeer.address import Address
from dpeer.consensus.voting import ChangeOp
from dpeer.daemon.decide.sightings import Sightings, Windows, copy_of, held_by_another
from dpeer.daemon.decide.speeds import RESHARE_EVERY, plan_shares, worth_resharing
from dpeer.membership import MemberState
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.payloads import ControlMode, MemberDead, MemberJoined, MemberLeft, Payload, ViewChange
from dpeer.statemachine.state import ClusterState, JobState, Member, MemberStatus
from dpeer.view import View


_AWAY = (MemberState.SUSPECT, MemberState.DEAD)


@dataclass(frozen=True)
class Observed:
    """What gossip says of one node right now."""

    state: MemberState
    addr: str
    since: float  # when it entered that state (leader's clock)


@dataclass(frozen=True)
class MembershipChange:
    """One single-server change of the voting configuration, for the Raft core to turn into its
    config_change entry (the uid: the store identity of a node being added)."""

    KIND: ClassVar[EntryKind] = EntryKind.CONFIG_CHANGE
    op: ChangeOp
    node: str
    uid: str = ""


Proposal = Union[Payload, MembershipChange]


@dataclass(frozen=True)
class Decision:
    """What to propose (a typed entry payload or a membership change), or nothing; always with the reason."""

    proposal: Proposal | None
    reason: str

    @property
    def propose(self) -> bool:
        """True when there is an entry to propose."""
        return self.proposal is not None

    @property
    def kind(self) -> EntryKind | None:
        """The kind of entry the proposal becomes, None when there is none."""
        return None if self.proposal is None else self.proposal.KIND


def _none(reason: str) -> Decision:
    return Decision(None, reason)


def reconcile_members(state: ClusterState, observed: Mapping[str, Observed]) -> Decision:
    """The first member whose committed status disagrees with gossip: dead, left or back alive."""
    for node_id in sorted(observed):
        seen = observed[node_id]
        member = state.members.get(node_id)
        status = member.status if member is not None else None
        if seen.state is MemberState.DEAD and status is MemberStatus.ACTIVE:
            return Decision(MemberDead(node_id), f"{node_id} is dead by gossip")
        if seen.state is MemberState.LEFT and status is MemberStatus.ACTIVE:
            return Decision(MemberLeft(node_id), f"{node_id} left")
        if seen.state is MemberState.ALIVE and member is not None and status is MemberStatus.DEAD:
            return Decision(_back_alive(node_id, seen.addr, member),
                            f"{node_id} is alive again")
    return _none("committed member statuses match gossip")


def _back_alive(node_id: str, addr: str, member: Member) -> MemberJoined:
    """The record of a member gossip sees alive again: its store port and store identity kept,
    and not ready, since the box may have restarted and its worker may not have built the job
    yet (its daemon updates the record once it has). A record marked ready here would put a
    box without a worker in the next view, and the whole group would wait on it."""
    return MemberJoined(node_id, addr, member.store_port, False, member.uid, member.site, member.near,
                        member.speed_class)


class Holding(StrEnum):
    """Whether a node id that a box claims under its store uid (and boot) is free for it."""

    FREE = "free"  # no other store or process holds it, or its holder is gone: admit the claim
    HELD = "held"  # its holder answered after the claimant appeared: two boxes under one id, refuse
    UNSURE = "unsure"  # its holder answered lately, not since: ask who answers at its address, else wait


@dataclass(frozen=True)
class Answer:
    """Who answered when the leader asked the claimed record's address for its status: node id,
    store uid, boot and when that boot started (leader's clock); node_id "" when nothing listens there."""

    node_id: str
    uid: str = ""
    boot: str = ""
    started: float = 0.0


NOBODY = Answer("")


@dataclass(frozen=True)
class Claim:
    """A box asking to hold a node id: its store uid, the address it serves at, its daemon's boot
    ("" from an older peer), and who answers at the committed record's address (None: not asked,
    or no answer in time)."""

    node_id: str
    uid: str
    addr: str
    boot: str = ""
    answer: Answer | None = None


@dataclass(frozen=True)
class Verdict:
    """A claim's holding and why (for a HELD claim, the sentence its box is refused with)."""

    holding: Holding
    reason: str


def claim_verdict(state: ClusterState, claim: Claim, heard: Sightings, windows: Windows, now: float) -> Verdict:
    """Whether a box may hold claim.node_id: against a committed record under another store
    (_another_store), or under its own store against another process of it (_another_boot)."""
    record = state.members.get(claim.node_id)
    if record is None or record.uid == "":
        return Verdict(Holding.FREE, f"no other store holds node id {claim.node_id}")
    window = windows.voter if claim.node_id in state.voters else windows.other
    if record.uid != claim.uid:
        return _another_store(record, claim, heard, window, now)
    return _another_boot(record, claim, heard, window, now)


def _another_store(record: Member, claim: Claim, heard: Sightings, window: float, now: float) -> Verdict:
    """Another store holds the id while its record (not left) names another uid. That holder is
    gone once gossip held the id dead after it was last heard; it is live (refused) when it is
    this node, when heard after the claimant first appeared and within its window, or when it
    answers at its address. It is gone too when the claimant's store answers there (one process
    per address: asked, not taken from what the claimant says of itself), or once it went unheard
    for its window. Else unsure (nothing listening there may be the holder between two starts)."""
    node_id, old = claim.node_id, record.uid[:8]
    if record.status is MemberStatus.LEFT:
        return Verdict(Holding.FREE, f"store {old} of {node_id} left the cluster")
    holder, claimant = heard.seen(node_id, record.uid), heard.seen(node_id, claim.uid)
    last = holder.last if holder is not None else heard.since  # never heard: silent since we listen
    silent, dead = now - last, heard.dead_at(node_id)
    if node_id != heard.owner and dead is not None and dead >= last:
        return Verdict(Holding.FREE, f"gossip held {node_id} dead after its store {old} was last heard")
    appeared, answer = claimant.first if claimant is not None else now, claim.answer
    if (node_id == heard.owner or (holder is not None and holder.last > appeared and silent <= window)
            or (answer is not None and (answer.node_id, answer.uid) == (node_id, record.uid))):
        return Verdict(Holding.HELD, f"node id {node_id} is held by a live member at {record.addr} (store {old}); "
                       "give this box another --node-id, or stop that one and wait until gossip holds it dead")
    if answer is not None and (answer.node_id, answer.uid) == (node_id, claim.uid):
        return Verdict(Holding.FREE, f"this box's store answers at {record.addr}, where store {old} of {node_id} "
                       "served: it was last heard before this box appeared")
    if silent > window:
        return Verdict(Holding.FREE, f"store {old} of {node_id} has not been heard for {silent:.1f}s")
    return Verdict(Holding.UNSURE, f"node id {node_id} is held by the member at {record.addr} (store {old}), heard "
                   f"{silent:.1f}s ago: the join waits until that member answers again (then it is refused) or "
                   "is held dead")


def _another_boot(record: Member, claim: Claim, heard: Sightings, window: float, now: float) -> Verdict:
    """The claimant's own store holds the id: refused when another process of that store, started
    before the claimant, was heard since the claimant started (a copied disk), or answers at the
    record's address. Free when none other was heard within the window by a node that has listened
    that long, or when no older process (the claimant itself, a newer one, or nothing) answers at
    the address: the process started first keeps the id, as every node judges. Else unsure."""
    node_id, answer = claim.node_id, claim.answer
    if not claim.boot:
        return Verdict(Holding.FREE, f"no other store holds node id {node_id}")
    copy = copy_of(heard, node_id, claim.uid, claim.boot, window, now)
    if copy is not None:
        return Verdict(Holding.HELD, copy.sentence())
    mine = heard.boots(node_id, claim.uid).get(claim.boot)
    started = mine.started if mine is not None else now
    ours = answer is not None and (answer.node_id, answer.uid) == (node_id, claim.uid)
    if ours and answer.boot != claim.boot and answer.started < started:
        return Verdict(Holding.HELD, held_by_another(node_id, claim.uid, record.addr, answer.boot or "unknown"))
    others = [b for b, h in heard.boots(node_id, claim.uid).items() if b != claim.boot and now - h.last <= window]
    if not others and now - heard.since > window:
        return Verdict(Holding.FREE, f"no other process of node id {node_id} and its store was heard for {window:g}s")
    if ours or answer == NOBODY:
        return Verdict(Holding.FREE, f"no older process of node id {node_id} and its store answers at {record.addr}")
    return Verdict(Holding.UNSURE, f"another process of node id {node_id} and its store was heard lately and "
                   f"{record.addr} did not answer: the join waits until it is told whether that one is still alive")


def reclaim_seat(state: ClusterState, observed: Mapping[str, Observed], heard: Sightings, windows: Windows,
                 now: float) -> Decision:
    """A configured node id whose configured store went unheard for its window while one box
    answers under it with another store (the rightful box once a duplicate that took its seat is
    gone; a box back on a new disk that has not announced itself): commit that box's record, so
    plan_voters swaps the seat (removal, then back as a learner). Its store port and readiness
    follow from its own update once it holds the seat."""
    for node_id in list(state.voters) + list(state.learners):
        record, configured = state.members.get(node_id), state.uids.get(node_id)
        if node_id == heard.owner or record is None or record.uid != configured or not _alive(observed, node_id):
            continue
        holder = heard.seen(node_id, configured)
        silent = now - (holder.last if holder is not None else heard.since)
        if silent <= (windows.voter if node_id in state.voters else windows.other):
            continue
        live = [(u, s) for u, s in heard.uids(node_id).items() if u != configured and now - s.last <= windows.voter]
        if len(live) == 1 and _valid_addr(live[0][1].addr):
            uid, seen = live[0]
            return Decision(MemberJoined(node_id, seen.addr, 0, False, uid),
                            f"{node_id} answers at {seen.addr} under store {uid[:8]} while its configured store "
                            f"{str(configured)[:8]} has not been heard for {silent:.1f}s: the seat goes to the live "
                            "store")
    return _none("every configured node id is answered by its configured store, or by no other")


def _valid_addr(addr: str) -> bool:
    try:
        Address.parse(addr)
    except ValueError:
        return False
    return True


def plan_voters(
    state: ClusterState, observed: Mapping[str, Observed], now: float, grace: float, max_voters: int
) -> Decision:
    """One single-server configuration change (a MembershipChange): drop a leaver, drop a
    member whose box came back on a new disk (its committed member record names another store uid
    than the configuration: as etcd does for a member that lost its data, the old identity goes
    and the new one joins as a learner next; a record changes its uid only once its old holder is
    judged gone, by claim_verdict or reclaim_seat), admit a newcomer as a learner, promote a healthy
    learner below the voter cap, or demote a voter dead past `grace` when a healthy learner can
    take its place (so a quorum of live voters remains)."""
    voters, learners = list(state.voters), list(state.learners)
    status = {n: m.status for n, m in state.members.items()}
    gone = [n for n in voters + learners if status.get(n) is MemberStatus.LEFT and voters != [n]]
    if gone:
        return _change(ChangeOp.REMOVE, gone[0], f"{gone[0]} left the cluster")
    for n in voters + learners:
        member, old = state.members.get(n), state.uids.get(n)
        if member is not None and old is not None and member.uid not in ("", old) and voters != [n]:
            return _change(ChangeOp.REMOVE, n, f"{n} came back on a new disk (store {member.uid[:8]}, the configuration "
                           f"names {str(old)[:8]}): its old identity is removed, the new one joins as a learner")
    newcomers = sorted(n for n, s in status.items() if s is MemberStatus.ACTIVE and n not in voters + learners)
    if newcomers:
        uid = state.members[newcomers[0]].uid
        return _change(ChangeOp.ADD_LEARNER, newcomers[0], f"{newcomers[0]} joins as a learner", uid)
    healthy = [x for x in learners if _alive(observed, x) and status.get(x) is MemberStatus.ACTIVE]
    if healthy and len(voters) < max_voters:
        return _change(ChangeOp.PROMOTE, healthy[0], f"promote {healthy[0]}: {len(voters)} voters of at most {max_voters}")
    long_dead = [v for v in voters if _dead_for(observed, v, now) >= grace]
    if long_dead and healthy and len(voters) > 1:
        return _change(ChangeOp.REMOVE, long_dead[0],
                       f"voter {long_dead[0]} dead past {grace:g}s; {healthy[0]} will replace it")
    return _none("voting configuration is as wanted")


def _change(op: ChangeOp, node: str, reason: str, uid: str = "") -> Decision:
    return Decision(MembershipChange(op, node, uid), reason)


def _alive(observed: Mapping[str, Observed], node_id: str) -> bool:
    seen = observed.get(node_id)
    return seen is not None and seen.state is MemberState.ALIVE


def _dead_for(observed: Mapping[str, Observed], node_id: str, now: float) -> float:
    seen = observed.get(node_id)
    return now - seen.since if seen is not None and seen.state is MemberState.DEAD else -1.0


@dataclass(frozen=True)
class Tolerance:
    """How many voter failures the cluster survives now: the voters, those that answer the leader
    under the store uid the configuration names, and the others (unheld: dead, or held by no live box)."""

    voters: int
    live_voters: int
    can_lose: int
    unheld: tuple[str, ...]


def fault_tolerance(voters: Sequence[str], answering: Collection[str]) -> Tolerance:
    """The tolerance of `voters` of which `answering` answer: live voters beyond a quorum (0 at or below one)."""
    live = [v for v in voters if v in answering]
    quorum = len(voters) // 2 + 1
    return Tolerance(len(voters), len(live), max(0, len(live) - quorum),
                     tuple(sorted(v for v in voters if v not in answering)))


@dataclass(frozen=True)
class Wanted:
    """Who should train next, in rank order, and why anyone was kept, dropped or left out."""

    members: list[str]
    reason: str


def training_members(state: ClusterState, observed: Mapping[str, Observed], failed_generation: int = 0) -> Wanted:
    """Who should train: active members whose worker is ready and that gossip does not hold dead.

    A worker is ready once it has built the job and waits for a view, so the survivors never
    wait on a newcomer's (or a restarted worker's) start-up. Hysteresis: a member of the current
    view that gossip only suspects stays, so a starved but live node does not flap in and out;
    once the current group reported itself failed (failed_generation), suspicion drops it.
    A newcomer must be seen alive.

    Survivors keep their relative rank order; newcomers follow, sorted, so ranks move as
    little as possible from one generation to the next.
    """
    current = list(state.view.members) if state.view is not None else []
    failed = _group_failed(state, failed_generation)
    newcomers = sorted(n for n, m in state.members.items() if m.status is MemberStatus.ACTIVE and n not in current)
    members: list[str] = []
    notes: list[str] = []
    for node_id in current + newcomers:
        fits, note = _fits(state, observed, node_id, node_id in current, failed)
        if fits:
            members.append(node_id)
        if note:
            notes.append(note)
    return Wanted(members, "; ".join(notes) or "every member is ready and seen alive")


def _fits(
    state: ClusterState, observed: Mapping[str, Observed], node_id: str, in_view: bool, failed: bool
) -> tuple[bool, str]:
    """Whether one node should train, with a note when that is not plain (empty otherwise)."""
    member = state.members.get(node_id)
    seen = observed.get(node_id)
    gossip = seen.state if seen is not None else None
    verb = "dropped" if in_view else "waits"
    if member is None or member.status is not MemberStatus.ACTIVE:
        return False, f"{node_id} dropped: {member.status if member is not None else 'not a member'}"
    if not member.ready:
        return False, f"{node_id} {verb}: its worker is not ready"
    if gossip is MemberState.ALIVE:
        return True, ""
    if gossip is MemberState.SUSPECT and in_view and not failed:
        return True, f"{node_id} kept while suspect: its group has not failed"
    if gossip is MemberState.SUSPECT and in_view:
        return False, f"{node_id} dropped: suspect and its group failed"
    return False, f"{node_id} {verb}: {gossip.value if gossip is not None else 'unknown to gossip'}"


def _group_failed(state: ClusterState, failed_generation: int) -> bool:
    return state.view is not None and failed_generation == state.view.generation


def change_began(before: list[str] | None, after: list[str], observed: Mapping[str, Observed], now: float) -> float:
    """When a change of the wanted members began, for decide_view's quiet window: the newest
    gossip change among members dropped because gossip suspects them or holds them dead (a
    suspect kept until its group failed has been still since then), else `now` (a newcomer, a
    readiness change, a leave, or a gossip time this leader never saw)."""
    if before is None or set(after) - set(before):
        return now
    times = []
    for node_id in set(before) - set(after):
        seen = observed.get(node_id)
        if seen is None or seen.state not in _AWAY or seen.since <= 0:
            return now
        times.append(seen.since)
    return min(now, max(times)) if times else now


def quiet_window(
    before: list[str] | None, after: list[str], observed: Mapping[str, Observed], group_failed: bool,
    quiet: float, confirmed: float,
) -> float:
    """How long the wanted members must hold still: `quiet`, or the shorter `confirmed` when the
    change only drops members that gossip suspects or holds dead and their group itself reported
    the failure (a collective's connection reset is evidence enough). `confirmed` still folds a
    burst of failures seen together (several boxes lost at once) into one view."""
    dropped = set(before or ()) - set(after)
    if not group_failed or not dropped or set(after) - set(before or ()):
        return quiet
    explained = all(observed.get(n) is not None and observed[n].state in _AWAY for n in dropped)
    return confirmed if explained else quiet


def decide_view(
    state: ClusterState, members: list[str], changed_at: float, now: float, quiet: float,
    store_port_of: Mapping[str, int], failed_generation: int = 0, sites: Mapping[str, str] | None = None,
    classes: Mapping[str, int | None] | None = None, shares_since: float = -math.inf, units: int | None = None,
) -> Decision:
    """Propose the next generation once the wanted members have held still for `quiet` seconds.

    Waiting for a short quiet window folds several failures into one view change. The store
    host is the new rank 0, which hosts the rendezvous store for the new group. A group that
    reported itself failed (failed_generation == current) gets a new generation even with the
    same members, so its workers can re-form. The view names each member's site from `sites`
    (None: it names none); a change of the members' sites alone is a new generation too, unless
    the current view names no sites (an older leader's: the next view names them). It gives each
    member a share of a step planned from `classes`, their speed classes (None: even shares); a
    change of the shares alone is a new generation too (the workers re-form in place), once the
    committed shares have stood RESHARE_EVERY seconds (since `shares_since`), so speeds that keep
    moving do not keep re-forming the group, and only where the new split of a step's `units`
    (speeds.worth_resharing; None: every change is worth it) makes the step faster.
    """
    current = state.view
    failed = _group_failed(state, failed_generation)
    if state.job.state is JobState.FAILED:
        return _none(f"the job failed ({state.job.error}); `dpeer job retry` once it is fixed")
    if state.job.state is JobState.FINISHED:
        return _none(f"the job finished at step {state.job.step}")
    if state.control is ControlMode.PAUSED:
        return _pause(current)
    if not members:
        return _none("no member is ready to train")
    placed = tuple(sites[m] for m in members) if sites is not None else ()
    moved = current is not None and bool(current.sites) and current.sites != placed
    shares, why = plan_shares([classes.get(m) for m in members]) if classes is not None else ((), "even shares")
    reshared = current is not None and current.shares != shares
    if current is not None and list(current.members) == members and not failed and not moved:
        if not reshared:
            return _none(f"generation {current.generation} already has these members")
        if now - shares_since < RESHARE_EVERY:
            return _none(f"the members' shares changed: they wait {RESHARE_EVERY - (now - shares_since):.1f}s more "
                         f"(a group re-forms for its shares alone at most every {RESHARE_EVERY:g}s)")
        if units is not None and classes is not None:
            worth, gain = worth_resharing(units, current.shares, shares, [classes.get(m) for m in members])
            if not worth:
                return _none(f"generation {current.generation} keeps its shares: {gain}")
            why += f"; {gain}"
    if now - changed_at < quiet:
        return _none(f"waiting {quiet - (now - changed_at):.3f}s more for changes to settle")
    rank0 = members[0]
    try:
        host = Address.parse(state.members[rank0].addr).host
    except ValueError as exc:  # a record no admission would take today (an older log): never crash the chores
        return _none(f"rank 0 ({rank0}) has no usable address: {exc}")
    generation = (current.generation if current is not None else 0) + 1
    view = ViewChange(generation, tuple(members), str(Address(host, store_port_of[rank0])), sites=placed,
                      shares=shares)
    same = current is not None and list(current.members) == members and not failed
    notes = [note for note, changed in ((", their sites changed", moved), (f", their shares changed ({why})", reshared))
             if same and changed]
    return Decision(view, f"generation {generation}: {len(members)} members" + "".join(notes))


def _pause(current: View | None) -> Decision:
    """While paused: end a training group with an empty view (its workers stop at one step
    boundary they agree on and wait, holding their state; with no group yet, the empty view tells
    the workers they are paused), else nothing until resumed."""
    if current is not None and not current.members:
        return _none("training is paused; `dpeer job resume` starts it again")
    generation = (current.generation if current is not None else 0) + 1
    return Decision(ViewChange(generation, (), ""),
                    f"generation {generation}: training is paused, so no member trains")
