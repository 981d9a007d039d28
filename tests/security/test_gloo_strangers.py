"""Strangers on a worker's Gloo port (issue 35; an outside review): Gloo's listener keeps every
connection it accepts, the stranger's too, until the group is destroyed, and aborts the process
once accept() runs out of descriptors. So the worker's watch counts connections to its data-plane
ports from outside its group and, past a bound, cuts the group: the failure is reported with that
reason, the group re-forms (destroying the old one closes them), and the worker lives on."""

from __future__ import annotations

import os
import socket

from tests.security.test_rendezvous import listening_ports
from tests.support.trainer_cluster import Cluster

OPTS = {"steps": 100000, "global_batch": 16, "micro_batch": 4, "dataset_len": 4096, "seed": 3}


def test_a_flood_of_stranger_connections_re_forms_the_group_and_the_worker_lives(tmp_path) -> None:
    cluster = Cluster(str(tmp_path), ["a", "b"], OPTS, ["--reduction", "fast"])
    try:
        for node in cluster.nodes:
            cluster.start(node)
        cluster.run_authority()
        cluster.wait_for(lambda: min(cluster.progress_step(n) for n in cluster.nodes) >= 20, 120, "training")
        pid = cluster.procs["a"].pid
        fds_before = len(os.listdir(f"/proc/{pid}/fd"))
        gloo = listening_ports(pid) - set(cluster.ports.values())
        assert gloo, "worker a listens on no Gloo port"
        opened = 0
        for port in gloo:
            for _ in range(300):
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(os.urandom(64))  # no sequence number Gloo expects
                    opened += 1
        failure = cluster.wait_for(lambda: next((r for r in cluster.reports("a") if r["kind"] == "failure"
                                                 and "connections from outside the group" in r["reason"]), None),
                                   60, "the watch to report the strangers' connections")
        step = cluster.progress_step("a")
        cluster.wait_for(lambda: cluster.progress_step("a") > step + 20, 120, "training in a re-formed group")
        assert cluster.procs["a"].poll() is None, cluster.log_tail("a")
        assert len(os.listdir(f"/proc/{pid}/fd")) < fds_before + 32, "the strangers' connections are still held"
        assert opened >= 300 and failure["phase"] == "group", failure
    finally:
        cluster.close()
