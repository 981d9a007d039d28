"""The member table and the rules that merge claims into it (memberlist's aliveNode /
suspectNode / deadNode): incarnations, Lifeguard suspicion timers, and the effects each change
queues for the daemon. A collaborator of core.Membership; claims about this node go to its Refuter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpeer.membership.effects import (
    Effect,
    HeartbeatObserved,
    SeenAlive,
    SeenDead,
    SeenLeft,
    SeenSuspect,
)
from dpeer.membership.messages import Datagram, Gossip, Heartbeat, MemberRecord, MemberState, Update
from dpeer.membership.table import LIVE, MemberRow, MemberTable, ProbeOrder
from dpeer.membership.suspicion import Suspicion, suspicion_timeout
from dpeer.membership.timers import Timer

if TYPE_CHECKING:
    from dpeer.membership.core import Membership

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


class Roster:
    """Every other known member. table: the rows (state, incarnation, suspicion, last version);
    order: the randomised round-robin the prober walks; effects: the changes and heartbeats
    queued since the daemon last drained them."""

    def __init__(self, node: Membership) -> None:
        self.node = node
        self.table = MemberTable()
        self.order = ProbeOrder(node.rng)
        self.effects: list[Effect] = []

    def drain_effects(self) -> list[Effect]:
        """Take the effects queued since the last call."""
        effects, self.effects = self.effects, []
        return effects

    def adopt(self, now: float, record: MemberRecord) -> None:
        """Start from a known member (bootstrap): no effect, no gossip, not yet in the probe order."""
        if record.node_id == self.node.node_id or self.table.get(record.node_id) is not None:
            return
        self.table.add(
            MemberRow(
                record.node_id, record.addr, record.state, record.incarnation, now,
                record.term, record.last_applied, record.commit_index,
            )
        )

    def update_about(self, member: MemberRow) -> Update:
        """What we believe of a member, as an update we originate."""
        return Update(member.state, member.node_id, member.addr, member.incarnation, self.node.node_id)

    def observe(self, now: float, hb: Heartbeat, out: list[Datagram]) -> None:
        """A sender's heartbeat: it is alive at its incarnation, at this version; a sender we
        suspect or declared dead is told so, to refute."""
        if hb.node_id == self.node.node_id:
            return
        member = self.table.get(hb.node_id)
        if member is None or hb.incarnation > member.incarnation:
            self.alive(now, hb.node_id, hb.addr, hb.incarnation)
            member = self.table.get(hb.node_id)
        if member is None or hb.incarnation < member.incarnation:
            return
        if member.state is SUSPECT or member.state is DEAD:
            out.append((hb.addr, Gossip(self.node.heartbeat(now), (self.update_about(member),))))
        member.term, member.last_applied, member.commit_index = hb.term, hb.last_applied, hb.commit_index
        self.effects.append(HeartbeatObserved(hb, now))

    def apply(self, now: float, update: Update, sender: str | None, out: list[Datagram]) -> None:
        """A piggybacked update, relayed by `sender`."""
        if update.state is ALIVE:
            self.alive(now, update.node_id, update.addr, update.incarnation)
        elif update.state is SUSPECT:
            self.suspect(now, update.node_id, update.incarnation, update.origin, update.refused, sender, out)
        else:
            self.dead(now, update.node_id, update.incarnation, update.origin, update.state is LEFT, sender, out)

    def merge(self, now: float, record: MemberRecord, origin: str, sender: str, out: list[Datagram]) -> None:
        """A push-pull record from `origin` at `sender`: its claim, then its newer version."""
        if record.state is ALIVE:
            self.alive(now, record.node_id, record.addr, record.incarnation)
        elif record.state is LEFT:
            self.dead(now, record.node_id, record.incarnation, record.node_id, True, sender, out)
        else:
            self.suspect(now, record.node_id, record.incarnation, origin, False, sender, out)
        member = self.table.get(record.node_id)
        if member is not None and member.incarnation == record.incarnation and record.last_applied > member.last_applied:
            member.term, member.last_applied, member.commit_index = record.term, record.last_applied, record.commit_index

    def alive(self, now: float, node_id: str, addr: str, incarnation: int) -> None:
        """An alive claim: a new member, or a known one at a higher incarnation (and maybe address)."""
        node = self.node
        if node_id == node.node_id:
            if incarnation > node.incarnation and not node.leaving:
                node.refuter.refute(now, incarnation, None, False, [])
            return
        member = self.table.get(node_id)
        if member is None:
            self._add(now, MemberRow(node_id, addr, ALIVE, incarnation, now))
            return
        if incarnation <= member.incarnation:
            return
        member.incarnation = incarnation
        member.suspicion = None
        if addr != member.addr:
            self.table.set_addr(member, addr)
        if member.state is not ALIVE:
            self.table.set_state(member, ALIVE, now)
            self.effects.append(SeenAlive(node_id, incarnation, addr))
        node.dissemination.push(self.update_about(member))

    def suspect(
        self,
        now: float,
        node_id: str,
        incarnation: int,
        origin: str,
        refused: bool,
        sender: str | None,
        out: list[Datagram],
    ) -> None:
        """A suspect claim from `origin` (`refused`: backed by a refused connection), relayed by
        `sender` (None: this node's own)."""
        node = self.node
        if node.refuter.about_me(now, node_id, incarnation, sender, refused, out):
            return
        member = self.table.get(node_id)
        if member is None or incarnation < member.incarnation or member.state not in LIVE:
            return
        here = refused and sender is None  # our own connection was refused (gossip, even an echo of ours, is not)
        if member.state is SUSPECT and member.suspicion is not None:
            self._confirm(now, member, origin, refused, here)
            return
        member.incarnation = incarnation
        self.table.set_state(member, SUSPECT, now)
        member.suspicion = self._new_suspicion(now, origin, refused)
        member.suspicion.refused_here = here
        node.timers.set(member.suspicion.deadline, Timer.SUSPICION, node_id)
        self.effects.append(SeenSuspect(node_id, incarnation, here))
        update = Update(SUSPECT, node_id, member.addr, incarnation, origin, refused)
        node.dissemination.push(update)
        if origin == node.node_id:
            # tell the suspect itself: a live one refutes at once (a reset can come from a live peer,
            # and the refused timer is too short to wait for gossip); a dead one refuses at no cost
            out.append((member.addr, Gossip(node.heartbeat(now), (update,))))

    def dead(
        self,
        now: float,
        node_id: str,
        incarnation: int,
        origin: str,
        left: bool,
        sender: str | None,
        out: list[Datagram],
    ) -> None:
        """A dead claim (or a left one, which nothing but a higher incarnation overrides)."""
        if self.node.refuter.about_me(now, node_id, incarnation, sender, False, out):
            return
        member = self.table.get(node_id)
        state = LEFT if left else DEAD
        if member is None or incarnation < member.incarnation or member.state is LEFT or member.state is state:
            return
        member.incarnation = incarnation
        member.suspicion = None
        self.table.set_state(member, state, now)
        effect = SeenLeft if left else SeenDead
        self.effects.append(effect(node_id, incarnation))
        self.node.dissemination.push(Update(state, node_id, member.addr, incarnation, origin))

    def suspicion_expired(self, now: float, node_id: str) -> None:
        """A suspicion timer fired: declare the member dead unless refuted or sped up since."""
        member = self.table.get(node_id)
        if member is None or member.suspicion is None or now < member.suspicion.deadline:
            return
        self.dead(now, node_id, member.incarnation, self.node.node_id, False, None, [])

    def _new_suspicion(self, now: float, origin: str, refused: bool) -> Suspicion:
        config = self.node.config
        if refused:
            timeout = config.refused_suspicion_timeout
            return Suspicion(origin, now, 0, timeout, timeout, True)
        n = self.node.num_live
        k = config.suspicion_confirmations if n - 2 >= config.suspicion_confirmations else 0
        low = suspicion_timeout(config.suspicion_mult, n, config.probe_interval)
        return Suspicion(origin, now, k, low, low * config.suspicion_max_timeout_mult, False)

    def _confirm(self, now: float, member: MemberRow, origin: str, refused: bool, here: bool) -> None:
        suspicion = member.suspicion
        assert suspicion is not None
        changed = suspicion.confirm(origin)
        if refused:
            changed = suspicion.expedite(now, self.node.config.refused_suspicion_timeout) or changed
        if here and not suspicion.refused_here:
            # our own refusal backs a suspicion gossip brought first: say so once (see SeenSuspect)
            suspicion.refused_here = True
            self.effects.append(SeenSuspect(member.node_id, member.incarnation, True))
        if changed:
            self.node.timers.set(suspicion.deadline, Timer.SUSPICION, member.node_id)
            self.node.dissemination.push(
                Update(SUSPECT, member.node_id, member.addr, member.incarnation, origin, refused)
            )

    def _add(self, now: float, member: MemberRow) -> None:
        self.table.add(member)
        self.order.insert(member.node_id)
        if member.state in LIVE:
            self.effects.append(SeenAlive(member.node_id, member.incarnation, member.addr))
            self.node.dissemination.push(self.update_about(member))
