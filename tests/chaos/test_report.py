"""The chaos summary table: each row shows what its check compared, and a check that did not run
reads "not run", never "ok"."""

from __future__ import annotations

from types import SimpleNamespace

from dpeer.chaos.options import ChaosOptions
from dpeer.chaos.report import summarize, violations


def test_rows_show_their_comparison_and_skipped_checks_say_not_run() -> None:
    run = SimpleNamespace(opts=ChaosOptions(), chaos_end=10.0, faults=[], kv_attempts=3, acked={"k": "v"},
                          kv_failed=0, samples=[])
    checks = {"replicas agree (digests at equal steps)": [], "final replicas equal": ["a and b differ"]}
    notes = {"replicas agree (digests at equal steps)": "12 digests compared at 4 steps",
             "final replicas equal": "state-dict digests differ, max relative difference 3.00e-07"}
    text = summarize(run, checks, {}, 1.0, notes, {"final model = fault-free run": "not run (--no-reference)"})
    assert "| replicas agree (digests at equal steps) | ok: 12 digests compared at 4 steps |" in text
    assert "| final replicas equal | 1 VIOLATIONS: state-dict digests differ, max relative difference 3.00e-07 |" in text
    assert "| final model = fault-free run | not run (--no-reference) |" in text
    assert "reduction: exact" in text and violations(checks) == 1
