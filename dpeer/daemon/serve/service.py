"""The daemon's side of the Peer service: bulk reads from the store, and commands through the leader.

Commands that change the log (join, leave, kv put) and linearizable reads are served by the
leader; any other node forwards them there, so an operator can talk to whichever node is near.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import replace
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from dpeer.security import auth

from dpeer.transport import codec
from dpeer.channel.checkpoint_files import checkpoint_path
from dpeer.daemon.decide.checkpoints import Held, valid_digest
from dpeer.consensus import Refused, Role
from dpeer.consensus.voting import ChangeOp
from dpeer.errors import BadRequest, Behind, NotFound, PeerError, Unavailable, Unreachable
from dpeer.daemon.decide.failures import FailurePhase, FailureReport, one_line
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.backing import Backing
from dpeer.daemon.decide.sites import site_problem
from dpeer.daemon.decide.proposals import NOBODY, Answer, Claim, Holding, Verdict, claim_verdict
from dpeer.transport.api import PeerClient, Transport
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.statemachine.entry import MAX_KEY, MAX_VALUE
from dpeer.statemachine.payloads import (
    BadPayload, ControlChange, ControlMode, JobChange, KvDelete, KvPut, MemberJoined, MemberLeft, Payload,
)
from dpeer.statemachine.errors import Compacted
from dpeer.statemachine.state import JobState, MemberStatus
from dpeer.statemachine.meta import valid_uid

log = logging.getLogger("dpeer.service")
T = TypeVar("T")
CHUNK_BYTES = 1 << 20
CHECKPOINT_CHUNK = 1 << 20
COMMAND_TIMEOUT = 10.0
# A command forwarded to a leader that is gone (or not yet known) is tried again this often,
# re-reading who leads, until COMMAND_TIMEOUT: a leader change costs a retry, not an error.
FORWARD_RETRY = 0.1
MAX_STEP = 1 << 62
# How long the leader waits for a member record's address to say who answers there (a claim of its node id).
PROBE_TIMEOUT = 2.0
MAX_CLAIMS = 1024  # the claims whose last verdict was logged (so it is said once per change)
MAX_NEAR = 1024  # near peers one join may name


def _check_id(value: str, what: str) -> None:
    if not value or len(value) > 64 or not value.isprintable() or " " in value:
        raise BadRequest(f"{what} must be 1-64 printable characters without spaces")


def _check_site(request: pb.JoinRequest) -> None:
    """A join's site is empty or a configured site's name; its near peers are distinct other node ids."""
    problem = site_problem(request.site) if request.site else ""
    if problem:
        raise BadRequest(problem)
    if len(request.near) > MAX_NEAR:
        raise BadRequest(f"near names {len(request.near)} peers, more than {MAX_NEAR}")
    for peer in request.near:
        _check_id(peer, "a near peer")
    if len(set(request.near)) != len(request.near) or request.node_id in request.near:
        raise BadRequest("near must name distinct peers, not the joining node")


class Service:
    """Implements transport.server.PeerHandler over a Node."""

    def __init__(self, node: Node, transport: Transport, backing: Backing) -> None:
        """backing: what the service serves from the rest of the daemon (serve/backing.py)."""
        self.node = node
        self.transport = transport
        self.backing = backing
        self._claims: dict[tuple[str, str, str], Holding] = {}  # (node id, store uid, boot) -> last verdict here

    # -- peers ----------------------------------------------------------------------------
    def note_malformed(self, method: str) -> None:
        """The transport refused undecodable request bytes; count peer messages among them."""
        if method in ("Deliver", "Stream"):
            self.node.invalid_messages += 1

    async def deliver(self, envelope: pb.Envelope) -> None:
        """One protocol message; refused (and counted) when malformed."""
        try:
            self.node.deliver(envelope)
        except BadRequest:
            self.node.invalid_messages += 1  # the transport logs the refusal (once per peer per interval)
            raise

    async def fetch_entries(self, request: pb.FetchEntriesRequest) -> AsyncIterator[pb.EntryChunk]:
        """Committed entries [from_index, to_index] (to the commit index when 0), in chunks."""
        reads = self.node.reads
        if request.from_index < 1:
            raise BadRequest("from_index starts at 1")
        hi = reads.commit_index if request.to_index == 0 else min(request.to_index, reads.commit_index)
        lo = request.from_index
        while lo <= hi:
            try:
                batch = reads.entries(lo, hi + 1, max_bytes=CHUNK_BYTES)
            except Compacted:
                raise Behind(f"entries from {lo} are compacted here (first index {reads.first_index})") from None
            if not batch:
                return
            yield pb.EntryChunk(entries=[codec.entry_out(e) for e in batch], commit_index=reads.commit_index,
                                term=reads.current_term, uid=reads.uid, epoch=self.node.raft.epoch)
            lo = batch[-1].index + 1

    # -- commands through the leader -------------------------------------------------------
    def _leader_client(self) -> PeerClient:
        leader = self.node.leader_id
        addr = self.node.addrs.get(leader) if leader else None
        if addr is None or leader == self.node.id:
            raise Unavailable("no leader is known right now (election under way or no quorum); try again")
        # the caller this node authenticated travels along: the leader judges the command as theirs
        return self.transport.client(addr, timeout=COMMAND_TIMEOUT, on_behalf_of=auth.vouch(auth.CALLER.get()))

    def _leading(self) -> bool:
        return self.node.role is Role.LEADER

    async def _via_leader(self, here: Callable[[], Awaitable[T]], there: Callable[[PeerClient], Awaitable[T]]) -> T:
        """Run a command here when this node leads, else on the leader. While no leader is known,
        or the one known is unreachable (it just left or died), try again until COMMAND_TIMEOUT."""
        deadline = self.node.clock() + COMMAND_TIMEOUT
        while True:
            try:
                return await (here() if self._leading() else there(self._leader_client()))
            except (Unavailable, Unreachable):
                if self.node.clock() + FORWARD_RETRY >= deadline:
                    raise
            await asyncio.sleep(FORWARD_RETRY)

    async def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        """Admit a node: commit member_joined (idempotent) and answer with the members to gossip with."""
        _check_id(request.node_id, "node_id")
        try:
            codec.mm.MemberRecord(request.node_id, request.addr, codec.mm.MemberState.ALIVE, 0).validate()
        except codec.mm.InvalidMessage as exc:
            raise BadRequest(str(exc)) from None
        if request.store_port > 65535:
            raise BadRequest(f"store_port {request.store_port} is not a port")
        if not valid_uid(request.uid):
            raise BadRequest("uid must be the joining node's store uid, 32 lowercase hex digits")
        if not codec.valid_boot(request.boot):
            raise BadRequest(f"boot must be the joining daemon's boot, {codec.BOOT_DIGITS} lowercase hex digits")
        if not (math.isfinite(request.up) and 0 <= request.up <= codec.MAX_UP):
            raise BadRequest(f"up must be the joining daemon's age in seconds, 0 to {codec.MAX_UP:g}")
        _check_site(request)
        return await self._via_leader(
            lambda: self._admit(request),
            lambda c: c.join(request.node_id, request.addr, request.store_port, request.ready, request.uid,
                             request.boot, request.up, request.site, request.near))

    async def _admit(self, request: pb.JoinRequest) -> pb.JoinReply:
        """Commit the joining box's record unless it is current; every boot's first join is judged
        (views.claim_verdict), so a copy of a member's disk is told even when its record is current."""
        member = self.node.reads.state.members.get(request.node_id)
        wanted = (MemberStatus.ACTIVE, request.addr, request.store_port, request.ready, request.uid, request.site,
                  tuple(request.near))
        current = member is not None and (member.status, member.addr, member.store_port, member.ready,
                                          member.uid, member.site, member.near) == wanted
        if (not current or request.boot) and member is not None and member.uid:
            await self._judge_claim(request)
        if not current:
            record = _built(lambda: MemberJoined(request.node_id, request.addr, request.store_port, request.ready,
                                                 request.uid, request.site, tuple(request.near)))
            await self.node.commands.propose(record, COMMAND_TIMEOUT)
        records = [codec.record_out(r) for r in self.node.swim.members()]
        return pb.JoinReply(accepted=True, leader_id=self.node.id, leader_addr=self.node.addr, members=records)

    async def _judge_claim(self, request: pb.JoinRequest) -> None:
        """One live holder per node id and store (views.claim_verdict): BadRequest when another store
        or process holds the id and answers, Unavailable while its holder may still be alive (the join
        is tried again). Each verdict is logged once per change, not at every retry."""
        verdict = await self._verdict(request)
        key = (request.node_id, request.uid, request.boot)
        if self._claims.get(key) is not verdict.holding:
            log.log(logging.WARNING if verdict.holding is Holding.HELD else logging.INFO,
                    "a box at %s claims node id %s under store %s (boot %s): %s", request.addr, request.node_id,
                    request.uid[:8], request.boot[:8] or "unknown", verdict.reason)
        if verdict.holding is Holding.FREE:
            self._claims.pop(key, None)
            return
        if len(self._claims) >= MAX_CLAIMS:
            self._claims.clear()
        self._claims[key] = verdict.holding
        raise (BadRequest if verdict.holding is Holding.HELD else Unavailable)(verdict.reason)

    async def _verdict(self, request: pb.JoinRequest) -> Verdict:
        """The claim's verdict from what this node heard; when unsure, judged again with who answers
        at the record's address."""
        node, now = self.node, self.node.clock()
        up = request.up if request.boot else None
        node.sightings.saw(request.node_id, request.uid, request.addr, now, request.boot, up)  # a sign of life too
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

    async def leave(self, request: pb.LeaveRequest) -> pb.LeaveReply:
        """Leave gracefully: this node (node_id empty or ours) commits member_left and exits."""
        if request.forwarded:
            _check_id(request.node_id, "node_id")
            await self._via_leader(lambda: self._commit_leave(request.node_id),
                                   lambda c: c.leave(request.node_id, forwarded=True))
            return pb.LeaveReply(accepted=True)
        if request.node_id and request.node_id != self.node.id:
            raise BadRequest("a node can only be asked to leave itself; call the leaving node")
        await self.leave_cluster()
        return pb.LeaveReply(accepted=True)

    async def _commit_leave(self, node_id: str) -> None:
        """On the leader: commit member_left for node_id unless it is no longer active, then its
        removal from the configuration; neither while that removal would leave no live quorum."""
        await self._until_removable(node_id)
        if getattr(self.node.reads.state.members.get(node_id), "status", None) is MemberStatus.ACTIVE:
            await self.node.commands.propose(MemberLeft(node_id), COMMAND_TIMEOUT)
        await self._remove_from_configuration(node_id)

    async def _until_removable(self, node_id: str) -> None:
        """Wait (a leader just elected has not heard every voter yet) until removing node_id
        leaves a live quorum; Unavailable with the reason once COMMAND_TIMEOUT has passed."""
        async def refusal() -> str | None:
            return self.node.commands.removal_refusal(node_id)
        await self._retry(refusal, f"{node_id} cannot leave now")

    async def _remove_from_configuration(self, node_id: str) -> None:
        """A leaving node leaves the voters (or learners) before its daemon exits, so the voters
        that remain are a quorum on their own: a voter gone without its removal counts against
        every later commit, and the last two voters leaving in turn would stall the second."""
        async def remove() -> str | None:
            state = self.node.reads.state
            if node_id not in state.voters + state.learners or list(state.voters) == [node_id]:
                return None
            try:
                await self.node.commands.change_membership(ChangeOp.REMOVE, node_id, "", COMMAND_TIMEOUT)
            except BadRequest as exc:  # another change is in flight (the leader's chores): wait for it
                return str(exc)
            return None
        await self._retry(remove, f"could not remove {node_id} from the configuration")

    async def _retry(self, attempt: Callable[[], Awaitable[str | None]], failure: str) -> None:
        """Run attempt every FORWARD_RETRY until it returns None (done); Unavailable('failure: reason')
        when it still returns a reason once COMMAND_TIMEOUT has passed."""
        deadline = self.node.clock() + COMMAND_TIMEOUT
        while (why := await attempt()) is not None:
            if self.node.clock() + FORWARD_RETRY >= deadline:
                raise Unavailable(f"{failure}: {why}")
            await asyncio.sleep(FORWARD_RETRY)

    async def leave_cluster(self) -> None:
        """Commit member_left for this node (through the leader), then start the daemon's exit."""
        await self._via_leader(lambda: self._commit_leave(self.node.id),
                               lambda c: c.leave(self.node.id, forwarded=True))
        await self.backing.lifecycle.left()

    async def group_failed(self, request: pb.GroupFailedRequest) -> pb.GroupFailedReply:
        """Record that a group (or a job's build) failed: the leader re-forms the group under a new
        generation, or halts a job whose identical failure keeps coming back."""
        _check_id(request.node_id, "node_id")
        try:
            phase = FailurePhase(request.phase or FailurePhase.GROUP.value)
        except ValueError:
            raise BadRequest(f"phase must be one of {[p.value for p in FailurePhase]}") from None
        if request.step >= MAX_STEP:
            raise BadRequest(f"step must be below {MAX_STEP}")
        error = one_line(request.error or request.reason) or "unknown failure"
        attempt = request.attempt if phase is FailurePhase.BUILD else request.generation
        report = FailureReport(request.node_id, phase, request.step, error, attempt)

        async def here() -> pb.GroupFailedReply:
            self.backing.leader.group_failed(request.generation, report)
            return pb.GroupFailedReply()

        return await self._via_leader(here, lambda c: c.group_failed(request))

    async def report_checkpoint(self, request: pb.CheckpointReport) -> pb.CheckpointReply:
        """Note that a node holds a checkpoint; the leader records it once a majority does."""
        _check_id(request.node_id, "node_id")
        if not valid_digest(request.digest):
            raise BadRequest("digest must be a lowercase sha256 hex string of 64 characters")
        if not 0 < request.step < MAX_STEP:
            raise BadRequest(f"step must be in 1..{MAX_STEP - 1}")
        if getattr(self.node.reads.state.members.get(request.node_id), "status", None) is not MemberStatus.ACTIVE:
            raise BadRequest(f"{request.node_id!r} is not an active member of this cluster")
        held = Held(request.step, request.digest, request.final)

        async def here() -> pb.CheckpointReply:
            return pb.CheckpointReply(committed_step=self.backing.leader.checkpoint_reported(request.node_id, held))

        return await self._via_leader(
            here, lambda c: c.report_checkpoint(request.node_id, request.step, request.digest, request.final))

    async def force(self, request: pb.ForceRequest) -> pb.ForceReply:
        """Shrink the voters to the survivors named by an operator who lost a majority for good."""
        if not request.confirm:
            raise BadRequest("a forced reconfiguration needs confirm=true")
        voters = list(dict.fromkeys(request.voters))
        for voter in voters:
            _check_id(voter, "voter")
        if self.node.id not in voters:
            raise BadRequest("run force on one of the surviving voters and name it among --voters")
        result = self.node.commands.force(voters)
        if isinstance(result, Refused):
            raise BadRequest(f"force refused: {result.reason}")
        return pb.ForceReply(term=self.node.reads.current_term, epoch=self.node.raft.epoch,
                             reason=f"forced; campaigning under the new voters in cluster epoch {self.node.raft.epoch}")

    def node_id(self) -> str:
        """This node's id."""
        return self.node.id

    def may_forward(self, node_id: str) -> bool:
        """A member of the cluster (in the configuration, or an active member) may forward
        commands to us in the names of the callers it took them from."""
        state = self.node.reads.state
        member = state.members.get(node_id)
        return node_id in state.voters + state.learners or getattr(member, "status", None) is MemberStatus.ACTIVE

    async def status(self) -> pb.StatusReply:
        """The status document as JSON."""
        return pb.StatusReply(json=json.dumps(self.backing.status.status(), sort_keys=True))

    async def kv_put(self, request: pb.KvPutRequest) -> pb.KvPutReply:
        """Commit key=value; the reply comes once the entry is applied here (on the leader)."""
        if not request.key or len(request.key) > MAX_KEY or len(request.value) > MAX_VALUE:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters and values at most {MAX_VALUE} characters")

        async def here() -> pb.KvPutReply:
            entry, _ = await self.node.commands.propose(KvPut(request.key, request.value), COMMAND_TIMEOUT)
            return pb.KvPutReply(committed=True, index=entry.index, leader_id=self.node.id)

        return await self._via_leader(here, lambda c: c.kv_put(request.key, request.value))

    async def kv_get(self, request: pb.KvGetRequest) -> pb.KvGetReply:
        """A linearizable read (ReadIndex on the leader)."""
        if not request.key or len(request.key) > MAX_KEY:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters")

        async def here() -> pb.KvGetReply:
            index = await self.node.commands.read_barrier(COMMAND_TIMEOUT)
            value = self.node.reads.state.kv.get(request.key)
            if value is None:
                return pb.KvGetReply(found=False, read_index=index)
            return pb.KvGetReply(found=True, value=value, read_index=index)

        return await self._via_leader(here, lambda c: c.kv_get(request.key))

    async def kv_delete(self, request: pb.KvDeleteRequest) -> pb.KvDeleteReply:
        """Commit the key's removal; found is false (nothing changed) when it was not set."""
        if not request.key or len(request.key) > MAX_KEY:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters")

        async def here() -> pb.KvDeleteReply:
            entry, result = await self.node.commands.propose(KvDelete(request.key), COMMAND_TIMEOUT)
            return pb.KvDeleteReply(committed=True, index=entry.index, leader_id=self.node.id,
                                    found=result.accepted, reason=result.reason)

        return await self._via_leader(here, lambda c: c.kv_delete(request.key))

    async def kv_list(self, request: pb.KvListRequest) -> pb.KvListReply:
        """A linearizable read of every key under the prefix, sorted."""
        if len(request.prefix) > MAX_KEY:
            raise BadRequest(f"a prefix is at most {MAX_KEY} characters")

        async def here() -> pb.KvListReply:
            index = await self.node.commands.read_barrier(COMMAND_TIMEOUT)
            kv = self.node.reads.state.kv
            pairs = [pb.KvPair(key=k, value=kv[k]) for k in sorted(kv) if k.startswith(request.prefix)]
            return pb.KvListReply(pairs=pairs, read_index=index)

        return await self._via_leader(here, lambda c: c.kv_list(request.prefix))

    async def job_control(self, request: pb.JobControlRequest) -> pb.JobControlReply:
        """`retry`: commit the job as running again after the leader halted it as failed; `pause`:
        every worker stops at one step boundary and waits, holding its state; `resume`: train on."""
        modes = {"pause": ControlMode.PAUSED, "resume": ControlMode.RUNNING}
        if request.action != "retry" and request.action not in modes:
            raise BadRequest("the job action must be one of retry, pause, resume")

        async def here() -> pb.JobControlReply:
            if request.action == "retry":
                return await self._retry_job()
            return await self._control(modes[request.action])

        return await self._via_leader(here, lambda c: c.job_control(request.action))

    def _no_job(self, action: str) -> pb.JobControlReply | None:
        """A refusal when no member runs a job's worker: this leader runs none, and no member's
        record carries the store port a job's worker binds."""
        state = self.node.reads.state
        if (state.job.state is JobState.RUNNING and self.backing.status.status().get("job") is None
                and not any(m.store_port for m in state.members.values())):
            return pb.JobControlReply(accepted=False, reason=f"there is no job to {action}: no member of this "
                                      "cluster runs a job's worker (nodes run one with --job)")
        return None

    async def _retry_job(self) -> pb.JobControlReply:
        """Commit a failed job as running again."""
        job = self.node.reads.state.job
        if (refused := self._no_job("retry")) is not None:
            return refused
        if job.state is not JobState.FAILED:
            return pb.JobControlReply(accepted=False, reason=f"the job is {job.state.value}, not failed")
        entry, result = await self.node.commands.propose(JobChange(JobState.RUNNING), COMMAND_TIMEOUT)
        if not result.accepted:
            return pb.JobControlReply(accepted=False, reason=result.reason, index=entry.index)
        log.warning("the job was retried by an operator after: %s", job.error)
        return pb.JobControlReply(accepted=True, reason=f"retrying after: {job.error}", index=entry.index)

    async def _control(self, mode: ControlMode) -> pb.JobControlReply:
        """Commit a pause or a resume; the leader's next view ends the group or forms it again."""
        state, pausing = self.node.reads.state, mode is ControlMode.PAUSED
        if (refused := self._no_job("pause" if pausing else "resume")) is not None:
            return refused
        if state.control is mode:
            return pb.JobControlReply(accepted=False, reason=f"training is already {mode.value}")
        if pausing and state.job.state is not JobState.RUNNING:
            return pb.JobControlReply(accepted=False, reason=f"the job is {state.job.state.value}: nothing trains")
        entry, result = await self.node.commands.propose(ControlChange(mode), COMMAND_TIMEOUT)
        if not result.accepted:
            return pb.JobControlReply(accepted=False, reason=result.reason, index=entry.index)
        self.node.timers.poke()
        self.node.timers.chores_now()  # the leader's next view (empty, or the group again) is due now
        log.warning("training was %s by an operator", "paused" if pausing else "resumed")
        reason = ("training is paused: every worker stops at its next step and holds its state until "
                  "`dpeer job resume`" if pausing else "training resumes from the step it paused at")
        return pb.JobControlReply(accepted=True, reason=reason, index=entry.index)

    async def fetch_checkpoint(self, request: pb.FetchCheckpointRequest) -> AsyncIterator[pb.CheckpointChunk]:
        """A checkpoint file this node holds, in chunks (a box that returns after the job ended
        takes the final state from a holder instead of training alone)."""
        if not 0 < request.step < MAX_STEP:
            raise BadRequest(f"step must be in 1..{MAX_STEP - 1}")
        path = checkpoint_path(str(self.backing.checkpoint_dir), request.step)
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if request.offset > size:
                    raise BadRequest(f"offset {request.offset} is past the checkpoint's {size} bytes")
                f.seek(request.offset)
                offset = request.offset
                while True:
                    data = f.read(CHECKPOINT_CHUNK)
                    done = offset + len(data) >= size
                    yield pb.CheckpointChunk(step=request.step, offset=offset, data=data, total_size=size, done=done)
                    offset += len(data)
                    if done:
                        return
        except FileNotFoundError:
            raise NotFound(f"this node holds no checkpoint of step {request.step}") from None


def _built(build: Callable[[], Payload]) -> Payload:
    """The payload a caller's fields make; BadRequest (naming the field) when they make none."""
    try:
        return build()
    except BadPayload as exc:
        raise BadRequest(str(exc)) from None
