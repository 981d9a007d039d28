"""The run's report: the summary table (printed and <out>/summary.md) and <out>/timeline.json."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpeer.chaos.options import DISRUPTIVE, KINDS

if TYPE_CHECKING:
    from dpeer.chaos.run import Run


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f}s, max {max(values):.2f}s (n={len(values)})"


def summarize(run: Run, checks: dict[str, list[str]], figures: dict[str, Any], wall: float,
              notes: dict[str, str], skipped: dict[str, str]) -> str:
    """The Markdown summary: every fault, recovery times per kind, the figures, the checks (each with
    what it compared; a check that did not run says so) and violations."""
    o = run.opts
    lines = [(f"dpeer chaos: {o.nodes} nodes, seed {o.seed}, {o.duration:.0f}s chaos window "
              f"(ran {run.chaos_end or 0:.0f}s in, {wall:.0f}s wall), {o.steps} steps, {len(run.faults)} faults"), ""]
    lines += _fault_table(run) + [""] + _kind_table(run) + ["", _figures_line(run, figures), ""]
    lines += _check_lines(checks, notes, skipped)
    return "\n".join(lines)


def _fault_table(run: Run) -> list[str]:
    lines = ["| # | t (s) | kind | node | detail | survivors' next step (s) | back in a group (s) |",
             "|---|---|---|---|---|---|---|"]
    for f in run.faults:
        rec = "-" if f.recovered_s is None else f"{f.recovered_s:.2f} ({f.recovered_how})"
        back = "-" if f.back_s is None else f"{f.back_s:.2f}"
        lines.append(f"| {f.id} | {f.at:.1f} | {f.kind} | {','.join(f.nodes)} | {f.detail} | {rec} | {back} |")
    return lines


def _kind_table(run: Run) -> list[str]:
    lines = ["| kind | faults | survivors' next committed step | back in a group after the fault ended |",
             "|---|---|---|---|"]
    for kind in [k for k in KINDS if any(f.kind == k for f in run.faults)] + ["all"]:
        fs = [f for f in run.faults if kind in ("all", f.kind)]
        rec = [f.recovered_s for f in fs if f.recovered_s is not None]
        back = [f.back_s for f in fs if f.back_s is not None and f.kind in DISRUPTIVE]
        lines.append(f"| {kind} | {len(fs)} | {_stats(rec)} | {_stats(back) if kind == 'all' or kind in DISRUPTIVE else 'n/a'} |")
    return lines


def _figures_line(run: Run, figures: dict[str, Any]) -> str:
    line = (f"kv writes: {run.kv_attempts} attempted, {len(run.acked)} acknowledged, {run.kv_failed} not "
            f"acknowledged (unavailable during a fault); kv history: {len(run.history)} operations; status samples: "
            f"{len(run.samples)}; ledger records: {figures.get('ledger_records', 0)}; reduction: {run.opts.reduction}")
    return line + ("; " + run.stranger.note() if "stranger" in run.opts.kinds else "")


def _check_lines(checks: dict[str, list[str]], notes: dict[str, str], skipped: dict[str, str]) -> list[str]:
    lines = ["| check | result |", "|---|---|"]
    for name, problems in checks.items():
        verdict = "ok" if not problems else f"{len(problems)} VIOLATIONS"
        lines.append(f"| {name} | {verdict}: {notes[name]} |" if name in notes else f"| {name} | {verdict} |")
    for name, why in skipped.items():
        lines.append(f"| {name} | {why} |")
    lines += ["", f"violations: {violations(checks)}"]
    for name, problems in checks.items():
        for p in problems[:10]:
            lines.append(f"  VIOLATION [{name}] {p}")
        if len(problems) > 10:
            lines.append(f"  ... and {len(problems) - 10} more [{name}]")
    return lines


def violations(checks: dict[str, list[str]]) -> int:
    """The number of violations over every check."""
    return sum(len(p) for p in checks.values())


def write_report(run: Run, checks: dict[str, list[str]], figures: dict[str, Any], wall: float,
                 notes: dict[str, str], skipped: dict[str, str]) -> None:
    """Print the summary; write <out>/timeline.json (samples, faults, events, checks) and <out>/summary.md."""
    opts = run.opts
    text = summarize(run, checks, figures, wall, notes, skipped)
    print(text, flush=True)
    timeline = {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "root": str(run.root), "wall_s": round(wall, 1), "chaos_end": run.chaos_end, "done_at": run.done_at,
        "samples": run.samples, "faults": [asdict(f) for f in run.faults], "events": run.events,
        "kv": {"attempted": run.kv_attempts, "acknowledged": len(run.acked), "failed": run.kv_failed},
        "history": [asdict(op) for op in run.history],
        "stranger": {"ran": "stranger" in opts.kinds, "connections": run.stranger.connections,
                     "refused": run.stranger.refused, "bytes": run.stranger.sent,
                     "store_sets": run.stranger.store_sets, "ports": sorted(run.stranger.ports),
                     "requests": run.stranger.requests, "requests_run": run.stranger.ran},
        "figures": figures, "checks": checks, "notes": notes, "not_run": skipped, "violations": violations(checks),
    }
    (opts.out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    (opts.out / "summary.md").write_text(text + "\n")
    print(f"timeline: {opts.out / 'timeline.json'}; data and logs: {run.root}", flush=True)
