"""`python -m dpeer.chaos.daemon`: a daemon for chaos runs, with the chaos tool's faults installed.

The same daemon as `dpeer start` (the flags the local launcher passes), except that its gRPC
transport is wrapped in a FaultyTransport whose verdict reads `<data_dir>/faults.json`
(dpeer/chaos/faults.py), which the chaos run writes to partition, thin or slow this node.
`dpeer start` itself has no fault hook.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpeer.chaos.faults import FaultHook
from dpeer.daemon import config as cfg
from dpeer.daemon import logs
from dpeer.daemon.data_dir import private_data_dir
from dpeer.daemon.run import run_daemon
from dpeer.daemon.worker.supervisor import WorkerSupervisor
from dpeer.transport.api import Transport
from dpeer.transport.faulty import FaultyTransport


def main(argv: list[str] | None = None) -> int:
    """Parse the launcher's flags and run the daemon with the faults file's transport wrapper."""
    p = argparse.ArgumentParser(prog="python -m dpeer.chaos.daemon", description=__doc__.splitlines()[0])
    p.add_argument("--node-id", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--join", default=None, help="comma-separated seed addresses")
    p.add_argument("--job", default=None)
    p.add_argument("--config", default=None, type=Path)
    args = p.parse_args(argv)
    config = cfg.load(args.config, {"node_id": args.node_id, "listen": args.listen, "data_dir": args.data_dir,
                                    "join": args.join, "job": args.job})
    logs.setup(lambda: {"node": config.node_id})
    private_data_dir(config.data_dir)
    worker = None
    if config.job:
        worker = WorkerSupervisor(config.node_id or "", config.job, config.data_dir, config.training,
                                  store_bind=config.store_bind)
        worker.start(0.0)
    hook = FaultHook.for_data_dir(config.data_dir)

    def wrap(inner: Transport) -> Transport:
        return FaultyTransport(inner, hook.verdict)

    return run_daemon(config, worker, wrap)


if __name__ == "__main__":
    sys.exit(main())
