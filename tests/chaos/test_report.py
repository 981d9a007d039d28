"""The chaos summary table: each row shows what its check compared, and a check that did not run
reads "not run", never "ok"."""

from __future__ import annotations

from types import SimpleNamespace

from dpeer.chaos.command import _history_and_logs
from dpeer.chaos.history import key_name
from dpeer.chaos.linear import Kind, Op
from dpeer.chaos.options import ChaosOptions
from dpeer.chaos.prefix import PrefixResult
from dpeer.chaos.report import summarize, violations
from dpeer.chaos.stranger import Tally


def test_rows_show_their_comparison_and_skipped_checks_say_not_run() -> None:
    run = SimpleNamespace(opts=ChaosOptions(), chaos_end=10.0, faults=[], kv_attempts=3, acked={"k": "v"},
                          kv_failed=0, samples=[], history=[], stranger=Tally())
    checks = {"replicas agree (digests at equal steps)": [], "final replicas equal": ["a and b differ"]}
    notes = {"replicas agree (digests at equal steps)": "12 digests compared at 4 steps",
             "final replicas equal": "state-dict digests differ, max relative difference 3.00e-07"}
    text = summarize(run, checks, {}, 1.0, notes, {"final model = fault-free run": "not run (--no-reference)"})
    assert "| replicas agree (digests at equal steps) | ok: 12 digests compared at 4 steps |" in text
    assert "| final replicas equal | 1 VIOLATIONS: state-dict digests differ, max relative difference 3.00e-07 |" in text
    assert "| final model = fault-free run | not run (--no-reference) |" in text
    assert "reduction: exact" in text and violations(checks) == 1
    assert "stranger on the data plane: 0 connections (none)" in text  # a default run plays the stranger


def test_the_history_and_log_rows_fail_loudly_when_they_could_not_run() -> None:
    run = SimpleNamespace(opts=ChaosOptions(), history=[Op(0, Kind.PUT, "k", 1.0, None, value="a")], prefixes=None)
    checks: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    skipped: dict[str, str] = {}
    _history_and_logs(run, checks, notes, skipped)
    assert checks["kv history linearizable"] == [
        "no operation of the chaos window was answered (1 sent): only the end-of-run reads could be checked, "
        "which show nothing of the faults"]
    assert notes["kv history linearizable"].startswith("1 operations on 1 keys (1 without an answer")
    assert "chaos window: 0 of 1 operations answered by 3 clients (the row needs at least 1)" in notes[
        "kv history linearizable"]
    assert checks["committed prefixes equal"] == ["not run: the run stopped before the logs were read"]
    run.opts = ChaosOptions(kv_clients=0)
    run.prefixes = PrefixResult([], "3 nodes")
    checks, notes, skipped = {}, {}, {}
    _history_and_logs(run, checks, notes, skipped)
    assert skipped == {"kv history linearizable": "not run (--kv-clients 0)"}
    assert checks == {"committed prefixes equal": []} and notes == {"committed prefixes equal": "3 nodes"}


def _window_and_final_reads(answered_in_window: int) -> SimpleNamespace:
    """Every client's operations of the chaos window (the first `answered_in_window` answered, the
    rest without an answer), then the end-of-run reads, all answered "absent"."""
    opts = ChaosOptions()
    window = [Op(c, Kind.PUT, key_name(opts.seed, k), 1.0 + c, None, value=f"c{c}-{k}", node="n1")
              for c in range(opts.kv_clients) for k in range(3)]
    window = [Op(0, Kind.GET, key_name(opts.seed, k), 0.1 * k, 0.1 * k + 0.05, value=None, node="n2")
              for k in range(answered_in_window)] + window
    final = [Op(opts.kv_clients, Kind.GET, key_name(opts.seed, k), 50.0 + k, 50.5 + k, value=None, node=n)
             for k in range(3) for n in ("n1", "n2", "n3")]
    return SimpleNamespace(opts=opts, history=window + final, prefixes=PrefixResult([], "3 nodes"))


def test_a_window_without_one_answered_operation_is_not_ok() -> None:
    """The end-of-run reads are answered in any run that gets that far: they alone never make the row ok
    (review of issue 35: a run whose clients got no answer during the whole window passed)."""
    checks: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    _history_and_logs(_window_and_final_reads(0), checks, notes, {})
    assert checks["kv history linearizable"] == [
        "no operation of the chaos window was answered (9 sent): only the end-of-run reads could be checked, "
        "which show nothing of the faults"]
    assert "chaos window: 0 of 9 operations answered" in notes["kv history linearizable"]
    checks, notes = {}, {}
    _history_and_logs(_window_and_final_reads(1), checks, notes, {})
    assert checks["kv history linearizable"] == []
    assert "chaos window: 1 of 10 operations answered by 3 clients (the row needs at least 1)" in notes[
        "kv history linearizable"]
