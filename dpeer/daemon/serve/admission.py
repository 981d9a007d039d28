"""Admitting a box into the cluster, on the leader: a join's fields checked, its member record
committed unless current, and every boot's first join judged (decide/proposals.py claim_verdict),
so one live box holds a node id and a copy of a member's disk is told to stop."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Callable

from dpeer.daemon.config import NODE_ID_RULE, valid_node_id
from dpeer.daemon.decide.proposals import NOBODY, Answer, Claim, Holding, Verdict, claim_verdict
from dpeer.daemon.decide.sites import MAX_NEAR, site_problem
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.forward import COMMAND_TIMEOUT
from dpeer.errors import BadRequest, PeerError, Unavailable, Unreachable
from dpeer.statemachine.payloads import (
    MAX_SPEED_CLASS, MIN_SPEED_CLASS, BadPayload, MemberJoined, Payload, valid_speed_class,
)
from dpeer.statemachine.state import MemberStatus
from dpeer.transport import calls
from dpeer.transport.api import Transport

log = logging.getLogger("dpeer.service")
# How long the leader waits for a member record's address to say who answers there (a claim of its node id).
PROBE_TIMEOUT = 2.0
MAX_CLAIMS = 1024  # the claims whose last verdict was logged (so it is said once per change)


def check_id(value: str, what: str) -> None:
    """BadRequest unless value is a node id (config.NODE_ID_RULE, what a box can be configured with:
    a measured site is named after one)."""
    if not valid_node_id(value):
        raise BadRequest(f"{what} must be a node id: {NODE_ID_RULE}")


def built(build: Callable[[], Payload]) -> Payload:
    """The payload a caller's fields make; BadRequest (naming the field) when they make none."""
    try:
        return build()
    except BadPayload as exc:
        raise BadRequest(str(exc)) from None


def check_site(request: calls.JoinRequest) -> None:
    """A join's site is empty or a configured site's name; its near peers are distinct other node ids."""
    problem = site_problem(request.site) if request.site else ""
    if problem:
        raise BadRequest(problem)
    if len(request.near) > MAX_NEAR:
        raise BadRequest(f"near names {len(request.near)} peers, more than {MAX_NEAR}")
    for peer in request.near:
        check_id(peer, "a near peer")
    if len(set(request.near)) != len(request.near) or request.node_id in request.near:
        raise BadRequest("near must name distinct peers, not the joining node")


def check_speed_class(request: calls.JoinRequest) -> None:
    """A join's speed class is unknown (unset) or within the records' range (decide/speeds.py)."""
    if not valid_speed_class(request.speed_class):
        raise BadRequest(f"speed_class {request.speed_class} is not a speed class: "
                         f"{MIN_SPEED_CLASS} to {MAX_SPEED_CLASS}, or unset while unknown")


class Admission:
    """The leader's side of a join; see the module docstring."""

    def __init__(self, node: Node, transport: Transport) -> None:
        self.node, self.transport = node, transport
        self._claims: dict[tuple[str, str, str], Holding] = {}  # (node id, store uid, boot) -> last verdict here

    async def admit(self, request: calls.JoinRequest) -> calls.JoinReply:
        """Commit the joining box's record unless it is current; every boot's first join is judged
        (views.claim_verdict), so a copy of a member's disk is told even when its record is current."""
        member = self.node.reads.state.members.get(request.node_id)
        wanted = (MemberStatus.ACTIVE, request.addr, request.store_port, request.ready, request.uid, request.site,
                  tuple(request.near), request.speed_class)
        current = member is not None and (member.status, member.addr, member.store_port, member.ready,
                                          member.uid, member.site, member.near, member.speed_class) == wanted
        if (not current or request.boot) and member is not None and member.uid:
            await self._judge_claim(request)
        if not current:
            record = built(lambda: MemberJoined(request.node_id, request.addr, request.store_port, request.ready,
                                                request.uid, request.site, tuple(request.near),
                                                request.speed_class))
            await self.node.commands.propose(record, COMMAND_TIMEOUT)
        records = tuple(self.node.swim.members())
        return calls.JoinReply(accepted=True, leader_id=self.node.id, leader_addr=self.node.addr, members=records)

    async def _judge_claim(self, request: calls.JoinRequest) -> None:
        """One live holder per node id and store (views.claim_verdict): BadRequest when another store
        or process holds the id and answers, Unavailable while its holder may still be alive (the join
        is tried again). Each verdict is logged once per change, not at every retry."""
        verdict = await self._verdict(request)
        key = (request.node_id, request.uid, request.boot)
        if self._claims.get(key) is not verdict.holding:
            log.log(logging.WARNING if verdict.holding is Holding.HELD else logging.INFO,
                    "a box at %s claims node id %s under store %s (boot %s): %s", request.addr, request.node_id,
                    request.uid[:8], request.boot[:8] or "unknown", verdict.reason)
        if len(self._claims) >= MAX_CLAIMS:
            self._claims.clear()
        self._claims[key] = verdict.holding
        if verdict.holding is Holding.FREE:
            return
        raise (BadRequest if verdict.holding is Holding.HELD else Unavailable)(verdict.reason)

    async def _verdict(self, request: calls.JoinRequest) -> Verdict:
        """The claim's verdict from what this node heard; when unsure, judged again with who answers
        at the record's address. The join itself is no sighting: a node that got it while no leader
        was known holds it and forwards it for up to COMMAND_TIMEOUT, so it may come from a process
        that died since (and whose restart would then read as a later copy of it, refused for good);
        only the claimant's own messages, and who answers at its address, tell that it lives."""
        node, now = self.node, self.node.clock()
        claim = Claim(request.node_id, request.uid, request.addr, request.boot)
        verdict = claim_verdict(node.reads.state, claim, node.sightings, node.windows, now)
        record = node.reads.state.members.get(request.node_id)
        if verdict.holding is not Holding.UNSURE or record is None or record.addr == node.addr:
            return verdict
        claim = replace(claim, answer=await self._who_answers(record.addr))
        return claim_verdict(node.reads.state, claim, node.sightings, node.windows, node.clock())

    async def _who_answers(self, addr: str) -> Answer | None:
        """Whose node id, store and boot answer at addr (its status), NOBODY when the connection
        is refused there, None when no answer came in PROBE_TIMEOUT or it made no sense."""
        try:
            doc = json.loads((await self.transport.client(addr, timeout=PROBE_TIMEOUT).status()).json)
        except Unreachable as exc:
            return NOBODY if exc.refused else None
        except (PeerError, ValueError):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("node_id"), str):
            return None
        up = doc.get("uptime_s")
        started = self.node.clock() - up if isinstance(up, (int, float)) else -math.inf  # unknown: the older
        return Answer(doc["node_id"], str(doc.get("uid", "")), str(doc.get("boot", "")), started)
