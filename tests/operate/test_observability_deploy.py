"""What a fleet plugs in (deploy/): the Prometheus scrape config, the alert rules and the Grafana
dashboard. Every series a rule or a panel names is one the daemon exports, with its labels and,
for enumerated labels and histogram bounds, a value it takes. With promtool installed (Debian's
`prometheus` package ships it), the config and rules are checked, the rules' unit tests
(alerts_test.yml) run, and every dashboard query parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from dpeer.daemon.decide.job_status import JobStatus
from dpeer.membership import MemberState
from dpeer.security.auth import Refusal
from dpeer.statemachine.state import MemberStatus
from tests.operate.test_observability_metrics import generator

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS, GRAFANA = ROOT / "deploy" / "prometheus", ROOT / "deploy" / "grafana" / "dpeer.json"
TARGET_LABELS = {"job", "instance"}  # what Prometheus adds to every scraped series
ENUMS: dict[tuple[str, str], type[Enum]] = {
    ("dpeer_job_state", "state"): JobStatus, ("dpeer_members", "state"): MemberState,
    ("dpeer_committed_members", "status"): MemberStatus, ("dpeer_refused_requests_total", "reason"): Refusal,
}
ISSUE_ALERTS = {"DpeerJobFailed", "DpeerNoLeader", "DpeerNodeDead", "DpeerRecoverySlow", "DpeerBoxKeptOut",
                "DpeerDataDirNearlyFull"}
NO_PROMTOOL = "promtool is not installed (Debian: apt-get install -y prometheus, whose package ships it)"

# -- the series the code exports, and the ones a PromQL expression names --------------------------


def exported() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Series name -> its labels, and histogram bucket series -> its `le` values."""
    gen = generator()
    labels, bounds = {}, {}
    for family in gen.families():
        for name in gen.series(family):
            labels[name] = set(family.labels) | ({"le"} if name.endswith("_bucket") else set())
            if name.endswith("_bucket"):
                bounds[name] = set(family.buckets)
    return labels, bounds


TOKEN = re.compile(r'''\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)|(?P<range>\[[^\]]*\])'''
                   r'''|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w:]))|(?P<ident>[A-Za-z_:][\w:]*)'''
                   r'''|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},]))''')
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
            "count_values", "group", "inf", "nan"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def tokens(expr: str) -> Iterator[tuple[str, str]]:
    """(kind, text) of each PromQL token; ValueError on text it cannot read."""
    pos, expr = 0, expr.strip()
    while pos < len(expr):
        match = TOKEN.match(expr, pos)
        if not match or match.end() == pos:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        yield kind, match.group(kind)
        pos = match.end()


def parse(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The vector selectors of a PromQL expression as (metric, [(label, op, value)]), and the
    labels its by/without/on/ignoring clauses name."""
    toks = list(tokens(expr))
    selectors, grouping, i = [], set(), 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in GROUPING and following == "(":
            end = next(j for j in range(i + 2, len(toks)) if toks[j][1] == ")")
            grouping |= {t for k, t in toks[i + 2:end] if k == "ident"}
            i = end + 1
        elif kind == "ident" and text not in KEYWORDS and following != "(":
            matchers, i = [], i + 1
            if following == "{":
                end = next(j for j in range(i, len(toks)) if toks[j][1] == "}")
                body = [t for k, t in toks[i + 1:end] if t != ","]
                matchers = [(body[j], body[j + 1], json.loads(body[j + 2].replace("'", '"')))
                            for j in range(0, len(body), 3)]
                i = end + 1
            selectors.append((text, matchers))
        else:
            i += 1
    return selectors, grouping


def problems(expr: str) -> list[str]:
    """What in `expr` names a series, label or value the daemon does not export."""
    labels, bounds = exported()
    every = set().union(*labels.values()) | TARGET_LABELS
    found = []
    selectors, grouping = parse(expr)
    for name, matchers in selectors:
        if name not in labels:
            found.append(f"{name} is not a series dpeer exports")
            continue
        for label, op, value in matchers:
            enum = ENUMS.get((name, label))
            if label not in labels[name] | TARGET_LABELS:
                found.append(f"{name} has no label {label}")
            elif op == "=" and "$" not in value and enum is not None and value not in {e.value for e in enum}:
                found.append(f"{name}{{{label}}} is never {value!r}")
            elif op == "=" and label == "le" and value not in bounds[name]:
                found.append(f"{name} has no bucket le={value!r}")
    found += [f"no series has the label {label}" for label in sorted(grouping - every)]
    if not selectors:
        found.append(f"{expr!r} names no series")
    return found


@pytest.mark.parametrize("expr, expected", [
    ('max without (node, instance) (dpeer_job_state{state="failed"}) == 1', []),
    ('dpeer_job_stat{state="failed"} == 1', ["dpeer_job_stat is not a series dpeer exports"]),
    ('dpeer_job_state{state="halted"} == 1', ["dpeer_job_state{state} is never 'halted'"]),
    ('dpeer_term{status="x"}', ["dpeer_term has no label status"]),
    ('increase(dpeer_reforms[5m])', ["dpeer_reforms is not a series dpeer exports"]),  # a counter is NAME_total
    ('increase(dpeer_recovery_seconds_bucket{le="10"}[15m])', ["dpeer_recovery_seconds_bucket has no bucket le='10'"]),
    ('sum by (cluster) (dpeer_term)', ["no series has the label cluster"]),
    ('rate(dpeer_refused_requests_total{job="$job", reason=~"a|b"}[$__rate_interval]) > 4 * 3600', []),
])
def test_the_checker_finds_what_the_daemon_does_not_export(expr: str, expected: list[str]) -> None:
    assert problems(expr) == expected


# -- the alert rules -----------------------------------------------------------------------------

def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_names_only_exported_series_and_says_what_to_do() -> None:
    alerts = rules()
    assert ISSUE_ALERTS <= {rule["alert"] for rule in alerts}
    for rule in alerts:
        assert problems(rule["expr"]) == [], rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_alert_has_unit_tests_that_raise_it_and_keep_it_quiet() -> None:
    doc = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    checks = [check for test in doc["tests"] for check in test["alert_rule_test"]]
    for rule in rules():
        mine = [check for check in checks if check["alertname"] == rule["alert"]]
        assert any(check["exp_alerts"] for check in mine), f"no test raises {rule['alert']}"
        assert any(not check["exp_alerts"] for check in mine), f"no test keeps {rule['alert']} quiet"
    for test in doc["tests"]:
        for series in test["input_series"]:
            assert problems(series["series"]) == [], series["series"]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    checked = promtool("check", "rules", "alerts.yml", cwd=PROMETHEUS)
    assert checked.returncode == 0 and f"SUCCESS: {len(rules())} rules found" in checked.stdout, checked
    tested = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_the_rule_tests_fail_when_a_rule_never_fires(tmp_path: Path) -> None:
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(PROMETHEUS / name, tmp_path / name)
    rules_file = tmp_path / "alerts.yml"
    rules_file.write_text(rules_file.read_text().replace("leaderless_seconds > 60", "leaderless_seconds > 600"))
    tested = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode != 0 and "DpeerNoLeader" in tested.stdout + tested.stderr, tested


# -- the scrape config ---------------------------------------------------------------------------

def test_the_scrape_config_reads_metrics_over_tls_with_a_client_certificate_on_port_7190() -> None:
    doc = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert doc["rule_files"] == ["alerts.yml"]
    job = next(j for j in doc["scrape_configs"] if j["job_name"] == "dpeer")
    assert job["scheme"] == "https"
    assert set(job["tls_config"]) == {"ca_file", "cert_file", "key_file", "server_name"}
    assert job["tls_config"]["server_name"] == "dpeer"  # every node certificate names it
    assert Path(job["tls_config"]["cert_file"]).name == "client-prometheus.pem"  # dpeer certs create-client prometheus
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets and all(t.endswith(":7190") for t in targets), targets


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    """promtool opens the TLS files the config names: here, stand-ins in a copy's directory."""
    config = (PROMETHEUS / "prometheus.yml").read_text()
    for name in ("ca.pem", "client-prometheus.pem", "client-prometheus.key"):
        (tmp_path / name).write_text("stand-in\n")
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/dpeer/", f"{tmp_path}/"))
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- the dashboard -------------------------------------------------------------------------------

def dashboard_queries() -> list[str]:
    doc = json.loads(GRAFANA.read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels), "a panel without a query"
    queries = [target["expr"] for p in panels for target in p["targets"]]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
            assert match and match.group(2) in {"job", "node"}, variable["definition"]
            queries.append(match.group(1))
    return queries


def test_every_dashboard_query_names_a_series_the_code_exports() -> None:
    doc = json.loads(GRAFANA.read_text())
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"]), "panel ids repeat"
    for query in dashboard_queries():
        assert problems(query) == [], query


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, as a recording rule promtool parses."""
    filled = [q.replace("$__rate_interval", "1m").replace("$job", "dpeer").replace("$node", ".*")
              for q in dashboard_queries()]
    records = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(filled)]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    checked = promtool("check", "rules", "dashboard.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
