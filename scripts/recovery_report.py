"""The report of scripts/bench_recovery.py: markdown tables of the figures and per-trial details."""

from __future__ import annotations

from recovery_common import fmt_ms, med, median_ci, spread


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
                 f"{s(med(dp['recover']), 's', 3)} (max {mx(dp['recover'])})", "< 0.1 s"))
    by_role = list(zip(dp.get("victim_role", []), dp["recover"]))
    for role, target in (("follower", ""), ("leader", "< 0.25 s")):
        xs = [x for r, x in by_role if r == role]
        if xs:
            rows.append((f"... of a {role} (dpeer: {len(xs)} of the kills)", "", f"{s(med(xs), 's', 3)} (max {mx(xs)})",
                         target))
    rows.append(("committed steps redone after the kill", f"{med(tr['redone'])} (max {mx(tr['redone'])})",
                 f"{med(dp['redone'])} (max {mx(dp['redone'])})", "0 lost"))
    floors = [b["bare_import_torch"] for b in dp.get("rejoin_breakdown", []) if "bare_import_torch" in b]
    floor = med(floors)
    rows.append(("restart -> box in a committed step", f"{s(med(tr['rejoin']))} (max {mx(tr['rejoin'])})",
                 f"{s(med(dp['rejoin']))} (max {mx(dp['rejoin'])})",
                 f"< bare import torch + 0.5 s = {floor + 0.5:.2f} s" if floor is not None else "< import torch + 0.5 s"))
    if floor is not None:
        rows.append(("bare `python -c 'import torch'` on the same box, before each restart", "",
                     f"{s(floor)} (max {mx(floors)})", "the floor"))
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


def pinned_summary(p: dict) -> str:
    """The markdown table of the pinned steady-state run (world size 2, one core per box)."""
    cpu, steps = p["cpu"], p["median_step"]

    def per_box(d: dict) -> str:
        return " / ".join(f"{v * 1e3:.0f}" for v in d.values()) + " ms/s"

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 1e3:.3f} ms"

    wt, wd = cpu["torchrun"]["worker_cpu_per_step"], cpu["dpeer"]["worker_cpu_per_step"]
    ci = median_ci(p["ratio"])
    ci_text = f", 95% bootstrap CI of the median {ci[0]:.3f}-{ci[1]:.3f}" if ci else ""
    rows = [
        (f"steady step (n1), pinned, dpeer {p.get('reduction', 'exact')} reduction (torchrun: float sums), "
         f"alternating {p['window']} s windows, {len(p['ratio'])} rounds",
         fmt_ms(med(steps["torchrun"])), fmt_ms(med(steps["dpeer"])),
         f"median of per-round ratios {spread(p['ratio'])}{ci_text} (target < 1.03)"),
        ("mean-step ratio", "", "", spread(p["mean_ratio"])),
        ("per-round ratio, paused job's CPU taken out of each window (first order)", "", "",
         spread(p["corrected_ratio"])),
        ("worker CPU per committed step (n1)", ms(wt), ms(wd), f"ratio {wd / wt:.3f}" if wt and wd else ""),
        ("agent / daemon CPU per second while its job trains (n1 / n2)", per_box(cpu["torchrun"]["top_cpu_per_s"]),
         per_box(cpu["dpeer"]["top_cpu_per_s"]), "from /proc/PID/stat"),
        ("the same while its job is paused (the other job's window)", per_box(cpu["dpeer"]["paused_arm_cpu_per_s"]),
         per_box(cpu["torchrun"]["paused_arm_cpu_per_s"]), "competes with the job measured"),
        ("other processes on cores 0 / 1 in its windows (median)", per_box(cpu["torchrun"]["other_cpu_per_s"]),
         per_box(cpu["dpeer"]["other_cpu_per_s"]), f"load {p['load'][0]:.1f} -> {p['load'][1]:.1f}"),
    ]
    out = ["| measurement, one core per box | torchrun elastic | dpeer | |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    out.append(f"dpeer roles {p['roles']}, group failures {p['failed_reports']}, "
               f"worker processes changed {p['worker_restarts']}")
    return "\n".join(out)
