"""What happened between two looks at a demo cluster: kills, re-forms, heals, rejoins, the end.

Pure: it takes the status documents of every node (None for a node that is down), the time and
the kills the demo made, and returns new events, each with how long it took, for the live
screen's event list. The durations are measured from what the statuses say (a kill to the
survivors' next committed step, a restart to the box training again) or reported by the worker
itself (how long a formation or a heal took).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from dpeer.daemon.decide.job_status import JobStatus

Docs = Mapping[str, "dict[str, Any] | None"]


@dataclass(frozen=True)
class Event:
    """One line of the event list: when (seconds into the run) and what, with its duration."""

    at: float
    text: str


@dataclass
class Kill:
    """A node the demo killed: when, at which step, and what followed."""

    node: str
    at: float
    step: int
    recovered: bool = False
    restarted_at: float | None = None
    rejoined: bool = False


def train_of(doc: dict[str, Any] | None) -> dict[str, Any]:
    """The status's train object ({} when absent)."""
    return (doc or {}).get("train") or {}


def newest_step(docs: Docs) -> int:
    """The highest committed step any node reports."""
    return max((train_of(d).get("step", 0) for d in docs.values()), default=0)


def generation(docs: Docs) -> int:
    """The newest committed generation any node reports."""
    return max(((d.get("group") or {}).get("generation", 0) for d in docs.values() if d), default=0)


@dataclass
class EventLog:
    """Turns successive snapshots into events; `start` is when the run began (the time origin)."""

    start: float
    events: list[Event] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    _generation: int = 0
    _formed: dict[str, Any] = field(default_factory=dict)
    _job: str = ""

    def _say(self, now: float, text: str) -> None:
        self.events.append(Event(now - self.start, text))

    def killed(self, now: float, node: str, step: int) -> None:
        """The demo killed `node` (SIGKILL of its daemon and worker) at `step`."""
        self.kills.append(Kill(node, now, step))
        self._say(now, f"killed {node} at step {step}")

    def restarted(self, now: float, node: str) -> None:
        """The demo restarted `node` on its data dir."""
        for kill in self.kills:
            if kill.node == node and kill.restarted_at is None:
                kill.restarted_at = now
        self._say(now, f"restarted {node} on its data dir")

    def update(self, now: float, docs: Docs) -> list[Event]:
        """Fold one snapshot in; returns the events it produced."""
        before = len(self.events)
        self._generations(now, docs)
        self._recoveries(now, docs)
        self._heals(now, docs)
        self._job_end(now, docs)
        return self.events[before:]

    def _generations(self, now: float, docs: Docs) -> None:
        gen = generation(docs)
        if gen > self._generation:
            group = next(((d or {}).get("group") for d in docs.values() if ((d or {}).get("group") or {})
                          .get("generation") == gen), None) or {}
            members = ", ".join(group.get("members", []))
            self._say(now, f"generation {gen} formed: {members}")
            self._generation = gen

    def _recoveries(self, now: float, docs: Docs) -> None:
        for kill in self.kills:
            survivors = [d for n, d in docs.items() if n != kill.node and d]
            if not kill.recovered and any(train_of(d).get("step", -1) > kill.step for d in survivors):
                kill.recovered = True
                self._say(now, f"survivors of {kill.node}'s kill trained on: next committed step "
                               f"{now - kill.at:.2f}s after the kill")
            back = docs.get(kill.node)
            if kill.restarted_at is not None and not kill.rejoined and back and back.get("group") \
                    and train_of(back).get("step", -1) >= newest_step(docs) - 1:
                kill.rejoined = True
                self._say(now, f"{kill.node} trains again, {now - kill.restarted_at:.2f}s after its restart")

    def _heals(self, now: float, docs: Docs) -> None:
        for node, doc in sorted(docs.items()):
            formed = ((doc or {}).get("worker") or {}).get("last_formed") or {}
            if not formed or formed == self._formed.get(node):
                continue
            self._formed[node] = formed
            if formed.get("healed"):
                size = (formed.get("heal_bytes") or 0) / 1024
                self._say(now, f"{node} healed from its peers: {size:.0f} KiB in {formed.get('heal_s') or 0:.2f}s "
                               f"(joined generation {formed.get('gen')} at step {formed.get('step')})")

    def _job_end(self, now: float, docs: Docs) -> None:
        for doc in docs.values():
            job = (doc or {}).get("job") or {}
            state = job.get("state", "")
            if state in (JobStatus.FAILED, JobStatus.FINISHED) and state != self._job:
                self._job = state
                text = (f"the job failed: {job.get('error')}" if state == JobStatus.FAILED else
                        f"the job finished at step {job.get('step')} (digest {str(job.get('digest'))[:12]})")
                self._say(now, text)
