"""Applying a planned fault to a victim node, and ending it (restart, SIGCONT, heal)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dpeer.chaos.options import DISRUPTIVE
from dpeer.chaos.sample import group_of
from dpeer.chaos.schedule import Fault, Plan
from dpeer.chaos.store_probe import Outcome
from dpeer.chaos.stranger import speak_the_wire, visit
from dpeer.launch.cluster import LocalNode

if TYPE_CHECKING:
    from dpeer.chaos.run import Run

PESTER_GAP = 0.5  # seconds between a stranger's visits to a worker


async def inject(run: Run, plan: Plan) -> bool:
    """Apply one planned fault if an eligible victim exists; False to retry a little later."""
    max_down = (len(run.cluster.nodes) - 1) // 2
    disrupted, busy = run.disrupted(), run.busy()
    healthy = [x for x in run.cluster.nodes if x.running and x.node_id not in disrupted | busy
               and x.node_id not in run.stopped and group_of(run.latest.get(x.node_id))]
    if plan.kind in DISRUPTIVE and len(disrupted) >= max_down:
        return False
    if not healthy:
        return False
    victim = healthy[int(plan.pick * len(healthy)) % len(healthy)]
    vid = victim.node_id
    f = Fault(len(run.faults) + 1, plan.kind, [vid], round(run.now(), 3), round(2.0 + 4.0 * plan.length, 2),
              step_at=run.survivors_step([vid]), gen_at=run.max_gen())
    await APPLY[plan.kind](run, f, victim, plan)
    run.faults.append(f)
    # The step the survivors had committed when the fault hit: a fresh sample right after it
    # (the previous one is up to `poll` old; a killed peer fails their collective in ms).
    await run.sample()
    f.step_at = run.survivors_step([vid])
    run.say(f"fault {f.id}: {f.kind} {vid} ({f.detail}) at survivors' step {f.step_at}, generation {f.gen_at}")
    return True


async def _kill(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    length = 2.0 + 4.0 * plan.length
    run.cluster.kill(victim, signal.SIGKILL)
    f.detail = f"down {length:.1f}s"
    run.later(length, lambda: _restart(run, f, victim))


async def _graceful_restart(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    """SIGTERM (the daemon leaves gracefully), and a restart as soon as it has exited. The run goes
    on sampling meanwhile: the survivors' recovery is timed from the signal, not from the exit."""
    f.planned_s = 0.0
    f.detail = "SIGTERM, restart at once"
    run.cluster.kill(victim, signal.SIGTERM, wait=False)

    def wait_gone() -> None:
        assert victim.proc is not None
        try:
            victim.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.cluster.kill(victim, signal.SIGKILL)

    async def restart_once_gone() -> None:
        await asyncio.to_thread(wait_gone)
        _restart(run, f, victim)
    run.background.add(asyncio.create_task(restart_once_gone()))


async def _wipe(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    length = 2.0 + 4.0 * plan.length
    vid = victim.node_id
    run.cluster.kill(victim, signal.SIGKILL)
    run.life[vid] += 1
    aside = victim.data_dir.with_name(f"{vid}.wiped{run.life[vid]}")
    victim.data_dir.rename(aside)
    run.asides[vid].append(aside)
    f.wiped_to = str(aside)
    f.detail = f"data dir moved to {aside.name}, down {length:.1f}s"
    if vid in run.partitioned or vid in run.net:
        run.write_net(victim)
    run.later(length, lambda: _restart(run, f, victim))


async def _stop(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    length = 2.0 + 4.0 * plan.length
    run.cluster.kill(victim, signal.SIGSTOP)
    run.stopped.add(victim.node_id)
    f.detail = f"stopped {length:.1f}s"
    run.later(length, lambda: _cont(run, f, victim))


async def _partition(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    length = 3.0 + 5.0 * plan.length
    f.planned_s = round(length, 2)
    others = [x for x in run.cluster.nodes if x is not victim]
    if run.netns is not None:  # a real cut: the link goes down, Gloo, the store and the heal with it
        run.netns.cut(run.number(victim))
        run.cut.add(victim.node_id)
        f.detail = f"{victim.node_id}'s link down for {length:.1f}s"
    else:
        run.partitioned.setdefault(victim.node_id, set()).update(x.addr for x in others)
        for x in others:
            run.partitioned.setdefault(x.node_id, set()).add(victim.addr)
        for x in run.cluster.nodes:
            run.write_net(x)
        f.detail = f"{victim.node_id} cut from {','.join(x.node_id for x in others)} for {length:.1f}s"
    run.later(length, lambda: _heal_partition(run, f, victim))


async def _net(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    """loss or slow: outgoing protocol messages dropped or held for a while."""
    length = 5.0 + 5.0 * plan.length
    f.planned_s = round(length, 2)
    loss, delay = run.net.get(victim.node_id, (0.0, 0.0))
    if plan.kind == "loss":
        loss = round(0.1 + 0.2 * plan.strength, 3)
        f.detail = f"{loss:.0%} outgoing loss for {length:.1f}s"
    else:
        delay = round(0.05 + 0.15 * plan.strength, 3)
        f.detail = f"+{delay * 1000:.0f} ms per outgoing message for {length:.1f}s"
    run.net[victim.node_id] = (loss, delay)
    run.write_net(victim)
    run.later(length, lambda: _heal_net(run, f, victim))


async def _stranger(run: Run, f: Fault, victim: LocalNode, plan: Plan) -> None:
    """A stranger connects to the victim's worker ports (dpeer/chaos/stranger.py) for a while."""
    length = 3.0 + 3.0 * plan.length
    f.planned_s = round(length, 2)
    f.detail = f"connections to {victim.node_id}'s worker ports for {length:.1f}s"
    stop = asyncio.Event()
    run.background.add(asyncio.create_task(pester(run, victim, stop, f)))

    def end() -> None:
        stop.set()
        _end(run, f)
        run.say(f"fault {f.id}: the stranger left {victim.node_id}")
    run.later(length, end)


async def pester(run: Run, victim: LocalNode | None, stop: asyncio.Event, f: Fault | None = None) -> None:
    """Visit the victim's worker (and its warm spare) and the store its status names every
    PESTER_GAP seconds until `stop`; with no victim (while the first group forms), a seeded pick
    of the running nodes each time. The fault's detail gets the connections it made."""
    tally = run.stranger
    refused = Outcome.REFUSED.value
    before = sum(tally.connections.values()), tally.store_sets, sum(tally.requests.values()), tally.requests[refused]
    while not stop.is_set():
        running = [n for n in run.cluster.nodes if n.running]
        node = victim or (running[run.stranger_rng.randrange(len(running))] if running else None)
        doc = run.latest.get(node.node_id) if node is not None else None
        if node is not None and doc:
            worker = doc.get("worker") or {}
            training = victim is not None and (doc.get("job") or {}).get("state") == "training"
            phase, group = "training" if training else "formation", group_of(doc)
            if group.get("store_host"):
                await speak_the_wire(tally, phase, group["store_host"], group.get("generation"), run.stranger_rng)
            for pid in (worker.get("pid"), worker.get("spare_pid")):
                if type(pid) is int:
                    await visit(tally, phase, node.node_id, node.host, pid, worker.get("store_port") or 0,
                                run.stranger_rng)
        try:
            await asyncio.wait_for(stop.wait(), PESTER_GAP)
        except TimeoutError:
            pass
    if f is not None:
        f.detail += (f": {sum(tally.connections.values()) - before[0]} connections, "
                     f"{tally.store_sets - before[1]} TCPStore SETs, {sum(tally.requests.values()) - before[2]} "
                     f"store requests under guessed keys ({tally.requests[refused] - before[3]} refused)")


APPLY: dict[str, Callable[[Run, Fault, LocalNode, Plan], Awaitable[None]]] = {
    "kill": _kill, "restart": _graceful_restart, "wipe": _wipe, "stop": _stop, "partition": _partition,
    "loss": _net, "slow": _net, "stranger": _stranger,
}


def _end(run: Run, f: Fault) -> None:
    f.ended_at = round(run.now(), 3)
    f.step_at_end = run.survivors_step(f.nodes)


def _restart(run: Run, f: Fault, node: LocalNode) -> None:
    if not node.running:
        run.cluster.start(node)
    if node.node_id in run.partitioned or node.node_id in run.net:
        run.write_net(node)
    _end(run, f)
    run.say(f"fault {f.id}: restarted {node.node_id}" + (" on an empty data dir" if f.kind == "wipe" else ""))


def _cont(run: Run, f: Fault, node: LocalNode) -> None:
    run.cluster.kill(node, signal.SIGCONT)
    run.stopped.discard(node.node_id)
    _end(run, f)
    run.say(f"fault {f.id}: SIGCONT {node.node_id}")


def _heal_partition(run: Run, f: Fault, node: LocalNode) -> None:
    if node.node_id in run.cut:
        run.netns.heal(run.number(node))
        run.cut.discard(node.node_id)
    run.partitioned.pop(node.node_id, None)
    for x in run.cluster.nodes:
        if x is not node:
            run.partitioned.get(x.node_id, set()).discard(node.addr)
        run.write_net(x)
    _end(run, f)
    run.say(f"fault {f.id}: partition of {node.node_id} healed")


def _heal_net(run: Run, f: Fault, node: LocalNode) -> None:
    loss, delay = run.net.get(node.node_id, (0.0, 0.0))
    run.net[node.node_id] = (0.0, delay) if f.kind == "loss" else (loss, 0.0)
    run.write_net(node)
    _end(run, f)
    run.say(f"fault {f.id}: {f.kind} on {node.node_id} ended")
