"""The daemon's side of the Peer service: bulk reads from the store, and commands through the leader.

Commands that change the log (join, leave, kv put) and linearizable reads are served by the
leader; any other node forwards them there (serve/forward.py), so an operator can talk to
whichever node is near. The leader's side of a join is serve/admission.py, of a leave
serve/leaves.py, of the job commands serve/job_control.py; what the service serves from the
rest of the daemon comes as one typed value (serve/backing.py).
"""

from __future__ import annotations

import json
import logging
import math
from typing import AsyncIterator

from dpeer.channel.checkpoint_files import checkpoint_path
from dpeer.consensus import Refused
from dpeer.daemon.decide.checkpoints import Held, valid_digest
from dpeer.daemon.decide.failures import FailurePhase, FailureReport, one_line
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.admission import Admission, check_id, check_site, check_speed_class
from dpeer.daemon.serve.backing import Backing
from dpeer.daemon.serve.forward import COMMAND_TIMEOUT, Forwarder
from dpeer.daemon.serve.job_control import JobControl
from dpeer.daemon.serve.leaves import Leaves
from dpeer.errors import BadRequest, Behind, NotFound
from dpeer.membership import InvalidMessage, MemberRecord, MemberState
from dpeer.statemachine.entry import MAX_KEY, MAX_VALUE
from dpeer.statemachine.errors import Compacted
from dpeer.statemachine.meta import valid_uid
from dpeer.statemachine.payloads import ControlMode, KvDelete, KvPut
from dpeer.statemachine.state import MemberStatus
from dpeer.transport import calls
from dpeer.transport.api import BOOT_DIGITS, MAX_UP, Envelope, Transport, valid_boot

log = logging.getLogger("dpeer.service")
CHUNK_BYTES = 1 << 20
CHECKPOINT_CHUNK = 1 << 20
MAX_STEP = 1 << 62


class Service:
    """Implements transport.server.PeerHandler over a Node."""

    def __init__(self, node: Node, transport: Transport, backing: Backing) -> None:
        """backing: what the service serves from the rest of the daemon (serve/backing.py)."""
        self.node = node
        self.transport = transport
        self.backing = backing
        self.forward = Forwarder(node, transport)
        self.admission = Admission(node, transport)
        self.leaves = Leaves(node, self.forward)
        self.jobs = JobControl(node, backing.status)

    # -- peers ----------------------------------------------------------------------------
    def note_malformed(self, method: str) -> None:
        """The transport refused undecodable request bytes or an invalid envelope; count peer messages among them."""
        if method in ("Deliver", "Stream"):
            self.node.invalid_messages += 1

    async def deliver(self, envelope: Envelope) -> None:
        """One protocol message; refused (and counted) when malformed."""
        try:
            self.node.deliver(envelope)
        except BadRequest:
            self.node.invalid_messages += 1  # the transport logs the refusal (once per peer per interval)
            raise

    async def fetch_entries(self, request: calls.FetchEntriesRequest) -> AsyncIterator[calls.EntryChunk]:
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
            yield calls.EntryChunk(entries=tuple(batch), commit_index=reads.commit_index,
                                term=reads.current_term, uid=reads.uid, epoch=self.node.raft.epoch)
            lo = batch[-1].index + 1

    # -- commands through the leader -------------------------------------------------------
    async def join(self, request: calls.JoinRequest) -> calls.JoinReply:
        """Admit a node: commit member_joined (idempotent) and answer with the members to gossip with."""
        check_id(request.node_id, "node_id")
        try:
            MemberRecord(request.node_id, request.addr, MemberState.ALIVE, 0).validate()
        except InvalidMessage as exc:
            raise BadRequest(str(exc)) from None
        if request.store_port > 65535:
            raise BadRequest(f"store_port {request.store_port} is not a port")
        if not valid_uid(request.uid):
            raise BadRequest("uid must be the joining node's store uid, 32 lowercase hex digits")
        if not valid_boot(request.boot):
            raise BadRequest(f"boot must be the joining daemon's boot, {BOOT_DIGITS} lowercase hex digits")
        if not (math.isfinite(request.up) and 0 <= request.up <= MAX_UP):
            raise BadRequest(f"up must be the joining daemon's age in seconds, 0 to {MAX_UP:g}")
        check_site(request)
        check_speed_class(request)
        return await self.forward.via_leader(
            lambda: self.admission.admit(request),
            lambda c: c.join(request.node_id, request.addr, request.store_port, request.ready, request.uid,
                             request.boot, request.up, request.site, request.near, request.speed_class))

    async def leave(self, request: calls.LeaveRequest) -> calls.LeaveReply:
        """Leave gracefully: this node (node_id empty or ours) commits member_left and exits."""
        if request.forwarded:
            check_id(request.node_id, "node_id")
            await self.forward.via_leader(lambda: self.leaves.commit(request.node_id),
                                          lambda c: c.leave(request.node_id, forwarded=True))
            return calls.LeaveReply(accepted=True)
        if request.node_id and request.node_id != self.node.id:
            raise BadRequest("a node can only be asked to leave itself; call the leaving node")
        await self.leave_cluster()
        return calls.LeaveReply(accepted=True)

    async def leave_cluster(self) -> None:
        """Commit member_left for this node (through the leader), then start the daemon's exit."""
        await self.forward.via_leader(lambda: self.leaves.commit(self.node.id),
                                      lambda c: c.leave(self.node.id, forwarded=True))
        await self.backing.lifecycle.left()

    async def group_failed(self, request: calls.GroupFailedRequest) -> calls.GroupFailedReply:
        """Record that a group (or a job's build) failed: the leader re-forms the group under a new
        generation, or halts a job whose identical failure keeps coming back."""
        check_id(request.node_id, "node_id")
        try:
            phase = FailurePhase(request.phase or FailurePhase.GROUP.value)
        except ValueError:
            raise BadRequest(f"phase must be one of {[p.value for p in FailurePhase]}") from None
        if request.step >= MAX_STEP:
            raise BadRequest(f"step must be below {MAX_STEP}")
        error = one_line(request.error or request.reason) or "unknown failure"
        attempt = request.attempt if phase is FailurePhase.BUILD else request.generation
        report = FailureReport(request.node_id, phase, request.step, error, attempt)

        async def here() -> calls.GroupFailedReply:
            self.backing.leader.group_failed(request.generation, report)
            return calls.GroupFailedReply()

        return await self.forward.via_leader(here, lambda c: c.group_failed(request))

    async def report_checkpoint(self, request: calls.CheckpointReport) -> calls.CheckpointReply:
        """Note that a node holds a checkpoint; the leader records it once a majority does."""
        check_id(request.node_id, "node_id")
        if not valid_digest(request.digest):
            raise BadRequest("digest must be a lowercase sha256 hex string of 64 characters")
        if not 0 < request.step < MAX_STEP:
            raise BadRequest(f"step must be in 1..{MAX_STEP - 1}")
        if getattr(self.node.reads.state.members.get(request.node_id), "status", None) is not MemberStatus.ACTIVE:
            raise BadRequest(f"{request.node_id!r} is not an active member of this cluster")
        held = Held(request.step, request.digest, request.final)

        async def here() -> calls.CheckpointReply:
            return calls.CheckpointReply(committed_step=self.backing.leader.checkpoint_reported(request.node_id, held))

        return await self.forward.via_leader(
            here, lambda c: c.report_checkpoint(request.node_id, request.step, request.digest, request.final))

    async def force(self, request: calls.ForceRequest) -> calls.ForceReply:
        """Shrink the voters to the survivors named by an operator who lost a majority for good."""
        if not request.confirm:
            raise BadRequest("a forced reconfiguration needs confirm=true")
        voters = list(dict.fromkeys(request.voters))
        for voter in voters:
            check_id(voter, "voter")
        if self.node.id not in voters:
            raise BadRequest("run force on one of the surviving voters and name it among --voters")
        result = self.node.commands.force(voters)
        if isinstance(result, Refused):
            raise BadRequest(f"force refused: {result.reason}")
        return calls.ForceReply(term=self.node.reads.current_term, epoch=self.node.raft.epoch,
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

    async def status(self) -> calls.StatusReply:
        """The status document as JSON."""
        return calls.StatusReply(json=json.dumps(self.backing.status.status(), sort_keys=True))

    async def kv_put(self, request: calls.KvPutRequest) -> calls.KvPutReply:
        """Commit key=value; the reply comes once the entry is applied here (on the leader)."""
        if not request.key or len(request.key) > MAX_KEY or len(request.value) > MAX_VALUE:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters and values at most {MAX_VALUE} characters")

        async def here() -> calls.KvPutReply:
            entry, _ = await self.node.commands.propose(KvPut(request.key, request.value), COMMAND_TIMEOUT)
            return calls.KvPutReply(committed=True, index=entry.index, leader_id=self.node.id)

        return await self.forward.via_leader(here, lambda c: c.kv_put(request.key, request.value))

    async def kv_get(self, request: calls.KvGetRequest) -> calls.KvGetReply:
        """A linearizable read (ReadIndex on the leader)."""
        if not request.key or len(request.key) > MAX_KEY:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters")

        async def here() -> calls.KvGetReply:
            index = await self.node.commands.read_barrier(COMMAND_TIMEOUT)
            value = self.node.reads.state.kv.get(request.key)
            if value is None:
                return calls.KvGetReply(found=False, read_index=index)
            return calls.KvGetReply(found=True, value=value, read_index=index)

        return await self.forward.via_leader(here, lambda c: c.kv_get(request.key))

    async def kv_delete(self, request: calls.KvDeleteRequest) -> calls.KvDeleteReply:
        """Commit the key's removal; found is false (nothing changed) when it was not set."""
        if not request.key or len(request.key) > MAX_KEY:
            raise BadRequest(f"keys are 1-{MAX_KEY} characters")

        async def here() -> calls.KvDeleteReply:
            entry, result = await self.node.commands.propose(KvDelete(request.key), COMMAND_TIMEOUT)
            return calls.KvDeleteReply(committed=True, index=entry.index, leader_id=self.node.id,
                                    found=result.accepted, reason=result.reason)

        return await self.forward.via_leader(here, lambda c: c.kv_delete(request.key))

    async def kv_list(self, request: calls.KvListRequest) -> calls.KvListReply:
        """A linearizable read of every key under the prefix, sorted."""
        if len(request.prefix) > MAX_KEY:
            raise BadRequest(f"a prefix is at most {MAX_KEY} characters")

        async def here() -> calls.KvListReply:
            index = await self.node.commands.read_barrier(COMMAND_TIMEOUT)
            kv = self.node.reads.state.kv
            pairs = tuple(calls.KvPair(key=k, value=kv[k]) for k in sorted(kv) if k.startswith(request.prefix))
            return calls.KvListReply(pairs=pairs, read_index=index)

        return await self.forward.via_leader(here, lambda c: c.kv_list(request.prefix))

    async def job_control(self, request: calls.JobControlRequest) -> calls.JobControlReply:
        """`retry`: commit the job as running again after the leader halted it as failed; `pause`:
        every worker stops at one step boundary and waits, holding its state; `resume`: train on."""
        modes = {"pause": ControlMode.PAUSED, "resume": ControlMode.RUNNING}
        if request.action != "retry" and request.action not in modes:
            raise BadRequest("the job action must be one of retry, pause, resume")

        async def here() -> calls.JobControlReply:
            if request.action == "retry":
                return await self.jobs.retry()
            return await self.jobs.control(modes[request.action])

        return await self.forward.via_leader(here, lambda c: c.job_control(request.action))

    async def fetch_checkpoint(self, request: calls.FetchCheckpointRequest) -> AsyncIterator[calls.CheckpointChunk]:
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
                    yield calls.CheckpointChunk(step=request.step, offset=offset, data=data, total_size=size, done=done)
                    offset += len(data)
                    if done:
                        return
        except FileNotFoundError:
            raise NotFound(f"this node holds no checkpoint of step {request.step}") from None

