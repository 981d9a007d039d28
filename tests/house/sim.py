"""One seeded whole-cluster run: a schedule of faults and operator commands, checked throughout.

`run(seed)` builds a House, lets it found a cluster and start training, then plays a schedule
drawn from the seed for `seconds` virtual seconds: crashes and restarts, wiped disks, pauses,
partitions (both ways, one way, flip-flopping), loss, delay, worker crashes, a power loss, a
box losing power in the middle of a log append (the write torn at a drawn offset, or lost: a
storage fault in the log's last entry), a spare box joining, a graceful leave, `force` on a
box, and a box whose worker turns faster or slower (its shares follow); an operator writes and reads keys throughout. The invariants (checks.py) run every
CHECK_EVERY virtual seconds and after every fault. Then every fault heals and the cluster gets
`settle` seconds to converge, after which acknowledged writes must be present and the newest
group must train.

A seed is one run in any process: every random choice and id comes from the seed, passed
explicitly (each box's daemon gets a seeded rng and a seeded id source, cluster.py), and nothing
that decides depends on how strings hash. `Result.digest` fingerprints a run to compare replays.

Replay one seed, with the daemons' logs: python -m tests.house.sim --seed N -v
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from dpeer import errors

from tests.house.checks import Checker, Op, Violation, trains
from tests.house.cluster import House, quiet_logs
from tests.house.loop import HOST, VirtualLoop

CHECK_EVERY = 0.02
SETTLE_S = 20.0  # past the idle election timeout (12-18 s on lan): a leader back before gossip noticed
SETTLE_POLL = 0.5
HEALTHY_AFTER = 3.0  # seconds without a fault before the cluster counts as healthy (for force)
BOOT_S = 3.0
TMP = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
KINDS = {"crash": 3, "wipe": 1, "pause": 2, "partition": 3, "one_way": 2, "flip_flop": 1, "loss": 2,
         "delay": 1, "worker": 2, "power_loss": 1, "torn_write": 1, "join_spare": 1, "leave": 1, "force": 1,
         "speed": 1}


@dataclass
class Result:
    """What one run did, and the violation it found (None: clean)."""

    seed: int
    violation: str | None
    faults: list[str] = field(default_factory=list)
    virtual_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of this process: the cost of a seed on a free core
    checks: int = 0
    steps: int = 0
    commits: int = 0
    digest: str = ""  # sha256 of what the run did: faults, operations, committed log, steps


    def replay(self, seconds: float, size: int) -> str:
        """The one command that replays this run with the daemons' logs."""
        return f"python -m tests.house.sim --seed {self.seed} --seconds {seconds:g} --size {size} -v"


def run(seed: int, seconds: float = 4.0, size: int = 3, settle: float = SETTLE_S,
        scenario: Callable[[House], Awaitable[None]] | None = None, unready: frozenset[str] = frozenset()) -> Result:
    """Play seed's schedule (or `scenario`, a scripted one) and return what the checks found."""
    loop = VirtualLoop()
    root = Path(tempfile.mkdtemp(prefix=f"house-{seed}-", dir=TMP))
    house = House(loop, seed, root, size=size, unready=unready)
    result = Result(seed, None)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        loop.run_until_complete(_play(house, result, seconds, settle, scenario))
    finally:
        loop.run_until_complete(house.close())
        loop.close()
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu
    result.virtual_s = loop.time()
    result.steps = house.training.steps
    return result


async def _play(house: House, result: Result, seconds: float, settle: float,
                scenario: Callable[[House], Awaitable[None]] | None) -> None:
    checker = Checker(house)
    house.checker = checker  # type: ignore[attr-defined]
    ticker = asyncio.get_running_loop().create_task(house.ticker())
    background: list[asyncio.Task] = []
    try:
        for nid in house.founders:
            house.start(nid, join=[] if nid == house.founders[0] else None)
        await _checked(house, checker, BOOT_S)
        ops = _Operator(house, checker, random.Random(house.seed * 31 + 7))
        background.append(asyncio.get_running_loop().create_task(ops.writer()))
        background.append(asyncio.get_running_loop().create_task(ops.reader()))
        if scenario is not None:
            background.append(asyncio.get_running_loop().create_task(scenario(house)))
        else:
            background.append(asyncio.get_running_loop().create_task(_faults(house, checker, result, seconds)))
        await _checked(house, checker, seconds, ops)
        ops.stop = True
        await _heal_all(house)
        # settle until the cluster converged (a leader known, the newest group stepping, every
        # acknowledged write applied on the most advanced box), at most
        # `settle` seconds: most seeds converge in a second or two, a few wait out an idle timeout
        healed, why = house.loop.time(), "not checked"
        while why and house.loop.time() - healed < settle:
            await _checked(house, checker, SETTLE_POLL, ops)
            why = trains(house, checker, house.loop.time() - SETTLE_POLL) if checker.leader_known() else "no leader"
            why = why or checker.missing_write()  # a write may still be on its way to the most advanced box
        checker.final()
        if why:
            raise Violation(f"training does not resume after the faults healed: {why}")
    except Violation as exc:
        result.violation = str(exc)
    finally:
        result.checks = checker.checks
        result.commits = max(checker.committed, default=0)
        result.digest = _digest(result, checker, house)
        for task in background + [ticker]:
            task.cancel()


def _digest(result: Result, checker: Checker, house: House) -> str:
    """A run's fingerprint: two runs of a seed are the same run when their digests are equal."""
    ops = [(o.kind, o.key, o.value, o.start, o.end, o.ok) for o in checker.ops]
    trace = [result.violation, result.faults, ops, sorted(checker.committed.items()), house.training.steps,
             house.loop.time()]
    return hashlib.sha256(json.dumps(trace, default=repr).encode()).hexdigest()


async def _checked(house: House, checker: Checker, seconds: float, ops: "_Operator | None" = None) -> None:
    """Let `seconds` pass, checking every CHECK_EVERY; a violation found by a task surfaces here."""
    end = house.loop.time() + seconds
    while house.loop.time() < end:
        await asyncio.sleep(CHECK_EVERY)
        if ops is not None and ops.violation is not None:
            raise ops.violation
        checker.check()


async def _heal_all(house: House) -> None:
    house.heal()
    house.links.set_loss(0.0)
    house.links.default.delay_max = 0.003
    for nid, box in house.boxes.items():
        if box.paused:
            house.resume(nid)
        elif box.daemon is None and not box.gone:
            house.start(nid)


async def _faults(house: House, checker: Checker, result: Result, seconds: float) -> None:
    """Draw and apply faults until `seconds` have passed; each ends by itself."""
    rng = random.Random(house.seed)
    kinds, weights = list(KINDS), list(KINDS.values())
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(rng.uniform(0.1, 0.8))
        if loop.time() >= end:
            return  # the faults end with the schedule: the settle that follows starts from healed links
        kind = rng.choices(kinds, weights)[0]
        note = await _apply(house, rng, kind)
        if note:
            result.faults.append(f"t={loop.time():.3f} {note}")


async def _apply(house: House, rng: random.Random, kind: str) -> str:
    loop = asyncio.get_running_loop()
    members = [n for n, b in house.boxes.items() if not b.gone]
    up = house.up()
    if not up:
        return ""
    victim = rng.choice(up)
    length = rng.uniform(0.3, 2.0)
    later = loop.call_later
    healthy = loop.time() > house.faulty_until + HEALTHY_AFTER and set(up) == set(members)
    if kind == "force":
        if not healthy:
            return ""
        # misuse: on a healthy cluster the guard must refuse (force is for a majority lost for good)
        voters = [victim] + [n for n in up if n != victim and rng.random() < 0.5]
        loop.create_task(_ignore(house.client(victim).force(voters)))
        return f"force on {victim} with voters {voters} (healthy cluster: must be refused)"
    if kind == "wipe" and not healthy:
        return ""  # a second wipe before the first box was replaced loses a majority's data for good
    if kind not in ("worker", "join_spare", "leave"):
        house.faulty_until = max(house.faulty_until, loop.time() + length * (2 if kind == "flip_flop" else 1))
    if kind == "crash":
        await house.crash(victim)
        later(length, _restart, house, victim)
        return f"crash {victim} for {length:.2f}s"
    if kind == "torn_write":
        index, offset = await house.tear(victim, 0.0 if rng.random() < 0.2 else rng.random())
        later(length, _restart, house, victim)
        return f"torn write on {victim}: entry {index} cut at byte {offset}, back in {length:.2f}s"
    if kind == "wipe":
        await house.wipe(victim)
        later(length, _restart, house, victim)
        return f"wipe {victim}, back in {length:.2f}s"
    if kind == "pause":
        house.pause(victim)
        later(length, house.resume, victim)
        return f"pause {victim} for {length:.2f}s"
    if kind in ("partition", "one_way"):
        others = [n for n in members if n != victim]
        for other in others:
            house.cut(victim, other)
            if kind == "partition":
                house.cut(other, victim)
        later(length, house.heal)
        return f"{kind} {victim} from {others} for {length:.2f}s"
    if kind == "flip_flop":
        for i in range(4):
            later(i * length / 4, _flip, house, victim, members, i % 2 == 0)
        return f"flip-flop partition of {victim} for {length:.2f}s"
    if kind == "loss":
        loss = rng.uniform(0.05, 0.3)
        house.links.set_loss(loss)
        later(length, house.links.set_loss, 0.0)
        return f"loss {loss:.2f} for {length:.2f}s"
    if kind == "delay":
        house.links.default.delay_max = rng.uniform(0.02, 0.2)
        later(length, setattr, house.links.default, "delay_max", 0.003)
        return f"delay up to {house.links.default.delay_max:.3f}s for {length:.2f}s"
    if kind == "worker":
        house.crash_worker(victim)
        return f"worker of {victim} crashes"
    if kind == "speed":  # something else on the box takes its cores, or lets go of them
        worker = house.boxes[victim].worker
        worker.base_speed = min(64.0, max(1.0, worker.base_speed * rng.choice((0.25, 0.5, 2.0, 4.0))))
        if worker.speed is not None:
            worker.speed = worker.base_speed
        return f"{victim}'s worker now measures {worker.base_speed:g} micro-batches a second"
    if kind == "power_loss":
        for nid in up:
            await house.crash(nid)
        for nid in up:
            later(length, _restart, house, nid)
        return f"power loss of {up} for {length:.2f}s"
    if kind == "join_spare":
        spare = [n for n, b in house.boxes.items() if b.gone and b.daemon is None and n not in house.strangers]
        if not spare:
            return ""
        house.start(spare[0])
        return f"{spare[0]} joins"
    if kind == "leave" and len(members) > 3:
        loop.create_task(_ignore(house.client(victim).leave()))
        return f"{victim} leaves"
    return ""


def _restart(house: House, nid: str) -> None:
    box = house.boxes[nid]
    if box.daemon is None and not box.gone:
        house.start(nid)


def _flip(house: House, victim: str, members: list[str], cut: bool) -> None:
    if cut:
        for other in members:
            if other != victim:
                house.cut(victim, other)
                house.cut(other, victim)
    else:
        house.heal()


async def _ignore(call: Awaitable[object]) -> None:
    try:
        await call
    except errors.PeerError:
        pass


class _Operator:
    """Writes increasing values to a few keys (one write at a time) and reads them back."""

    def __init__(self, house: House, checker: Checker, rng: random.Random) -> None:
        self.house, self.checker, self.rng = house, checker, rng
        self.stop = False
        self.violation: Violation | None = None
        self.counter = 0

    async def writer(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop:
            await asyncio.sleep(self.rng.uniform(0.05, 0.3))
            up = self.checker.members()
            if not up or self.house.operator_paused:
                continue
            self.counter += 1
            op = Op("put", f"k{self.rng.randrange(3)}", self.counter, loop.time())
            self.checker.ops.append(op)
            try:
                await self.house.client(self.rng.choice(up)).kv_put(op.key, str(op.value))
                op.ok = True
            except errors.PeerError:
                pass
            op.end = loop.time()

    async def reader(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop:
            await asyncio.sleep(self.rng.uniform(0.05, 0.3))
            up = self.checker.members()
            if not up or self.house.operator_paused:
                continue
            op = Op("get", f"k{self.rng.randrange(3)}", None, loop.time())
            try:
                reply = await self.house.client(self.rng.choice(up)).kv_get(op.key)
            except errors.PeerError:
                continue
            op.end, op.ok = loop.time(), True
            op.value = int(reply.value) if reply.found else None
            self.checker.ops.append(op)
            try:
                self.checker.read_done(op)
            except Violation as exc:
                self.violation = exc


def _on_virtual_time(record: logging.LogRecord) -> bool:
    """Stamp a log record with the virtual time and the box whose task logged it."""
    try:
        record.vt = asyncio.get_running_loop().time()
    except RuntimeError:
        record.vt = -1.0
    record.host = HOST.get() or "-"
    return True


def main(argv: list[str] | None = None) -> int:
    """Replay one seed (or a range) and print what it found."""
    p = argparse.ArgumentParser(prog="python -m tests.house.sim", description="Replay whole-cluster seeds.")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--count", type=int, default=1, help="run seeds seed..seed+count-1")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--size", type=int, default=3)
    p.add_argument("-v", "--verbose", action="store_true", help="the daemons' INFO logs, on virtual time")
    args = p.parse_args(argv)
    if args.verbose:
        handler = logging.StreamHandler(sys.stdout)
        handler.addFilter(_on_virtual_time)
        handler.setFormatter(logging.Formatter("%(vt)9.3f %(host)-6s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger("dpeer").setLevel(logging.INFO)
    else:
        quiet_logs()
    bad = 0
    for seed in range(args.seed, args.seed + args.count):
        r = run(seed, args.seconds, args.size)
        print(f"seed {seed}: {'VIOLATION ' + r.violation if r.violation else 'clean'} ({r.wall_s:.2f}s wall, {r.cpu_s:.2f}s CPU, "
              f"{r.virtual_s:.1f}s virtual, {r.checks} checks, {r.commits} committed, {r.steps} steps, digest {r.digest[:12]})")
        if args.verbose or r.violation:
            print("\n".join("  " + f for f in r.faults))
        bad += r.violation is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
