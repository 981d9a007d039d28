"""Which checkpoint the leader records in the log, as a pure table-tested decision.

Every worker writes a full-state checkpoint at the same steps and its daemon reports
(step, parameter digest) to the leader. A checkpoint is worth recording only once a majority of
the current group holds it with one digest: after a full-cluster power loss, the cluster
resumes from the newest recorded checkpoint, and a majority of holders means that a majority of
the boxes can load and verify it. Two digests for one step mean replicas diverged; the decision
says so and records the digest a majority holds, if any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dpeer.daemon.decide.proposals import Decision
from dpeer.statemachine.payloads import CheckpointTaken
from dpeer.statemachine.state import ClusterState, MemberStatus

DIGEST_HEX = 64


@dataclass(frozen=True)
class Held:
    """The newest checkpoint one node reported: its step, the parameters' sha256 hex, and whether
    it is the job's last step."""

    step: int
    digest: str
    final: bool = False


def valid_digest(digest: str) -> bool:
    """True for a lowercase sha256 hex digest."""
    return len(digest) == DIGEST_HEX and all(c in "0123456789abcdef" for c in digest)


def quorum(group_size: int) -> int:
    """How many holders a checkpoint needs in a group of `group_size`: a strict majority."""
    return group_size // 2 + 1


def judging_group(state: ClusterState) -> tuple[str, ...]:
    """Whose majority a checkpoint needs: the current view's members; while training is paused (an
    empty view), every active member that runs the job's worker (its record carries the worker's
    store port), the group a resume would form, so a checkpoint written as the pause landed (the
    job's final one included) is still recorded."""
    if state.view is None:
        return ()
    if state.view.members:
        return state.view.members
    return tuple(sorted(n for n, m in state.members.items() if m.status is MemberStatus.ACTIVE and m.store_port))


def decide_checkpoint(state: ClusterState, reports: Mapping[str, Held]) -> Decision:
    """The newest step newer than the committed checkpoint that a majority of the judging
    group (judging_group) holds with one digest, as a checkpoint entry (final when it is the job's last
    step, which finishes the job); or none, with the reason."""
    group = judging_group(state)
    if not group:
        return Decision(None, "no group holds a checkpoint: no view is committed yet, or no member runs the job")
    committed = state.checkpoint.step if state.checkpoint is not None else 0
    need = quorum(len(group))
    by_step: dict[int, dict[str, list[str]]] = {}
    for node_id, held in reports.items():
        if held.step > committed:
            by_step.setdefault(held.step, {}).setdefault(held.digest, []).append(node_id)
    if not by_step:
        return Decision(None, f"no report is newer than the committed checkpoint of step {committed}")
    notes = []
    for step in sorted(by_step, reverse=True):
        digests = by_step[step]
        if len(digests) > 1:
            notes.append(f"step {step} has {len(digests)} different digests (replicas diverged)")
        for digest, holders in sorted(digests.items(), key=lambda kv: -len(kv[1])):
            if len(holders) >= need:
                final = any(reports[n].final for n in holders)
                taken = CheckpointTaken(step, digest, tuple(sorted(holders)), final)
                reason = f"{len(holders)} of {len(group)} members hold step {step}"
                return Decision(taken, "; ".join([reason, *notes]))
    newest = max(by_step)
    held_by = max(len(h) for h in by_step[newest].values())
    notes.insert(0, f"step {newest} is held by {held_by} of the {need} members it needs")
    return Decision(None, "; ".join(notes))


def still_pending(reports: Mapping[str, Held], committed_step: int) -> dict[str, Held]:
    """The reports newer than the committed checkpoint (older ones can never be recorded)."""
    return {n: h for n, h in reports.items() if h.step > committed_step}
