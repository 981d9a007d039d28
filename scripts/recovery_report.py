"""The report of scripts/bench_recovery.py: markdown tables of the figures and per-trial details."""

from __future__ import annotations

from recovery_common import fmt_ms, med, spread


def summary(tr: dict, dp: dict, alt: dict) -> str:
    """The markdown table of the trials' and the alternating windows' figures."""
    def s(x: float | None, unit: str = "s", nd: int = 2) -> str:
        return "n/a" if x is None else f"{x:.{nd}f} {unit}".strip()

    def mx(xs: list) -> str:
        xs = [x for x in xs if x is not None]
        return f"{max(xs):.2f}" if xs else "n/a"

    rows = []
    t_st, d_st = med(tr["steady"]), med(dp["steady"])
    rows.append(("SIGKILL -> survivors' next committed step", f"{s(med(tr['recover']))} (max {mx(tr['recover'])})",
                 f"{s(med(dp['recover']), 's', 3)} (max {mx(dp['recover'])})", "< 0.5 s"))
    rows.append(("committed steps redone after the kill", f"{med(tr['redone'])} (max {mx(tr['redone'])})",
                 f"{med(dp['redone'])} (max {mx(dp['redone'])})", "0 lost"))
    rows.append(("restart -> box in a committed step", f"{s(med(tr['rejoin']))} (max {mx(tr['rejoin'])})",
                 f"{s(med(dp['rejoin']))} (max {mx(dp['rejoin'])})", "< 2.5 s"))
    rows.append(("steps redone when it rejoins", f"{med(tr['redone_rejoin'])}", f"{med(dp['redone_rejoin'])}", ""))
    steps = alt.get("median_step", {})
    for name, ratios in alt.get("ratio", {}).items():
        rows.append((f"steady step, {name} vs torchrun, alternating {alt['window']} s windows, {len(ratios)} rounds",
                     fmt_ms(med(steps.get("torchrun", []))), fmt_ms(med(steps.get(name, []))),
                     (f"median of per-round ratios {spread(ratios)}; mean-step ratio {spread(alt['mean_ratio'][name])}"
                      " (target < 1.03)")))
    rows.append(("steady step time, 3 boxes, each alone (during its trials)", s(t_st * 1e3 if t_st else None, "ms", 2),
                 s(d_st * 1e3 if d_st else None, "ms", 2),
                 f"ratio {d_st / t_st:.3f}" if t_st and d_st else ""))
    out = ["| measurement | torchrun elastic | dpeer | target |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(out)


def details(tr: dict, dp: dict) -> list[str]:
    """Per side, the raw trial figures and the median of each breakdown phase; then the audit."""
    out = []
    for name, r in (("torchrun", tr), ("dpeer", dp)):
        if r.get("recover"):
            out.append(f"{name}: recover {[round(x, 3) for x in r['recover']]} rejoin {[round(x, 2) for x in r['rejoin']]} "
                       f"redone {r['redone']} load {[round(x, 1) for x in r.get('load', [])]}")
            for key in ("kill_breakdown", "rejoin_breakdown"):
                bds = r.get(key) or []
                if bds:
                    keys = bds[0].keys()
                    out.append(f"  {key} (median): " + ", ".join(f"{k} {med([b[k] for b in bds]):.3f}" for k in keys))
    if dp.get("audit"):
        out.append(f"dpeer audit: {dp['audit']}")
    return out
