"""The committed-prefix comparison of a chaos run (dpeer/chaos/prefix.py), as a table: equal logs
pass with the figures compared; a differing entry, a log that could not be read, fewer than two
logs or a pair with nothing in common fail (a check that did not run fully is never "ok")."""

from __future__ import annotations

import json

import pytest

from dpeer.chaos.prefix import NodeLog, compare_logs, parse_log
from tests.test_layers import IMPURE, ROOT, imports


def log(node: str, first: int, last: int, bad: dict[int, str] | None = None) -> NodeLog:
    """A log of entries first..last whose hash at i is h<i>, except where `bad` says."""
    hashes = tuple((bad or {}).get(i, f"h{i}") for i in range(first, last + 1))
    return NodeLog(node, first, hashes, tuple(1 for _ in hashes))


@pytest.mark.parametrize("logs, unread, problems, note", [
    ([log("n1", 1, 50), log("n2", 1, 50), log("n3", 1, 50)], {}, [],
     "3 nodes (n1 1..50, n2 1..50, n3 1..50), 150 entries compared pairwise between indexes 1 and 50"),
    ([log("n1", 1, 50), log("n2", 1, 40)], {}, [], "40 entries compared pairwise between indexes 1 and 40"),
    ([log("n1", 30, 50), log("n2", 1, 45), log("n3", 1, 50)], {}, [],
     "(n1 30..50, n2 1..45, n3 1..50), 82 entries compared pairwise between indexes 1 and 50"),
    ([log("n1", 1, 50), log("n2", 1, 50, {7: "x7"})], {}, ["index 7: n1 holds h7 (term 1), n2 holds x7 (term 1)"], ""),
    ([log("n1", 1, 50), log("n2", 1, 50)], {"n3": "`dpeer log` exited 3: unreachable"},
     ["n3: its committed log could not be read (`dpeer log` exited 3: unreachable)"], "2 nodes"),
    ([log("n1", 1, 50)], {}, ["1 committed logs read: nothing to compare"], "1 nodes"),
    ([log("n1", 60, 80), log("n2", 1, 50)], {},
     ["n1 (60..80) and n2 (1..50) hold no committed index in common: not compared"], "0 entries compared"),
])
def test_compare(logs: list[NodeLog], unread: dict[str, str], problems: list[str], note: str) -> None:
    result = compare_logs(logs, unread)
    assert result.problems == problems
    assert note in result.note


def test_many_differences_are_summed_up() -> None:
    result = compare_logs([log("n1", 1, 20), log("n2", 1, 20, {i: "x" for i in range(3, 20)})], {})
    assert len(result.problems) == 6 and result.problems[-1] == "n1 and n2 differ at 12 more indexes up to 19"


def test_parse_what_dpeer_log_prints() -> None:
    rows = [{"index": i, "term": 2, "kind": "noop", "hash": f"h{i}"} for i in (5, 6, 7)]
    parsed = parse_log("n1", "\n".join(json.dumps(r) for r in rows) + "\n")
    assert (parsed.first, parsed.last, parsed.hashes, parsed.terms) == (5, 7, ("h5", "h6", "h7"), (2, 2, 2))
    with pytest.raises(ValueError, match="entry 6 is missing"):
        parse_log("n1", "\n".join(json.dumps(r) for r in rows[::2]))
    with pytest.raises(ValueError, match="no committed entry"):
        parse_log("n1", "")


def test_the_comparison_is_a_pure_core() -> None:
    bad = {n.split(".")[0] for n in imports(ROOT / "chaos" / "prefix.py")} & IMPURE
    assert not bad, f"chaos/prefix.py imports {sorted(bad)}"
