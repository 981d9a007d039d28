"""Prometheus metrics of one node, served on --metrics-listen: over TLS with client certificates
when the node has TLS, else (or with security.metrics_plain, on loopback) as plain HTTP."""

from __future__ import annotations

import collections
import logging
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dpeer.address import Address
from dpeer.daemon.config import SecurityConfig
from dpeer.daemon.decide.job_status import JobStatus
from dpeer.daemon.serve.metrics_http import MetricsServer, MetricsTLS
from dpeer.membership import MemberState
from dpeer.security.exposure import is_loopback
from dpeer.statemachine.state import Member, MemberStatus

log = logging.getLogger("dpeer.metrics")


class Metrics:
    """The node's gauges and counters, in a registry of its own (several nodes can share a process)."""

    def __init__(self, node_id: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, {"node": node_id}
        self.members = Gauge("dpeer_members", "Members by gossip state", ["node", "state"], registry=r)
        self.term = Gauge("dpeer_term", "Current Raft term", ["node"], registry=r).labels(**labels)
        self.is_leader = Gauge("dpeer_is_leader", "1 on the leader", ["node"], registry=r).labels(**labels)
        self.commit_index = Gauge("dpeer_commit_index", "Commit index", ["node"], registry=r).labels(**labels)
        self.last_applied = Gauge("dpeer_last_applied", "Last applied index", ["node"], registry=r).labels(**labels)
        self.generation = Gauge("dpeer_view_generation", "Committed view generation", ["node"], registry=r).labels(**labels)
        self.reforms = Counter("dpeer_reforms", "Training group re-formations", ["node"], registry=r).labels(**labels)
        self.recovery = Histogram(
            "dpeer_recovery_seconds", "From a reported failure to the next committed step",
            ["node"], registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        ).labels(**labels)
        self.step = Gauge("dpeer_train_step", "Newest committed training step reported with a parameter digest "
                          "(every training.digest_every steps)", ["node"],
                          registry=r).labels(**labels)
        self.samples = Gauge("dpeer_train_samples", "Samples consumed by dpeer_train_step", ["node"],
                             registry=r).labels(**labels)
        self.rtt = Histogram(
            "dpeer_peer_rtt_seconds", "Round trip of a protocol message's delivery call to a peer", ["node"], registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        ).labels(**labels)
        self.invalid = Gauge("dpeer_invalid_messages", "Peer messages refused as malformed", ["node"], registry=r).labels(**labels)
        self.insecure = Gauge("dpeer_security_insecure", "1 when the node runs with --insecure",
                              ["node"], registry=r).labels(**labels)
        self.refused = Counter("dpeer_refused_requests", "Calls refused: no credential, wrong role, another "
                               "node's id, or an invalid request", ["node", "method", "reason"], registry=r)
        self._refused_counted: dict[tuple[str, str], int] = {}
        self.job = Gauge("dpeer_job_state", "1 for the job's state as this node reports it in status",
                         ["node", "state"], registry=r)
        self.failures = Counter("dpeer_job_failures", "Failures this node's worker reported (groups and builds)",
                                ["node"], registry=r).labels(**labels)
        self.epoch = Gauge("dpeer_cluster_epoch", "Cluster epoch (+1 per forced reconfiguration)", ["node"],
                           registry=r).labels(**labels)
        self.forced = Counter("dpeer_forced_reconfigurations", "Forced reconfigurations this node started", ["node"],
                              registry=r).labels(**labels)
        self.force_refused = Counter("dpeer_force_refused", "Forced reconfigurations refused by the guard", ["node"],
                                     registry=r).labels(**labels)
        self.strangers = Gauge("dpeer_identity_conflicts", "Members seen under another store uid than the "
                               "configuration names (lost disks)", ["node"], registry=r).labels(**labels)
        self.fault_tolerance = Gauge("dpeer_fault_tolerance", "Voter failures the cluster survives now, as its "
                                     "leader counts them (NaN on the other nodes)", ["node"], registry=r).labels(**labels)
        self.paused = Gauge("dpeer_training_paused", "1 while an operator's `dpeer job pause` holds training",
                            ["node"], registry=r).labels(**labels)
        self.leaderless = Gauge("dpeer_leaderless_seconds", "Seconds this node has known no leader (0 while it "
                                "knows one); a box that trains stops its worker past 3 election timeouts",
                                ["node"], registry=r).labels(**labels)
        self.committed = Gauge("dpeer_committed_members", "Members of the committed membership by status; a dead "
                               "one stays until it is alive again or `dpeer leave --node` drops it", ["node", "status"],
                               registry=r)
        self.kept_out = Gauge("dpeer_job_kept_out", "Boxes kept out of the training group because their job build "
                              "failed repeatedly, as the leader counts them (NaN on the other nodes)", ["node"],
                              registry=r).labels(**labels)
        self.disk_avail = Gauge("dpeer_data_dir_fs_avail_bytes", "Bytes the daemon may still write on the data "
                                "dir's filesystem", ["node"], registry=r).labels(**labels)
        self.disk_size = Gauge("dpeer_data_dir_fs_size_bytes", "Size of the data dir's filesystem in bytes",
                               ["node"], registry=r).labels(**labels)
        self.cross_site = Counter("dpeer_cross_site_bytes", "Bytes this box's daemon and worker moved to and from "
                                  "boxes of another site (the kernel's TCP counters)", ["node", "process", "direction"],
                                  registry=r)
        self._cross_counted: dict[tuple[str, str], int] = {}
        self._node = node_id

    def count_refusals(self, refusals: dict[tuple[str, Any], int]) -> None:
        """Bring the refusal counters up to the transport's totals (by method and reason)."""
        for (method, reason), total in list(refusals.items()):
            key = (method, reason.value)
            delta = total - self._refused_counted.get(key, 0)
            if delta > 0:
                self.refused.labels(node=self._node, method=method, reason=key[1]).inc(delta)
                self._refused_counted[key] = total

    def count_cross_site(self, totals: Mapping[tuple[str, str], int]) -> None:
        """Bring the cross-site byte counters up to the totals by (process, direction)."""
        for (process, direction), total in list(totals.items()):
            delta = total - self._cross_counted.get((process, direction), 0)
            if delta > 0:
                self.cross_site.labels(node=self._node, process=process, direction=direction).inc(delta)
                self._cross_counted[(process, direction)] = total

    def set_members(self, counts: Mapping[MemberState, int]) -> None:
        """Members by gossip state; states absent from counts read 0."""
        for state in MemberState:
            self.members.labels(node=self._node, state=state.value).set(counts.get(state, 0))

    def set_committed(self, members: Mapping[str, Member]) -> None:
        """Committed members by status; statuses no member has read 0."""
        counts = collections.Counter(m.status for m in members.values())
        for status in MemberStatus:
            self.committed.labels(node=self._node, status=status.value).set(counts.get(status, 0))

    def set_data_dir(self, data_dir: Path) -> None:
        """Free and total bytes of the data dir's filesystem (one statvfs); unchanged when it cannot be read."""
        try:
            fs = os.statvfs(data_dir)
        except OSError:
            return
        self.disk_avail.set(fs.f_bavail * fs.f_frsize)
        self.disk_size.set(fs.f_blocks * fs.f_frsize)

    def set_job(self, state: JobStatus | None) -> None:
        """The job's state (status `job.state`): 1 for it, 0 for the others; all 0 without a job."""
        for name in JobStatus:
            self.job.labels(node=self._node, state=name.value).set(1 if name == state else 0)

    def serve(self, listen: str, security: SecurityConfig) -> None:
        """Serve /metrics on HOST:PORT from a background thread (metrics_http), over TLS when the
        node has it (unless security.metrics_plain), and log how; OSError in one sentence when it
        cannot bind."""
        host, port = Address.parse(listen, any_port=True)
        tls = None
        if security.tls and not security.metrics_plain:
            assert security.tls_cert and security.tls_key and security.tls_ca  # security.tls
            tls = MetricsTLS(security.tls_cert, security.tls_key, security.tls_ca)
        try:
            server = MetricsServer(host, port, self.registry, tls)
        except ssl.SSLError as exc:
            raise OSError(f"cannot serve metrics over TLS with security.tls_cert, tls_key and tls_ca: {exc}") from None
        except OSError as exc:
            raise OSError(_cannot_serve(listen, exc)) from None
        server.serve()
        if tls is not None:
            log.info("serving /metrics on https://%s/metrics: TLS, readable with a client certificate of the "
                     "cluster CA (dpeer certs create-client)", listen)
        else:
            where = "on loopback only" if is_loopback(host) else "off loopback: --insecure"
            log.info("serving /metrics on http://%s/metrics: plain HTTP, no client authentication, %s", listen, where)


def check_listen(listen: str) -> None:
    """OSError in one sentence unless HOST:PORT can be bound for /metrics now, bound as the HTTP
    server binds (SO_REUSEADDR): `dpeer start` checks it before it makes the data dir or the store."""
    host, port = Address.parse(listen, any_port=True)
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        raise OSError(_cannot_serve(listen, exc)) from None


def _cannot_serve(listen: str, exc: OSError) -> str:
    return (f"cannot serve metrics on {listen} (metrics_listen): {exc.strerror or exc}; free that port or "
            "choose another for --metrics-listen")
