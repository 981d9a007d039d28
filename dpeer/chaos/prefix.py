"""Do the nodes' committed logs agree? Every pair of nodes must hold equal entries (by hash) at
every index both still hold and both have committed: from the higher of their first indexes
(compaction drops a prefix) to the lower of their commit indexes. The logs are what `dpeer log
--json` prints of each node (dpeer/chaos/logs.py fetches them). Pure: no clock, I/O or framework.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations

SHOWN = 5  # differing indexes named per pair


@dataclass(frozen=True)
class NodeLog:
    """A node's committed entries from the first it still holds: hashes[i] is entry first + i's."""

    node: str
    first: int
    hashes: tuple[str, ...]
    terms: tuple[int, ...]

    @property
    def last(self) -> int:
        """The last committed index read (first - 1 when none)."""
        return self.first + len(self.hashes) - 1


def parse_log(node: str, text: str) -> NodeLog:
    """A node's log from `dpeer log --json` (one {index, term, kind, hash} object a line);
    ValueError when a line does not parse or the indexes do not follow each other."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows:
        raise ValueError("it printed no committed entry")
    first = rows[0]["index"]
    for at, row in enumerate(rows):
        if row["index"] != first + at:
            raise ValueError(f"entry {first + at} is missing (the next line holds {row['index']})")
    return NodeLog(node, first, tuple(r["hash"] for r in rows), tuple(r["term"] for r in rows))


@dataclass
class PrefixResult:
    """The differences found and the figures of what was compared."""

    problems: list[str]
    note: str


def compare_logs(logs: list[NodeLog], unread: dict[str, str]) -> PrefixResult:
    """Compare every pair of logs on their common committed range; a node whose log could not be
    read (`unread`: node -> why), fewer than two logs or a pair with nothing in common is a
    problem too: the check did not run fully."""
    problems = [f"{node}: its committed log could not be read ({why})" for node, why in sorted(unread.items())]
    if len(logs) < 2:
        problems.append(f"{len(logs)} committed logs read: nothing to compare")
    compared, low, high = 0, None, None
    for a, b in combinations(logs, 2):
        lo, hi = max(a.first, b.first), min(a.last, b.last)
        if lo > hi:
            problems.append(f"{a.node} ({a.first}..{a.last}) and {b.node} ({b.first}..{b.last}) hold no "
                            "committed index in common: not compared")
            continue
        differ = [i for i in range(lo, hi + 1) if a.hashes[i - a.first] != b.hashes[i - b.first]]
        for i in differ[:SHOWN]:
            problems.append(f"index {i}: {a.node} holds {a.hashes[i - a.first][:16]} (term {a.terms[i - a.first]}), "
                            f"{b.node} holds {b.hashes[i - b.first][:16]} (term {b.terms[i - b.first]})")
        if len(differ) > SHOWN:
            problems.append(f"{a.node} and {b.node} differ at {len(differ) - SHOWN} more indexes up to {differ[-1]}")
        compared += hi - lo + 1
        low, high = min(lo, low or lo), max(hi, high or hi)
    spans = ", ".join(f"{log.node} {log.first}..{log.last}" for log in logs)
    where = f" between indexes {low} and {high}" if low is not None else ""
    return PrefixResult(problems, f"{len(logs)} nodes ({spans}), {compared} entries compared pairwise{where}, "
                                  "each pair from the higher first index")
