#!/usr/bin/env python3
"""Recovery timeline of a chaos run: training step and group size per node over time, faults marked.

Usage: python scripts/plot_recovery.py OUT/timeline.json [-o recovery.png]
Needs matplotlib (`pip install -e .[report]`); nothing else in dpeer does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLORS = {"kill": "#d62728", "restart": "#ff7f0e", "wipe": "#8c564b", "stop": "#9467bd",
          "partition": "#1f77b4", "loss": "#7f7f7f", "slow": "#bcbd22"}


def _with_gaps(samples: list[dict], gap: float) -> tuple[list[float], list[float], list[float]]:
    """Times, steps and group sizes, with NaN breaks where the node did not answer (down or stopped)."""
    ts: list[float] = []
    steps: list[float] = []
    worlds: list[float] = []
    last = None
    for s in samples:
        if last is not None and s["t"] - last > gap:
            ts.append((s["t"] + last) / 2)
            steps.append(float("nan"))
            worlds.append(float("nan"))
        ts.append(s["t"])
        steps.append(float("nan") if s["step"] is None else s["step"])
        worlds.append(s["world"])
        last = s["t"]
    return ts, steps, worlds


def plot(timeline: dict, out: Path, dpi: int = 110) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, faults = timeline["samples"], timeline["faults"]
    nodes = sorted({s["node"] for s in samples}, key=lambda n: (len(n), n))
    fig, (ax_step, ax_world) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 2]})
    gap = 4 * float(timeline["options"].get("poll", 0.25)) + 1.0
    for i, node in enumerate(nodes):
        mine = [s for s in samples if s["node"] == node]
        ts, steps, worlds = _with_gaps(mine, gap)
        line, = ax_step.plot(ts, steps, lw=1.0, label=node)
        # a small per-node offset keeps equal group sizes from hiding each other
        offset = (i - (len(nodes) - 1) / 2) * 0.07
        ax_world.step(ts, [w + offset for w in worlds], where="post", lw=1.0,
                      color=line.get_color(), label=node)
    seen: set[str] = set()
    for f in faults:
        end = f["ended_at"] if f["ended_at"] is not None else f["at"] + max(f["planned_s"], 0.5)
        color = COLORS.get(f["kind"], "black")
        for ax in (ax_step, ax_world):
            ax.axvspan(f["at"], max(end, f["at"] + 0.3), color=color, alpha=0.18, lw=0,
                       label=f["kind"] if ax is ax_step and f["kind"] not in seen else None)
        seen.add(f["kind"])
        ax_world.annotate(",".join(f["nodes"]), (f["at"], 0.15), fontsize=6, color=color, rotation=90)
    o = timeline["options"]
    ax_step.set_title(f"dpeer chaos: {o['nodes']} nodes, seed {o['seed']}, {len(faults)} faults, "
                      f"{timeline['violations']} violations", fontsize=10)
    ax_step.set_ylabel("committed step\n(gaps: node down/stopped)")
    ax_world.set_ylabel("size of the group\nthe node is in (0: none)")
    ax_world.set_xlabel("seconds since start")
    ax_world.set_ylim(-0.2, o["nodes"] + 0.5)
    ax_step.legend(fontsize=7, ncol=2, loc="upper left")
    ax_world.legend(fontsize=7, ncol=len(nodes), loc="lower right")
    for ax in (ax_step, ax_world):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline", type=Path, help="timeline.json written by `dpeer chaos --out DIR`")
    p.add_argument("-o", "--output", type=Path, default=None, help="PNG path (default: next to the JSON)")
    p.add_argument("--dpi", type=int, default=110)
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_recovery: matplotlib is missing; pip install -e '.[report]'", file=sys.stderr)
        return 2
    out = args.output or args.timeline.with_name("recovery.png")
    plot(json.loads(args.timeline.read_text()), out, args.dpi)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
