"""Committing a node's leave, on the leader: its member_left, then its removal from the voting
configuration, neither while that removal would leave no live quorum."""

from __future__ import annotations

from dpeer.consensus.voting import ChangeOp
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.forward import COMMAND_TIMEOUT, Forwarder
from dpeer.errors import BadRequest
from dpeer.statemachine.payloads import MemberLeft
from dpeer.statemachine.state import MemberStatus


class Leaves:
    """The leader's side of a leave; see the module docstring."""

    def __init__(self, node: Node, forward: Forwarder) -> None:
        self.node, self.forward = node, forward

    async def commit(self, node_id: str) -> None:
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
        await self.forward.retry(refusal, f"{node_id} cannot leave now")

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
        await self.forward.retry(remove, f"could not remove {node_id} from the configuration")
