"""The checks of a finished run, each a list of violations: liveness, protocol, kv, training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpeer.chaos.history import window_counts
from dpeer.chaos.linear import Op, check_history
from dpeer.chaos.options import DISRUPTIVE
from dpeer.chaos.reference import reference_final
from dpeer.chaos.schedule import Fault

if TYPE_CHECKING:
    from dpeer.chaos.run import Run

MAX_REL_DIFF = 1e-4


def after_the_last_step(faults: list[Fault], steps: int) -> list[Fault]:
    """The faults after which no step can follow: they hit once the survivors had committed the job's
    last step, or the old group committed it during the fault (a partition through the faults hook
    leaves Gloo connected, so the old group trains on until it is fenced, and may finish the job)."""
    return [f for f in faults if max(f.step_at, f.old_gen_step) >= steps]


def check_liveness(faults: list[Fault], max_recovery: float, steps: int) -> dict[str, list[str]]:
    """Every faulted node back in a group; the survivors commit a step within `max_recovery` of each
    fault that hit before the job's last step (`steps`) was committed."""
    unfinished = [f"fault {f.id} ({f.kind} {','.join(f.nodes)}): the node was not back in a group"
                  for f in faults if f.kind in DISRUPTIVE and f.back_s is None]
    last = after_the_last_step(faults, steps)
    slow = [_slow_recovery(f, max_recovery) for f in faults
            if f not in last and (f.recovered_s is None or f.recovered_s > max_recovery)]
    return {"every faulted node back in a group": unfinished,
            "training resumes after every fault (liveness)": slow}


def _slow_recovery(f: Fault, max_recovery: float) -> str:
    head = f"fault {f.id} ({f.kind} {','.join(f.nodes)} at {f.at:.0f}s): "
    if f.recovered_s is None:
        return head + "the survivors never committed another step"
    return head + f"the survivors' next committed step came {f.recovered_s:.0f}s later (limit {max_recovery:.0f}s)"


def check_kv_history(history: list[Op], clients: int) -> tuple[list[str], str]:
    """The row "kv history linearizable": the search's problems and figures. The end-of-run reads
    alone show nothing of the faults, so the row also needs at least one answered operation of the
    chaos window, and fails without one."""
    result = check_history(history)
    sent, answered = window_counts(history, clients)
    problems = result.problems()
    if answered == 0:
        problems.append(f"no operation of the chaos window was answered ({sent} sent): only the end-of-run reads "
                        "could be checked, which show nothing of the faults")
    note = (f"{result.note()}; chaos window: {answered} of {sent} operations answered by {clients} clients "
            "(the row needs at least 1), then every key read through every node")
    return problems, note


def check_protocol(samples: list[dict]) -> dict[str, list[str]]:
    """Raft and group invariants over every status sample of every node."""
    return {"one leader per term": _one_leader_per_term(samples),
            "commit index never decreases": _commit_never_decreases(samples),
            "one view per generation": _one_view_per_generation(samples)}


def protocol_notes(samples: list[dict]) -> dict[str, str]:
    """What each protocol check compared (the report's figures)."""
    terms = {s["term"] for s in samples if s["role"] == "leader" or s["leader"]}
    lives = {(s["node"], s["life"]) for s in samples}
    gens = {s["gen"] for s in samples if s["gen"] is not None}
    return {"one leader per term": f"{len(terms)} terms with a leader over {len(samples)} status samples",
            "commit index never decreases": f"{len(lives)} node lifetimes",
            "one view per generation": f"{len(gens)} generations"}


def _one_leader_per_term(samples: list[dict]) -> list[str]:
    leaders: dict[int, set[str]] = {}
    for s in samples:
        if s["role"] == "leader":
            leaders.setdefault(s["term"], set()).add(s["node"])
        if s["leader"]:
            leaders.setdefault(s["term"], set()).add(s["leader"])
    return [f"term {t} had leaders {sorted(ls)}" for t, ls in sorted(leaders.items()) if len(ls) > 1]


def _commit_never_decreases(samples: list[dict]) -> list[str]:
    """Per node lifetime: a wiped node starts a new one."""
    problems: list[str] = []
    last: dict[tuple[str, int], tuple[float, int]] = {}
    for s in samples:
        key = (s["node"], s["life"])
        if key in last and s["commit"] < last[key][1]:
            problems.append(f"{s['node']} commit_index went from {last[key][1]} (t={last[key][0]}s) "
                            f"to {s['commit']} (t={s['t']}s)")
        last[key] = (s["t"], s["commit"])
    return problems


def _one_view_per_generation(samples: list[dict]) -> list[str]:
    views: dict[int, set[tuple]] = {}
    for s in samples:
        if s["gen"] is not None:
            views.setdefault(s["gen"], set()).add(tuple(s["members"]))
    return [f"generation {g} has views {sorted(map(list, vs))}" for g, vs in sorted(views.items()) if len(vs) > 1]


def check_training(run: Run) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Ledger audit and final models, in a child process of the trainer layer
    (dpeer/trainer/chaos_check.py): this package stays free of torch and trainer imports. Returns
    the check rows (name -> {problems, note, ran}) and the figures."""
    spec = _training_spec(run)
    proc = subprocess.run([sys.executable, "-m", "dpeer.trainer.chaos_check"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        failed = {"problems": [f"the training check failed: {proc.stderr.strip()[-500:]}"],
                  "note": "the checker crashed", "ran": True}
        return {"training checks": failed}, {}
    result = json.loads(proc.stdout)
    return result["checks"], result["figures"]


def _training_spec(run: Run) -> dict[str, Any]:
    """The chaos_check input: every ledger (wiped data dirs too), the final models, the reference."""
    ledgers = {}
    for node in run.cluster.nodes:
        ledgers[node.node_id] = str(node.data_dir / "worker" / "ledger.jsonl")
        for aside in run.asides[node.node_id]:
            ledgers[f"{node.node_id}@{aside.name}"] = str(aside / "worker" / "ledger.jsonl")
    o = run.opts
    spec: dict[str, Any] = {
        "ledgers": ledgers, "steps": o.steps, "global_batch": o.global_batch, "micro_batch": o.micro_batch,
        "seed": run.config["training"]["seed"], "reduction": o.reduction, "max_rel_diff": MAX_REL_DIFF,
        "finals": {n.node_id: str(n.data_dir / "worker" / "final.pt") for n in run.cluster.nodes},
        "reference_final": None, "reference_skipped": None,
    }
    if not o.reference:
        spec["reference_skipped"] = "not run (--no-reference)"
    elif not all(Path(p).exists() for p in spec["finals"].values()):
        spec["reference_skipped"] = "not run: a node did not finish training"
    else:
        spec["reference_final"] = str(reference_final(run))
    return spec
