"""Agreement benchmark: commit latency and leader failover, real `dpeer start` daemons on loopback.

Every figure comes from real processes (LocalCluster), measured from a client process:

- commit latency: sequential `kv put`s over one persistent NodeClient to the leader; a put is
  done when the leader answers committed (the entry is committed by a majority of voters and
  applied on the leader). Same-client floors are printed next to it: a `status` RPC (one gRPC
  round trip plus building the status JSON) and a linearizable `kv get` (ReadIndex round).
- failover: SIGKILL (or with --signal stop, SIGSTOP) the leader of a formed, quiet cluster, then poll every survivor's status
  every ~10 ms (one persistent client and one polling task per survivor) and record when (a) a
  survivor first reports itself leader of a higher term, (b) every survivor names that new
  leader, (c) a survivor first reports a higher group generation (the next committed view),
  (d) every survivor does. The killed node is restarted (a stopped one SIGCONTed) and the
  cluster re-forms before the next trial, so the leader moves around.

    python scripts/bench_agreement.py            # 3, 5, 7 and 7-voter clusters, ~5 min
    python scripts/bench_agreement.py --quick    # 3 and 5 nodes, fewer puts and trials, < 2 min
    python scripts/bench_agreement.py --sizes 5 --puts 500 --trials 9
    python scripts/bench_agreement.py --quick --sizes 5 --signal stop   # a hung leader

Sizes: "7" runs the shipped default (at most 5 voters, so 2 learners); "7v" sets max_voters: 7.
Every daemon this script starts is SIGKILLed on exit, Ctrl-C and exceptions included.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import math
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpeer import errors  # noqa: E402
from dpeer.launch.cluster import LocalCluster, LocalNode, free_port_block  # noqa: E402
from dpeer.transport.client import NodeClient  # noqa: E402

FORM_TIMEOUT = 90.0
TRIAL_TIMEOUT = 15.0
POLL_INTERVAL = 0.01
DEFAULT_MAX_VOTERS = 5

# -- process hygiene ----------------------------------------------------------------------------
_LIVE: list[LocalCluster] = []


SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def _stop_everything() -> None:
    """SIGKILL every daemon any cluster of this process started (idempotent; by PID group only)."""
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop_all()


def install_cleanup() -> None:
    """Make SIGTERM/SIGHUP behave like Ctrl-C (unwinds through the finally blocks) and kill at exit."""
    atexit.register(_stop_everything)

    def _raise(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


@contextlib.contextmanager
def local_cluster(size: int, config: dict[str, Any] | None = None, keep: bool = False) -> Iterator[LocalCluster]:
    """A started LocalCluster in a fresh temp dir, always SIGKILLed and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dpeer-bench-"))
    # Start the port search at a random place: other test runs on this box start LocalClusters at
    # 20000, and one of them could take a killed node's port before the node is restarted.
    base = free_port_block(size, start=random.randrange(30000, 58000, 2 * size))
    cluster = LocalCluster(root / "c", size, base_port=base, config=config)
    _LIVE.append(cluster)
    failed = True
    try:
        cluster.start_all()
        yield cluster
        failed = False
    finally:
        cluster.stop_all()
        _LIVE.remove(cluster)
        if failed:
            for node in cluster.nodes:
                print(f"--- {node.node_id} log tail ({node.log_path}):\n{cluster.tail(node, 8)}", file=sys.stderr)
        if not keep and not failed:
            shutil.rmtree(root, ignore_errors=True)


# -- status polling ------------------------------------------------------------------------------
class Pollers:
    """One persistent NodeClient per node, so polling costs one RPC and no connection set-up."""

    def __init__(self, cluster: LocalCluster, timeout: float = 1.0) -> None:
        self.cluster = cluster
        self.clients = {n.node_id: NodeClient(n.addr, timeout=timeout) for n in cluster.nodes}

    async def status(self, node_id: str, timeout: float | None = None) -> dict[str, Any] | None:
        """The node's status document, or None when it does not answer."""
        client = self.clients[node_id]
        try:
            if timeout is None:
                reply = await client.status()
            else:
                reply = await client._call("Status", _status_request(), timeout)
            return json.loads(reply.json)
        except errors.PeerError:
            return None

    async def running(self) -> dict[str, dict[str, Any] | None]:
        """Every running node's status (None for those that do not answer)."""
        ids = [n.node_id for n in self.cluster.nodes if n.running]
        docs = await asyncio.gather(*(self.status(i) for i in ids))
        return dict(zip(ids, docs))

    async def close(self) -> None:
        """Close every channel."""
        for client in self.clients.values():
            await client.__aexit__(None, None, None)


def _status_request() -> Any:
    from dpeer.proto.v1 import dpeer_pb2 as pb

    return pb.StatusRequest()


def member_states(doc: dict[str, Any]) -> dict[str, str]:
    """node_id -> gossip state in one status document."""
    return {m["node_id"]: m["state"] for m in doc["members"]}


def stable(docs: dict[str, dict[str, Any] | None], size: int, voters: int) -> bool:
    """Every node answers, names one leader, sees `size` alive members, and is in one view of `size`
    with the same generation; the leader has `voters` voters and has applied everything committed."""
    if len(docs) != size or any(d is None for d in docs.values()):
        return False
    live = [d for d in docs.values() if d is not None]
    leaders = {d["leader"] for d in live}
    if len(leaders) != 1 or None in leaders:
        return False
    leader = docs.get(next(iter(leaders)))
    if leader is None or leader["role"] != "leader" or len(leader["voters"]) != voters:
        return False
    gens = {d["group"]["generation"] if d["group"] else None for d in live}
    return (None not in gens and len(gens) == 1
            and all(d["group"]["world_size"] == size for d in live)
            and all(sum(s == "alive" for s in member_states(d).values()) == size for d in live)
            and leader["last_applied"] == leader["commit_index"])


async def wait_until(pollers: Pollers, predicate: Callable[[dict], bool], timeout: float, what: str,
                     interval: float = 0.05) -> dict[str, dict[str, Any] | None]:
    """Poll every running node until predicate(statuses); TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    docs: dict[str, dict[str, Any] | None] = {}
    while time.monotonic() < deadline:
        docs = await pollers.running()
        if predicate(docs):
            return docs
        await asyncio.sleep(interval)
    brief = {k: (None if d is None else {"leader": d["leader"], "role": d["role"], "group": d["group"],
                                         "members": member_states(d)}) for k, d in docs.items()}
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {json.dumps(brief)[:1500]}")


async def wait_stable(pollers: Pollers, size: int, voters: int, timeout: float = FORM_TIMEOUT) -> dict:
    """Wait for stable(); returns the statuses."""
    return await wait_until(pollers, lambda d: stable(d, size, voters), timeout,
                            f"{size} nodes formed with {voters} voters")


# -- statistics ----------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list; inf entries sort last."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def med(values: list[float]) -> float:
    """Median, or nan for an empty list."""
    return statistics.median(values) if values else math.nan


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds for the tables."""
    return "n/a" if math.isnan(seconds) else ("never" if math.isinf(seconds) else f"{seconds * 1e3:.1f}")


# -- figures -------------------------------------------------------------------------------------
def parse_size(spec: str) -> tuple[int, int, dict[str, Any] | None]:
    """'7' -> (7, 5 voters, default config); '7v' -> (7, 7 voters, max_voters: 7)."""
    if spec.endswith("v"):
        n = int(spec[:-1])
        return n, n, {"max_voters": n}
    n = int(spec)
    return n, min(n, DEFAULT_MAX_VOTERS), None


async def commit_latency(cluster: LocalCluster, pollers: Pollers, size: int, voters: int, puts: int,
                         rounds: int, warmup: int, profile_dir: Path | None, label: str) -> dict[str, Any]:
    """Sequential puts through one persistent client to the leader, `rounds` rounds of `puts`."""
    docs = await wait_stable(pollers, size, voters)
    leader_id = next(d for d in docs.values() if d is not None)["leader"]
    leader = cluster.node(leader_id)
    out: dict[str, Any] = {"leader": leader_id, "rounds": []}
    spy = _start_py_spy(leader, profile_dir, label) if profile_dir else None
    value = "v" * 16
    try:
        async with NodeClient(leader.addr, timeout=10.0) as client:
            for i in range(warmup):
                await client.kv_put(f"warm{i}", value)
            all_lat: list[float] = []
            for r in range(rounds):
                lat = []
                for i in range(puts):
                    t = time.perf_counter()
                    reply = await client.kv_put(f"r{r}k{i:06d}", value)
                    lat.append(time.perf_counter() - t)
                    assert reply.committed and reply.leader_id == leader_id, reply
                all_lat += lat
                out["rounds"].append({"p50": pct(lat, 50), "p99": pct(lat, 99), "mean": statistics.fmean(lat)})
            out["all"] = all_lat
            tenth = max(1, len(all_lat) // 10)
            out["first_tenth_p50"], out["last_tenth_p50"] = pct(all_lat[:tenth], 50), pct(all_lat[-tenth:], 50)
            floor = []
            for _ in range(max(50, puts // 3)):
                t = time.perf_counter()
                await client.status()
                floor.append(time.perf_counter() - t)
            out["status_p50"] = pct(floor, 50)
            reads = []
            for i in range(max(50, puts // 3)):
                t = time.perf_counter()
                await client.kv_get(f"r0k{i:06d}")
                reads.append(time.perf_counter() - t)
            out["get_p50"], out["get_p99"] = pct(reads, 50), pct(reads, 99)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)
    return out


def _start_py_spy(node: LocalNode, profile_dir: Path, label: str) -> subprocess.Popen | None:
    """py-spy (if installed) recording the leader for the duration of the commit run."""
    exe = shutil.which("py-spy")
    if exe is None or node.proc is None:
        print(f"(py-spy not found; no profile for {label})", file=sys.stderr)
        return None
    profile_dir.mkdir(parents=True, exist_ok=True)
    out = profile_dir / f"leader-commit-{label}.txt"
    return subprocess.Popen([exe, "record", "-p", str(node.proc.pid), "-r", "250", "--format", "raw",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def failover_trial(cluster: LocalCluster, pollers: Pollers, size: int, voters: int,
                         settle: float, sig: int = signal.SIGKILL) -> dict[str, float]:
    """SIGKILL (or SIGSTOP) the leader of a formed cluster; seconds until a new leader and the
    next view. A killed leader is restarted afterwards, a stopped one SIGCONTed."""
    docs = await wait_stable(pollers, size, voters)
    await asyncio.sleep(settle)
    docs = await wait_stable(pollers, size, voters)
    any_doc = next(d for d in docs.values() if d is not None)
    old = any_doc["leader"]
    old_term = docs[old]["term"]
    old_gen = any_doc["group"]["generation"]
    survivors = [n.node_id for n in cluster.nodes if n.node_id != old]
    seen: dict[str, dict[str, float]] = {s: {} for s in survivors}
    done = asyncio.Event()

    def complete() -> bool:
        return all({"knows", "view", "dead"} <= seen[s].keys() for s in survivors)

    async def watch(s: str, t0: float) -> None:
        while not done.is_set():
            doc = await pollers.status(s, timeout=0.5)
            t = time.perf_counter() - t0
            if doc is not None:
                mine = seen[s]
                if doc["role"] == "leader" and doc["term"] > old_term:
                    mine.setdefault("elected", t)
                if doc["leader"] not in (None, old) and doc["term"] > old_term:
                    mine.setdefault("knows", t)
                group = doc["group"]
                if group is not None and group["generation"] > old_gen:
                    mine.setdefault("view", t)
                if member_states(doc).get(old) == "dead":
                    mine.setdefault("dead", t)
                if complete():
                    done.set()
            await asyncio.sleep(POLL_INTERVAL)

    t0 = time.perf_counter()
    cluster.kill(cluster.node(old), sig)
    tasks = [asyncio.create_task(watch(s, t0)) for s in survivors]
    try:
        await asyncio.wait_for(done.wait(), TRIAL_TIMEOUT)
    except asyncio.TimeoutError:
        pass
    done.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    if sig == signal.SIGSTOP:
        cluster.kill(cluster.node(old), signal.SIGCONT)
    else:
        cluster.start(cluster.node(old))

    def first(key: str) -> float:
        return min((seen[s].get(key, math.inf) for s in survivors), default=math.inf)

    def last(key: str) -> float:
        return max((seen[s].get(key, math.inf) for s in survivors), default=math.inf)

    return {"old_leader": old, "elected": first("elected"), "leader_everywhere": last("knows"),
            "view_first": first("view"), "view_everywhere": last("view"), "dead_first": first("dead"),
            "dead_everywhere": last("dead")}


async def run_size(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """All figures for one cluster size on one cluster."""
    size, voters, config = parse_size(spec)
    result: dict[str, Any] = {"spec": spec, "size": size, "voters": voters}
    t_start = time.monotonic()
    with local_cluster(size, config) as cluster:
        pollers = Pollers(cluster)
        try:
            t = time.monotonic()
            await wait_stable(pollers, size, voters)
            result["form_s"] = time.monotonic() - t
            result["commit"] = await commit_latency(cluster, pollers, size, voters, args.puts, args.rounds,
                                                    args.warmup, args.profile, spec)
            trials = []
            for i in range(args.trials):
                trial = await failover_trial(cluster, pollers, size, voters, args.settle, SIGNALS[args.signal])
                trials.append(trial)
                print(f"  [{spec}] failover trial {i + 1}: old leader {trial['old_leader']}, "
                      f"elected {fmt_ms(trial['elected'])} ms, leader everywhere {fmt_ms(trial['leader_everywhere'])} ms, "
                      f"view {fmt_ms(trial['view_first'])} ms (everywhere {fmt_ms(trial['view_everywhere'])} ms), "
                      f"dead everywhere {fmt_ms(trial['dead_everywhere'])} ms", file=sys.stderr, flush=True)
            result["failover"] = trials
        finally:
            await pollers.close()
    result["wall_s"] = time.monotonic() - t_start
    c = result["commit"]
    print(f"  [{spec}] commit p50 {fmt_ms(med([r['p50'] for r in c['rounds']]))} ms "
          f"p99 {fmt_ms(med([r['p99'] for r in c['rounds']]))} ms; wall {result['wall_s']:.0f} s",
          file=sys.stderr, flush=True)
    return result


# -- report --------------------------------------------------------------------------------------
def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Markdown tables on stdout (medians), raw figures as JSON when --json is given."""
    print(f"### Commit latency ({args.rounds} rounds x {args.puts} sequential puts per size, "
          f"16-byte values, distinct keys; medians of the per-round figures)\n")
    print("| nodes | voters | put p50 | put p99 | p50 first 10% / last 10% | status RPC p50 "
          "| linearizable get p50 / p99 | p50 vs 20 ms target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r["commit"]
        p50, p99 = med([x["p50"] for x in c["rounds"]]), med([x["p99"] for x in c["rounds"]])
        print(f"| {r['size']} | {r['voters']} | {fmt_ms(p50)} ms | {fmt_ms(p99)} ms "
              f"| {fmt_ms(c['first_tenth_p50'])} / {fmt_ms(c['last_tenth_p50'])} ms | {fmt_ms(c['status_p50'])} ms "
              f"| {fmt_ms(c['get_p50'])} / {fmt_ms(c['get_p99'])} ms | {p50 / 0.020:.2f}x |")
    print(f"\n### Leader {SIGNALS[args.signal].name} (median of {args.trials} trials per size; max in brackets; "
          f"status polled every {POLL_INTERVAL * 1e3:.0f} ms per survivor)\n")
    print("| nodes | voters | new leader (first) | leader known everywhere | next view (first) "
          "| next view everywhere | old leader dead everywhere | view vs 1 s target |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        tr = r["failover"]

        def cell(key: str) -> str:
            vals = [t[key] for t in tr]
            return f"{fmt_ms(med(vals))} ms ({fmt_ms(max(vals))})"
        view = med([t["view_everywhere"] for t in tr])
        print(f"| {r['size']} | {r['voters']} | {cell('elected')} | {cell('leader_everywhere')} | {cell('view_first')} "
              f"| {cell('view_everywhere')} | {cell('dead_everywhere')} | {view / 1.0:.2f}x |")
    print()
    for r in results:
        print(f"<!-- {r['spec']}: formed in {r['form_s']:.1f} s, {r['wall_s']:.0f} s wall -->")


def main() -> None:
    """Parse flags, run every size, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 and 5 nodes, 150 puts, 5 trials (< 2 min)")
    parser.add_argument("--sizes", help="comma-separated sizes; '7v' = 7 voters (default 3,5,7,7v)")
    parser.add_argument("--puts", type=int, help="sequential puts per round (default 300, quick 150)")
    parser.add_argument("--rounds", type=int, help="rounds of puts per size (default 3, quick 1)")
    parser.add_argument("--warmup", type=int, default=20, help="puts before measuring")
    parser.add_argument("--trials", type=int, help="leader kills per size (default 7, quick 5)")
    parser.add_argument("--signal", choices=sorted(SIGNALS), default="kill",
                        help="how the leader fails: kill (SIGKILL, then restart) or stop (SIGSTOP, then SIGCONT)")
    parser.add_argument("--settle", type=float, default=1.0, help="quiet seconds after re-forming, before a kill")
    parser.add_argument("--profile", type=Path, help="record the leader with py-spy during the puts into DIR")
    parser.add_argument("--json", type=Path, help="also write every raw figure to this file")
    args = parser.parse_args()
    args.sizes = (args.sizes or ("3,5" if args.quick else "3,5,7,7v")).split(",")
    args.puts = args.puts or (150 if args.quick else 300)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.trials = args.trials or (5 if args.quick else 7)
    install_cleanup()
    t0 = time.monotonic()
    results = []
    try:
        for spec in args.sizes:
            results.append(asyncio.run(run_size(spec, args)))
    finally:
        _stop_everything()
    report(results, args)
    print(f"<!-- total {time.monotonic() - t0:.0f} s wall -->")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
