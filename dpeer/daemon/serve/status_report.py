"""The status document as this daemon serves it: the node's part (serve/status.py) with what the
daemon's other owners add: the worker link's train, job and worker, the resync's fetches, the
process's uptime, whether it joined, and its security."""

from __future__ import annotations

from typing import Any

from dpeer.clock import Clock
from dpeer.daemon.config import NodeConfig
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.resyncer import Resyncer
from dpeer.daemon.node.upkeep import NodeUpkeep
from dpeer.daemon.serve.site_bytes import SiteBytes
from dpeer.daemon.serve.status import document
from dpeer.daemon.worker.link import WorkerLink
from dpeer.transport.options import Security


class StatusReport:
    """The status document of one daemon (`dpeer status --json`); `server` is the gRPC server
    while the daemon serves (its refusals are counted), else None; site_bytes: the bytes counted
    across sites (None in a simulation: no sockets to read)."""

    def __init__(self, node: Node, config: NodeConfig, security: Security, link: WorkerLink | None,
                 resyncer: Resyncer, upkeep: NodeUpkeep, clock: Clock, site_bytes: SiteBytes | None = None) -> None:
        self.node, self.config, self.security, self.link = node, config, security, link
        self.resyncer, self.upkeep, self.clock, self.site_bytes = resyncer, upkeep, clock, site_bytes
        self.started = clock.now()
        self.server: Any = None

    def status(self) -> dict[str, Any]:
        """The status document (see status.document)."""
        link = self.link
        extra = {
            "train": link.train_status() if link is not None else None,
            "job": self.job_status(),
            "worker": link.worker.status() if link is not None else None,
            "resync": {"fetched_entries": self.resyncer.fetched_entries, "fetches": self.resyncer.fetches[-10:]},
            "uptime_s": round(self.clock.now() - self.started, 3),
            "joined": self.upkeep.joined,
            "security": self.security_status(),
            "cross_site_bytes": self.site_bytes.counts.document() if self.site_bytes is not None else None,
        }
        return document(self.node, extra, self.config.site or "")

    def security_status(self) -> dict[str, Any]:
        """The status's `security`: the mode (mtls+token, mtls, token, none), --insecure,
        --insecure-data-plane, refusals so far."""
        server, s = self.server, self.config.security
        return {"mode": self.security.mode.value, "insecure": s.insecure, "insecure_data_plane": s.insecure_data_plane,
                "refused": sum(server.refusals.values()) if server is not None else 0}

    def job_status(self) -> dict[str, Any] | None:
        """The status's `job` (see job_status.job_document); None when this node runs no job."""
        return self.link.job_status() if self.link is not None else None
