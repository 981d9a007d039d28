"""The demo's screen: a live view redrawn in place on a terminal (rich), one line per update
otherwise. One row a node (state, role, rank, step, loss, probe round trip, digest), the leader,
the generation, throughput, a loss sparkline and the newest events with their durations."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from dpeer.cli.demo_events import Docs, Event, generation, newest_step, train_of
from dpeer.cli.status_text import committed_step

SPARKS = "▁▂▃▄▅▆▇█"
EVENTS_SHOWN = 8


@dataclass(frozen=True)
class Frame:
    """Everything one redraw shows."""

    elapsed: float
    docs: Docs
    steps: int
    rate: float
    losses: list[float]
    events: list[Event]
    job: str = "demo"  # how the headline names the job (demo.job_label)


def sparkline(values: list[float], width: int = 40) -> str:
    """The last `width` values as block characters scaled between their min and max."""
    tail = values[-width:]
    if not tail:
        return ""
    lo, hi = min(tail), max(tail)
    span = hi - lo or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - lo) / span * len(SPARKS)))] for v in tail)


def leader_of(docs: Docs) -> str | None:
    """The leader most nodes name."""
    names = [d["leader"] for d in docs.values() if d and d.get("leader")]
    return max(set(names), key=names.count) if names else None


def rtt_to(node: str, docs: Docs) -> float | None:
    """The median round trip the other nodes last measured to `node`'s probes, in ms."""
    seen = [m["rtt_ms"] for n, d in docs.items() if d and n != node for m in d.get("members", [])
            if m.get("node_id") == node and m.get("rtt_ms") is not None]
    return statistics.median(seen) if seen else None


def row(node: str, doc: dict[str, Any] | None, docs: Docs) -> list[str]:
    """One node's cells: node, state, role, rank, step, loss, rtt, digest."""
    if doc is None:
        return [node, "down", "-", "-", "-", "-", "-", ""]
    group, train = doc.get("group"), train_of(doc)
    job = (doc.get("job") or {}).get("state", "up")
    rank = f"{group['rank']}/{group['world_size']}" if group else "-"
    loss = f"{train['loss']:.4f}" if train.get("loss") is not None else "-"
    rtt = rtt_to(node, docs)
    return [node, job, doc.get("role", "-"), rank, str(train.get("step", "-")), loss,
            f"{rtt:.1f}ms" if rtt is not None else "-", str(train.get("params_digest", ""))[:12]]


HEADER = ["NODE", "STATE", "ROLE", "RANK", "STEP", "LOSS", "RTT", "DIGEST"]


def headline(frame: Frame) -> str:
    """The first line: time, the job, leader, generation, progress, throughput, and a pause when one holds."""
    paused = any(d and d.get("control") == "paused" for d in frame.docs.values())
    return (f"dpeer demo  {frame.elapsed:6.1f}s  job {frame.job}  leader {leader_of(frame.docs)}  "
            f"generation {generation(frame.docs)}  step {newest_step(frame.docs)}/{frame.steps}  {frame.rate:5.1f} steps/s"
            + ("  PAUSED (`dpeer job resume` trains on)" if paused else ""))


def render(frame: Frame) -> Group:
    """The live screen as one rich renderable."""
    table = Table(*HEADER, box=None, pad_edge=False, header_style="bold")
    for node, doc in sorted(frame.docs.items()):
        table.add_row(*row(node, doc, frame.docs), style="dim" if doc is None else None)
    loss = f"loss {frame.losses[-1]:.4f} {sparkline(frame.losses)}" if frame.losses else "loss -"
    events = [Text(f"  {e.at:7.1f}s  {e.text}") for e in frame.events[-EVENTS_SHOWN:]] or [Text("  (none yet)")]
    return Group(Text(headline(frame), style="bold"), Text(loss), Text(""), table, Text(""), Text("events:"), *events)


def plain(frame: Frame) -> str:
    """The one-line form for a stdout that is not a terminal."""
    loss = f"  loss {frame.losses[-1]:.4f}" if frame.losses else ""
    return headline(frame) + loss


def final_table(docs: Docs) -> str:
    """Every node's last row as plain text, for the end of the run."""
    rows = [HEADER] + [row(node, doc, docs) for node, doc in sorted(docs.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def newest_committed(docs: Docs) -> int:
    """The newest step any node knows committed (status_text.committed_step), 0 before the first."""
    return max((committed_step(d) or 0 for d in docs.values() if d), default=0)


def node_record(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """One node as --json's progress line shows it (None while it is down): its job state, role,
    rank, newest committed step, and the loss and digest of its newest digested step."""
    if doc is None:
        return None
    group, train = doc.get("group"), train_of(doc)
    return {"state": (doc.get("job") or {}).get("state"), "role": doc.get("role"),
            "rank": group["rank"] if group else None, "step": committed_step(doc),
            "loss": train.get("loss"), "digest": train.get("params_digest")}


def progress_record(frame: Frame) -> dict[str, Any]:
    """--json's periodic line: what the headline says, and every node."""
    return {"type": "progress", "t": round(frame.elapsed, 3), "step": newest_committed(frame.docs), "steps": frame.steps,
            "steps_per_s": round(frame.rate, 3), "loss": frame.losses[-1] if frame.losses else None,
            "leader": leader_of(frame.docs), "generation": generation(frame.docs),
            "paused": any(bool(d and d.get("control") == "paused") for d in frame.docs.values()),
            "nodes": {node: node_record(doc) for node, doc in sorted(frame.docs.items())}}
