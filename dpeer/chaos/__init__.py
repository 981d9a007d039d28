"""`dpeer chaos`: a seeded chaos run of real daemons on 127.0.0.1 training the demo job, then checks.

N nodes (LocalCluster) train the demo job. For `duration` seconds a SEEDED schedule applies one
fault every `fault_every` seconds on average (the gap, kind, victim, length and strength of every
fault come from the seed; which nodes are eligible depends on the run):

  kill       SIGKILL daemon + worker, restart on the same data dir 2-6 s later
  restart    SIGTERM (graceful leave), restart at once on the same data dir
  wipe       SIGKILL, move the data dir aside (never deleted), restart on an empty one: the node
             rejoins as new (same node id, no state) and catches up from its peers
  stop       SIGSTOP daemon + worker, SIGCONT 2-6 s later (a hung box)
  partition  cut one node (a minority) off from the others for 3-8 s, both directions
  loss       the node drops 10-30 % of its outgoing protocol messages for 5-10 s
  slow       the node holds each outgoing protocol message 50-200 ms for 5-10 s
  stranger   for 3-6 s a stranger visits the node every 0.5 s: requests on the rendezvous
             store's own wire under guessed keys to the store its status names (`sealed` set to
             "abandoned", a get, a 256 KiB value; the current generation and the next two), a
             TCPStore SET of `<prefix>/sealed` and random bytes to its worker's store port
             (`worker.store_port`), random bytes to every other port the worker listens on
             (dpeer/chaos/stranger.py, store_probe.py); with stranger among the kinds it also
             visits the nodes while the first group forms

partition, loss and slow go through the chaos daemons' transport wrapper (the cluster runs
`python -m dpeer.chaos.daemon`, dpeer/chaos/daemon.py; faults in <data_dir>/faults.json, read by
dpeer/chaos/faults.py; `dpeer start` has no fault hook). They act on the daemons' control plane (gossip and Raft messages), not
on the workers' Gloo collectives: a partitioned node's worker keeps stepping with the majority
until its daemon has known no leader for `fence_after` (3 x the election timeout max, about 2 s on
the lan preset) and stops it; the majority then re-forms without it, and the node heals and is
re-admitted after the partition heals. With --netns (root only) every daemon runs in a network
namespace of its own on a bridge (dpeer/chaos/netns.py) and a partition sets the node's link down:
its Gloo collectives, rendezvous store and heal transfers are cut too, so the minority's worker
stalls at once and is fenced; loss and slow still go through the transport wrapper. A cut node
is not sampled while its link is down (its status cannot be fetched from outside); that it stops
training is shown by its ledger, which the audit reads after the run. At most (N-1)//2 nodes are disrupted (killed, stopped,
wiped, restarting or partitioned, or not yet back in a group) at any time, so a quorum always
remains and training must keep going.

Every fault and recovery is recorded: the fault's time, kind and node; the time from the fault to
the survivors' next committed step (in a new generation, or after the fault ended when the group
never failed); the time from the end of the fault until the node trains in a group again.

Then the checks, each a list of violations (exit 1 if any):
- at most one leader per term across every status sample of every node;
- commit_index never decreases on a node (a wiped node starts a new lifetime);
- one member list per group generation across every node's samples;
- every acknowledged `dpeer kv put` (a background writer runs during the run) reads back with its
  value through every node at the end;
- the kv history is linearizable: --kv-clients clients (3) put, get and delete 3 keys through
  random nodes during the chaos window, then every key is read through every node; each
  operation's call and answer times are recorded (dpeer/chaos/history.py) and Wing and Gong's
  search checks every key as a register (dpeer/chaos/linear.py); an operation without an answer
  may take effect late or never; the row needs at least one answered operation of the chaos
  window (the end-of-run reads alone show nothing of the faults);
- the stranger's store requests refused: the store closed, or answered "generation not served"
  to, every request the stranger made under a guessed key ("not run" when no store met one);
- committed prefixes equal: every node's `dpeer log --json` at the end, every pair equal (by
  entry hash) on the indexes both hold and have committed (dpeer/chaos/prefix.py);
- the audit of every ledger (dpeer/trainer/audit.py; ledgers of wiped data dirs included): no
  committed step lost, every micro-batch of every committed step trained exactly once by the group
  that committed it (as its ranks recorded before the step's allreduce), with the seeded samples;
  replicas' parameter-and-buffer digests equal at equal steps (exact reduction: across
  generations too);
- training finished on every node; the final replicas equal, and equal to a fault-free reference
  run (a 1-node cluster with the same config), for the whole run: with --reduction exact (the
  default) by state-dict digest, bit for bit; with --reduction fast within a max relative difference
  of 1e-4, the figure printed. Each row of the table says what it compared; a check that did not
  run (--no-reference, or a node that did not finish) says "not run", never "ok";
- liveness: after every fault the survivors commit a step within --max-recovery seconds, and every
  faulted node is back in a group by the end.

It prints a summary table and writes <out>/timeline.json (samples of step, world size, generation,
term and role over time; the faults; the checks) and <out>/summary.md. The schedule, not the
timing, is what a seed reproduces: the machine's load decides where in training a fault lands.

Layout: options.py (the flags; light, imported by every `dpeer` command), schedule.py (the seeded
plan), run.py (the run loop and sampling), inject.py (applying and ending faults), track.py
(recovery times), kv.py (the kv writer), history.py (the kv clients), stranger.py and
store_probe.py (the stranger),
checks.py, linear.py, prefix.py, logs.py and reference.py (the checks), report.py (the summary and
timeline), command.py (run_chaos, main). The package imports only options.py eagerly;
everything else loads on first use, so building the `dpeer` parser stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from dpeer.chaos.options import (
    DISRUPTIVE,
    KINDS,
    ChaosOptions,
    add_arguments,
    options_from,
)

__all__ = ["DISRUPTIVE", "KINDS", "ChaosOptions", "add_arguments", "main", "options_from", "run_chaos"]

_LAZY = {"run_chaos": "command", "main": "command"}


def __getattr__(name: str) -> Any:
    """run_chaos and main, imported on first use (they pull in asyncio, gRPC and the cluster)."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
