"""Seeded schedules over raft_sim.RaftCluster; a violation raises AssertionError naming it, and
`python tests/consensus/raft_schedules.py SEED N [--chaos-s S] [--force]` replays one run exactly.

- run_schedule: chaos (crashes, restarts, wipes, partitions, loss, pauses, and force sent to
  random nodes at random times, always too early: every one must be refused) with client
  proposals, then recovery; safety throughout, liveness after.
- run_force_schedule: the operator's case for force. A majority of the voters is lost for good
  (crashed or wiped); force sent before the guard's wait, or at a follower, is refused; after
  it, force at the survivor with the most up-to-date log goes through (and only while no
  majority of intact voters is reachable); the lost boxes come back on new disks and are added
  back as learners and promoted; safety throughout, liveness after.
"""

from __future__ import annotations

import argparse
import random

from raft_sim import RaftCluster

from dpeer.consensus import LAN, RaftConfig, Refused, force_after


def _proposals(c: RaftCluster, start: float, until: float, chaos: float) -> None:
    """Client proposals every 20-80 ms in [start, until), a fault after each with probability chaos."""
    t = start
    while t < until:
        t += c.rng.uniform(0.02, 0.08)
        kind = "view" if c.rng.random() < 0.3 else "kv"
        c.sim.at(t, lambda k=kind: c.propose(k))
        if c.rng.random() < chaos:
            c.sim.at(t + 0.001, c.chaos)


def _check_live(c: RaftCluster, seed: int, quiet_s: float, commit_within: float = 3.0) -> None:
    """Heal everything; then a leader within quiet_s, and its next entry committed on every node
    within commit_within (a node back on a new disk is added back as a learner first, and
    learners are beaten once a second)."""
    c.recover()
    c.sim.run_for(quiet_s)
    leader = c.leader()
    assert leader is not None, f"seed {seed}: no leader {quiet_s}s after healing"
    res = c.propose("kv")
    deadline = c.sim.now + commit_within
    while c.sim.now < deadline and any(c.actor(n).node.commit_index < res.index for n in c.ids):
        c.sim.run_for(0.1)
    for nid in c.ids:
        node = c.actor(nid).node
        assert node.commit_index >= res.index, f"seed {seed}: {nid} did not commit {res.index}"


def run_schedule(seed: int, n: int, chaos_s: float = 1.0, quiet_s: float = 1.5) -> RaftCluster:
    """Chaos with client proposals, then recovery; asserts safety throughout and liveness after."""
    c = RaftCluster(seed, n, compact_every=random.Random(seed).choice([0, 0, 8]))
    _proposals(c, 0.0, chaos_s, 0.25)
    c.sim.run_until(chaos_s)
    accepted = [f for f in c.forces if not isinstance(f[3], Refused)]
    assert not accepted, f"seed {seed}: force accepted during chaos: {accepted}"
    _check_live(c, seed, quiet_s)
    return c


def run_force_schedule(seed: int, n: int, quiet_s: float = 3.0) -> RaftCluster:
    """Lose a majority for good, misuse force on the way, then force as docs/recovery.md says."""
    c = RaftCluster(seed, n, compact_every=random.Random(seed).choice([0, 8]))
    rng, wait = c.rng, force_after(c.cfg)
    _proposals(c, 0.0, 1.0, 0.0)
    c.sim.run_until(1.0)
    misuse = [c.force(nid, [nid]) for nid in rng.sample(c.ids, 2)]  # a healthy cluster
    assert all(isinstance(r, Refused) for r in misuse), f"seed {seed}: force accepted in a healthy cluster"
    c.forces.clear()
    lost = rng.sample(c.ids, c.checker.quorum)
    for nid in lost:
        if rng.random() < 0.5:
            c.wipe(nid)  # back at once on a new disk: alive, but not the voter it was
        else:
            c.sim.crash(nid)
            c.checker.forget(nid)  # its disk will not come back
    survivors = [nid for nid in c.ids if nid not in lost]
    lost_at = c.sim.now
    for frac in sorted(rng.random() * 0.95 for _ in range(3)):  # too early: refused
        c.sim.at(lost_at + frac * wait, lambda: c.force(rng.choice(survivors), survivors))
    _proposals(c, lost_at, lost_at + 1.0, 0.0)  # clients retry a while, then give up
    c.sim.run_until(lost_at + wait)
    early = [f for f in c.forces if not isinstance(f[3], Refused)]
    assert not early, f"seed {seed}: force accepted before the guard's wait was over: {early}"
    forcer = max(survivors, key=lambda s: (c.actor(s).node.log.last_term(), c.actor(s).node.log.last_index()))
    while c.actor(forcer).node.leaderless_for(c.sim.now) < wait:  # a surviving leader steps down late
        assert c.sim.now < lost_at + 3 * wait, f"seed {seed}: {forcer} still knows a leader"
        c.sim.run_for(0.5)
    res = c.force(forcer, survivors)
    assert not isinstance(res, Refused), f"seed {seed}: force refused after losing a majority: {res}"
    for nid in lost:
        if not c.sim.nodes[nid].up:
            c.sim.at(c.sim.now + rng.uniform(0.1, 1.5), lambda nid=nid: c.wipe(nid))
    _proposals(c, c.sim.now, c.sim.now + 2.0, 0.0)
    c.sim.run_for(2.0)
    _check_live(c, seed, quiet_s)
    return c


def election_times(trials: int, n: int = 5, cfg: RaftConfig = LAN, seed: int = 0,
                   detector: bool = True) -> list[float]:
    """Seconds from a leader crash to the next leader, over seeded trials (the crash comes
    2-3 s after start, when an idle-capable leader has gone idle)."""
    out = []
    for k in range(trials):
        c = RaftCluster(seed * 100_003 + k, n, cfg, detector=detector)
        c.sim.run_for(2.0 + c.rng.random())
        old = c.leader()
        assert old is not None
        term = c.actor(old).node.term
        c.sim.crash(old)
        t0 = c.sim.now
        while c.leader() is None or c.actor(c.leader()).node.term <= term:
            c.sim.run_for(0.001)
        out.append(c.sim.now - t0)
    return out


def replay_command(seed: int, n: int, force: bool = False, chaos_s: float = 1.0) -> str:
    """The shell command that replays one schedule."""
    extra = " --force" if force else f" --chaos-s {chaos_s:g}"
    return f"python tests/consensus/raft_schedules.py {seed} {n}{extra}"


def main() -> None:
    """Replay one schedule by seed; exits with the violation's traceback if it fails again."""
    parser = argparse.ArgumentParser(description="replay one seeded Raft schedule")
    parser.add_argument("seed", type=int)
    parser.add_argument("n", type=int, help="cluster size")
    parser.add_argument("--force", action="store_true", help="a run_force_schedule instead of run_schedule")
    parser.add_argument("--chaos-s", type=float, default=1.0, help="run_schedule's chaos window (default 1)")
    args = parser.parse_args()
    c = (run_force_schedule(args.seed, args.n) if args.force else
         run_schedule(args.seed, args.n, args.chaos_s, quiet_s=max(1.5, args.chaos_s)))
    print(f"seed {args.seed} n={args.n}: safe and live; {c.checker.readies} readies checked, {c.wiped} wipes, "
          f"{len(c.forces)} force attempts ({sum(not isinstance(f[3], Refused) for f in c.forces)} accepted)")


if __name__ == "__main__":
    main()
