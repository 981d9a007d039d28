"""Opening the store and running one daemon in the foreground: what `dpeer start` and the
chaos daemon entry (dpeer/chaos/daemon.py) call."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Callable

from dpeer.daemon import logs
from dpeer.daemon.config import NodeConfig
from dpeer.daemon.daemon import Daemon
from dpeer.daemon.serve import tcp_diag
from dpeer.daemon.worker.supervisor import WorkerSupervisor
from dpeer.statemachine.errors import NodeIdMismatch, StoreError, StoreFormatError, StoreWriteFailed
from dpeer.statemachine.store import Store
from dpeer.transport.api import Transport
from dpeer.transport.grpc_transport import GrpcTransport
from dpeer.transport.options import Security

STORE_DIR = "store"  # the LMDB store's directory inside the data dir


def run_daemon(config: NodeConfig, worker: WorkerSupervisor | None = None,
               wrap: Callable[[Transport], Transport] | None = None) -> int:
    """Open the store and run the daemon in the foreground, with the worker the CLI started
    before loading the daemon (so `import torch` overlaps our start-up); returns the exit code.
    The caller has made the data dir private (data_dir.private_data_dir) before it started that worker.
    wrap: a wrapper around the gRPC transport (the chaos entry's faults; `dpeer start` has none)."""
    try:
        return _run_daemon(config, worker, wrap)
    finally:
        if worker is not None:
            worker.stop()


def founding_refusal(config: NodeConfig, store: Store) -> str | None:
    """Why this start must not found a new cluster, or None. A store found corrupt (moved aside at
    this start or an earlier one) belonged to a cluster: founding again beside it, as an empty
    store without --join would, splits that cluster in two."""
    if store.last_index or store.snapshot_index or config.join:
        return None
    asides = sorted(config.data_dir.glob(f"{STORE_DIR}.corrupt-*"))
    if not asides:
        return None
    return (f"this node's store was found corrupt and moved aside to {asides[-1]}; it belonged to a cluster, "
            "so founding a new one here would split it. Start with --join HOST:PORT of a live member to rejoin "
            f"(it resyncs from its peers), or move {config.data_dir / (STORE_DIR + '.corrupt-*')} elsewhere "
            "to found a new cluster on purpose")


def _run_daemon(config: NodeConfig, worker: WorkerSupervisor | None,
                wrap: Callable[[Transport], Transport] | None) -> int:
    assert config.node_id is not None
    logs.setup(lambda: {"node": config.node_id}, config.log_level, config.log_format)
    try:
        security = Security.from_files(config.security.tls_cert, config.security.tls_key,
                                       config.security.tls_ca, config.security.cluster_token_file)
    except (OSError, ValueError) as exc:
        print(f"dpeer: cannot load the security files: {exc}", file=sys.stderr)
        return 2
    try:
        store = Store.open(config.data_dir / STORE_DIR, node_id=config.node_id)
    except (StoreFormatError, NodeIdMismatch) as exc:
        print(f"dpeer: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"dpeer: cannot open the store in {config.data_dir}: {exc}", file=sys.stderr)
        return 1
    refusal = founding_refusal(config, store)
    if refusal is not None:
        print(f"dpeer: {refusal}", file=sys.stderr)
        store.close()
        return 2
    transport = None if wrap is None else (lambda refused: wrap(GrpcTransport(security, refused)))
    try:  # a new store's founding entry is its first write: the disk may refuse it
        daemon = Daemon(config, store, security, worker, transport=transport, connections=tcp_diag.connections)
    except StoreWriteFailed as exc:
        store.close()
        print(f"dpeer: {exc}", file=sys.stderr)
        return 1

    def context() -> dict[str, Any]:
        try:
            view = store.state.view
            return {"node": config.node_id, "term": store.current_term, "generation": view.generation if view else 0}
        except StoreError:
            return {"node": config.node_id}

    logs.setup(context, config.log_level, config.log_format)
    try:
        code = asyncio.run(daemon.run())
    except OSError as exc:  # a port in use, an unwritable file: the config is fine, so exit 4 and let the unit restart
        print(f"dpeer: {exc}", file=sys.stderr)
        return 4
    except StoreWriteFailed as exc:  # the disk refused a write (full, failing): stopped, nothing committed lost
        print(f"dpeer: {exc}", file=sys.stderr)
        return 1  # a store that fails while running (operations.md, exit codes)
    if daemon.node.write_failure is not None:  # refused in a peer's call: the node stopped all the same
        print(f"dpeer: {daemon.node.write_failure}", file=sys.stderr)
        return 1
    if daemon.record.refusal is not None:  # the cluster kept refusing this box (its node id held by a live box)
        print(f"dpeer: {daemon.record.refusal}", file=sys.stderr)
        return 2
    return code
