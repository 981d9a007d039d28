"""The dpeer side of scripts/bench_recovery.py: a ``LocalCluster`` of ``dpeer start --job demo``
daemons, read through their workers' reports and ledgers, its kill/restart trials and the audit."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

from recovery_common import (
    BASE_ENV,
    GLOBAL_BATCH,
    LR,
    MICRO_BATCH,
    NODES,
    SEED,
    STEPS,
    fmt_bd,
    import_floor,
    pinned,
    read_jsonl,
    steady_window,
    wait_until,
)

from dpeer.channel.local import read_reports
from dpeer.launch.cluster import LocalCluster, LocalNode
from dpeer.trainer.audit import audit, read_ledger, read_records
from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.sampler import GlobalBatchSampler


class DpeerSide:
    """One dpeer job: a daemon (and its worker) per box, optionally each box pinned to a core."""

    name = "dpeer"

    def __init__(self, root: Path, ckpt_every: int, sub: str = "dpeer", digest_every: int | None = None,
                 base_port: int | None = None, nodes: list[str] = NODES, cores: dict[str, int] | None = None,
                 reduction: str = "exact") -> None:
        config = {"training": {"steps": STEPS, "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH,
                               "seed": SEED, "lr": LR, "checkpoint_every": ckpt_every, "reduction": reduction}}
        if digest_every is not None:
            config["training"]["digest_every"] = digest_every
        self.nodes = nodes
        self.cores = cores or {}
        self.cluster = LocalCluster(root / sub, len(nodes), job="demo", config=config, env=dict(BASE_ENV),
                                    base_port=base_port)

    def node(self, n: str) -> LocalNode:
        """The cluster's node named n."""
        return self.cluster.node(n)

    def start(self, n: str, join: list[str] | None = None) -> None:
        """Start n's daemon (on its core when pinned), joining through `join` (default: the others)."""
        with pinned(self.cores.get(n)):
            self.cluster.start(self.node(n), join=join)

    def start_all(self) -> None:
        """Start the first box as the founder, then the others joining through it."""
        first, *rest = self.nodes
        self.start(first, join=[])
        for n in rest:
            self.start(n)

    def tops(self) -> dict[str, int]:
        """Per box, the pid of its daemon (the worker is below it)."""
        return {n: self.node(n).proc.pid for n in self.nodes}

    def reports(self, n: str) -> list[dict]:
        """Every report n's worker wrote so far."""
        return read_reports(str(self.node(n).data_dir / "worker"), n)

    def ledger(self, n: str) -> list[dict]:
        """n's ledger of committed steps."""
        return read_ledger(str(self.node(n).data_dir / "worker" / "ledger.jsonl"))

    def daemon_log(self, n: str) -> list[dict]:
        """n's daemon log records."""
        return read_jsonl(self.node(n).log_path)

    def committed_in_group(self, n: str, world: int, after: float) -> tuple[dict, dict] | None:
        """(formed, first progress) of the first group of `world` formed after `after` that committed a step."""
        formed = None
        for r in self.reports(n):
            if r.get("t", 0) <= after:
                continue
            if r["kind"] == "formed":
                formed = r if r.get("world") == world else None
            elif r["kind"] == "progress" and formed is not None:
                return formed, r
        return None

    def training_together(self, nodes: list[str], world: int, after: float) -> dict | None:
        """Per node, (formed, first progress) of its first group of `world` after `after` (None if not all yet)."""
        got = {}
        for n in nodes:
            c = self.committed_in_group(n, world, after)
            if c is None:
                return None
            got[n] = c
        return got

    def steady_records(self, n: str) -> list[tuple[float, int]]:
        """(t, step) of n's steps committed in groups of every box."""
        out, world = [], 0
        for r in self.reports(n):
            if r["kind"] == "formed":
                world = r.get("world", 0)
            elif r["kind"] == "progress" and world == len(self.nodes):
                out.append((r["t"], r["step"]))
        return out

    def settled(self, after: float) -> bool:
        """Every box's latest group has every box and it committed 5 steps in it after `after`."""
        for n in self.nodes:
            recs = self.reports(n)
            formed = [i for i, r in enumerate(recs) if r["kind"] == "formed"]
            if not formed or recs[formed[-1]].get("world") != len(self.nodes):
                return False
            if sum(1 for r in recs[formed[-1]:] if r["kind"] == "progress" and r["t"] > after) < 5:
                return False
        return True

    def role(self, n: str) -> str:
        """n's Raft role from its status, ? when it does not answer."""
        doc = asyncio.run(self.cluster.status(self.node(n)))
        return (doc or {}).get("role", "?")


def run_dpeer(side: DpeerSide, trials: int, window: float, log: Callable[[str], None], res: dict) -> dict:
    """Kill and restart one box per trial (victims n2, n3, n1, ...), then audit the ledgers; into res."""
    res |= {"recover": [], "redone": [], "rejoin": [], "redone_rejoin": [], "steady": [],
            "kill_breakdown": [], "rejoin_breakdown": [], "load": [], "victim_role": []}
    c = side.cluster
    t0 = time.time()
    side.start_all()
    got = wait_until(lambda: side.training_together(NODES, 3, t0), 240, "dpeer: 3 boxes training", 0.05)
    log(f"dpeer: 3 boxes training {max(p['t'] for _f, p in got.values()) - t0:.1f}s after launch")
    for i in range(trials):
        victim = NODES[(i + 1) % 3]
        survivors = [n for n in NODES if n != victim]
        steady_window(side, survivors[0], window, res)
        role = side.role(victim)
        res["victim_role"].append(role)
        marks = {n: len(side.ledger(n)) for n in survivors}
        t_kill = time.time()
        c.kill(side.node(victim), signal.SIGKILL)
        got = wait_until(lambda sv=survivors, tk=t_kill: side.training_together(sv, 2, tk), 120,
                         f"dpeer: survivors of {victim} training", 0.02)
        t_rec = max(p["t"] for _f, p in got.values())
        redone = 0
        for n in survivors:
            led = side.ledger(n)
            seen = {e["step"] for e in led[: marks[n]]}
            redone = max(redone, sum(1 for e in led[marks[n]:] if e["step"] in seen))
        f0, p0 = got[survivors[0]]
        fails = [r for r in side.reports(survivors[0]) if r["kind"] == "failed" and t_kill < r["t"] <= f0["t"]]
        t_fail = fails[0].get("caught_t", fails[0]["t"]) if fails else None
        t_form_start = f0["t"] - f0.get("seconds", 0.0)
        bd = {"detect(failed)": (t_fail - t_kill) if t_fail else float("nan"),
              "wait_view": t_form_start - (t_fail or t_kill),
              "form": f0.get("form_s", float("nan")), "heal": f0.get("heal_s", float("nan")),
              "to_first_step": p0["t"] - f0["t"]}
        res["recover"].append(t_rec - t_kill)
        res["redone"].append(redone)
        res["kill_breakdown"].append(bd)
        log(f"dpeer trial {i + 1}: killed {victim} ({role}); survivors committed in a group of 2 "
            f"{t_rec - t_kill:.3f}s later at step {p0['step']} (redone {redone}) {fmt_bd(bd)}")
        floor = import_floor()  # the bare import on this box now, as the survivors train on
        marks2 = {n: len(side.ledger(n)) for n in survivors}
        t_start = time.time()
        side.start(victim)
        got = wait_until(lambda v=victim, ts=t_start: side.training_together([v], 3, ts), 180,
                         f"dpeer: {victim} back in a group of 3", 0.02)
        f1, p1 = got[victim]
        dl = [r for r in side.daemon_log(victim) if r.get("ts", 0) > t_start]
        t_joined = next((r["ts"] for r in dl if "ready True" in r.get("msg", "")), None)
        rep = [r for r in side.reports(victim) if r["t"] > t_start]
        built = next((r for r in rep if r["kind"] == "built"), {})
        t_wait = next((r["t"] for r in rep if r["kind"] == "waiting"), None)
        nan = float("nan")
        bd = {"bare_import_torch": floor["torch_wall_s"], "bare_import_torch+dynamo": floor["torch+dynamo_wall_s"],
              "start_to_built": built.get("t", nan) - t_start,
              "worker_import_cpu": built.get("import_cpu_s", nan), "worker_build_cpu": built.get("build_cpu_s", nan),
              "built_to_ready": (t_wait - built.get("t", nan)) if t_wait else nan,
              "ready_to_join_acked": (t_joined - t_wait) if (t_wait and t_joined) else nan,
              "wait_view": (f1["t"] - f1.get("seconds", 0) - t_wait) if t_wait else nan,
              "form": f1.get("form_s", nan), "heal": f1.get("heal_s", nan),
              "to_first_step": p1["t"] - f1["t"]}
        res["rejoin"].append(p1["t"] - t_start)
        res["rejoin_breakdown"].append(bd)
        # does the group go back when the box rejoins? steps committed twice after the restart
        again = 0
        for n in survivors:
            led = side.ledger(n)
            seen = {e["step"] for e in led[: marks2[n]]}
            again = max(again, sum(1 for e in led[marks2[n]:] if e["step"] in seen))
        res["redone_rejoin"].append(again)
        log(f"dpeer trial {i + 1}: restarted {victim}; it committed in a group of 3 after "
            f"{p1['t'] - t_start:.2f}s at step {p1['step']} {fmt_bd(bd)}")
        wait_until(lambda t=p1["t"]: side.settled(t), 120, "dpeer: settled", 0.05)
    res["audit"] = audit_ledgers(side)
    problems = res["audit"]["problems"]
    log(f"dpeer audit over steps 0..{res['audit']['steps_checked'] - 1}: {'clean' if not problems else problems[:5]}")
    return res


def audit_ledgers(side: DpeerSide) -> dict:
    """Audit every ledger: no committed step lost, each micro-batch trained once by the group that
    committed it (as its ranks recorded), each sample once per epoch, replicas agree."""
    # The group trains on while this reads: first the steps every box has committed, then the
    # records, audited below them (a rank writes what it trained before the step commits
    # anywhere), so no step in flight while the files were read looks half-recorded.
    upto = min(max((e["step"] for e in side.ledger(n)), default=-1) for n in side.nodes) + 1
    ledgers = {n: read_records(str(side.node(n).data_dir / "worker" / "ledger.jsonl")) for n in side.nodes}
    sampler = GlobalBatchSampler(DEFAULTS["dataset_len"], GLOBAL_BATCH, SEED)
    return {"steps_checked": upto, "problems": audit(ledgers, upto, sampler, MICRO_BATCH)}
