"""Prometheus metrics over HTTP: scraped and parsed the way Prometheus does."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemons import cli, formed, wait_status, wait_until


def scrape(addr: str) -> dict[str, list]:
    """Samples of /metrics by sample name (parsed with the reference parser)."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    """The one sample of name whose labels include `labels`."""
    found = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0].value


def test_metrics_endpoint_reports_members_term_indexes_and_view(daemons) -> None:
    metrics_port = daemons.port()
    metrics = f"127.0.0.1:{metrics_port}"
    n1 = daemons.start("n1", extra=["--metrics-listen", metrics])
    n2 = daemons.start("n2", join=[n1.addr])
    formed(n1.addr, {"n1", "n2"})
    doc = wait_status(n1.addr, lambda d: d["last_applied"] == d["commit_index"], "n1 applied what it committed")

    def settled() -> dict | None:
        try:
            s = scrape(metrics)
        except OSError:
            return None
        ok = (value(s, "dpeer_members", node="n1", state="alive") == 2
              and value(s, "dpeer_commit_index", node="n1") >= doc["commit_index"]
              and value(s, "dpeer_view_generation", node="n1") >= doc["group"]["generation"])
        return s if ok else None

    s = wait_until(settled, 30, "metrics to show the formed 2-node cluster")
    for state in ("suspect", "dead", "left"):
        assert value(s, "dpeer_members", node="n1", state=state) == 0, state
    term = value(s, "dpeer_term", node="n1")
    commit = value(s, "dpeer_commit_index", node="n1")
    applied = value(s, "dpeer_last_applied", node="n1")
    generation = value(s, "dpeer_view_generation", node="n1")
    assert term >= 1 and term == doc["term"]  # no election since: one stable leader
    assert 0 < applied <= commit
    assert generation >= 1
    assert value(s, "dpeer_is_leader", node="n1") in (0, 1)
    assert value(s, "dpeer_invalid_messages", node="n1") == 0
    assert value(s, "dpeer_peer_rtt_seconds_count", node="n1") > 0, "no peer round trip was measured"
    assert "dpeer_recovery_seconds_count" in s and "dpeer_reforms_total" in s
    assert value(s, "dpeer_cluster_epoch", node="n1") == 1 == doc["epoch"]  # founded, never forced
    assert value(s, "dpeer_forced_reconfigurations_total", node="n1") == 0
    assert value(s, "dpeer_force_refused_total", node="n1") == 0
    assert value(s, "dpeer_identity_conflicts", node="n1") == 0
    assert value(s, "dpeer_training_paused", node="n1") == 0 and doc["control"] == "running"

    # A write moves the commit index and last_applied forward in the metrics too.
    after = wait_status(n1.addr, lambda d: True, "status")
    assert cli("kv", "put", "k", "v", "--addr", n2.addr).returncode == 0
    wait_until(lambda: value(scrape(metrics), "dpeer_last_applied", node="n1") > after["last_applied"], 30,
               "dpeer_last_applied to grow after a write")

    # Metrics are served on the configured address only.
    with socket.socket() as other:
        other.settimeout(2)
        assert other.connect_ex(("127.0.0.2", metrics_port)) != 0, "metrics reachable on 127.0.0.2"
