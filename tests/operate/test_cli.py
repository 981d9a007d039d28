"""The `dpeer` command line as an operator's scripts see it (docs/architecture.md "Interfaces").

Exit codes: 0 success, 1 a negative answer, 2 bad usage or config, 3 node unreachable, 4 a
runtime failure; errors are one sentence on stderr (test_conventions.py: env vars, --json, 4).
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest
import yaml

from dpeer.daemon.config import NodeConfig

from tests.support.daemons import WAIT, cli, cli_many, formed, one_sentence, wait_status

COMMANDS = [
    [], ["start"], ["status"], ["members"], ["kv"], ["kv", "put"], ["kv", "get"], ["kv", "list"], ["kv", "delete"],
    ["leave"], ["log"], ["demo"], ["config"], ["config", "show"], ["config", "check"], ["job"], ["job", "retry"],
    ["job", "pause"], ["job", "resume"], ["version"], ["export"],
]


def test_every_command_help_shows_an_example() -> None:
    results = cli_many([[*c, "--help"] for c in COMMANDS])
    for command, result in zip(COMMANDS, results):
        name = " ".join(["dpeer", *command])
        assert result.returncode == 0, (name, result.stderr)
        assert "example:" in result.stdout, f"{name} --help shows no example:\n{result.stdout}"
        example = result.stdout.split("example:", 1)[1].strip().splitlines()[0].strip()
        assert example.startswith(" ".join(["dpeer", *command[:1]])), (name, example)


BAD_USAGE = [
    [],
    ["frobnicate"],
    ["kv", "delete"],
    ["status", "--addr", "127.0.0.1:7101", "--bogus"],
    ["status", "--addr", "nonsense"],
    ["status", "--addr", "127.0.0.1:99999"],
    ["status", "--addr", "127.0.0.1:7101", "--timeout", "soon"],
    ["kv", "put", "onlykey", "--addr", "127.0.0.1:7101"],
    ["kv", "frob", "k"],
    ["start", "--preset", "moon", "--node-id", "n1"],
    ["start", "--node-id", "n1", "--listen", "nohost"],
    ["start", "--node-id", "bad id!", "--listen", "127.0.0.1:7101"],
    ["start", "--node-id", "n1", "--join", "127.0.0.1:7101,garbage"],
    ["start", "--node-id", "n1", "--job", "not a job"],
    ["start", "--listen", "127.0.0.1:7101"],
    ["config", "check"],
    ["log", "--addr", "127.0.0.1:7101", "--from", "0"],
    ["log", "--addr", "127.0.0.1:7101", "--from", "9", "--to", "3"],
    ["status", "--addr", "127.0.0.1:7101", "--timeout", "-5"],
    ["kv", "get", "k", "--addr", "127.0.0.1:7101", "--timeout", "nan"],
]

TOO_LONG = {  # refused before the node is dialled (no node listens on 7101: dialling would exit 3)
    "KEY must be 1 to 256 characters, not 257": ["kv", "put", "k" * 257, "v"],
    "VALUE must be at most 65536 characters, not 65537": ["kv", "put", "k", "v" * 65537],
    "KEY must be 1 to 256 characters, not 0": ["kv", "get", ""],
    "--prefix must be at most 256 characters": ["kv", "list", "--prefix", "p" * 257],
}


def test_a_kv_key_or_value_too_long_is_bad_usage_naming_the_limit() -> None:
    results = cli_many([[*c, "--addr", "127.0.0.1:7101"] for c in TOO_LONG.values()])
    for expected, result in zip(TOO_LONG, results):
        assert result.returncode == 2 and expected in one_sentence(result.stderr), (result.returncode, result.stderr)


def test_bad_flags_exit_2_with_one_sentence(tmp_path: Path) -> None:
    results = cli_many([[*c, "--data-dir", str(tmp_path / "d")] if c[:1] == ["start"] else c for c in BAD_USAGE])
    for command, result in zip(BAD_USAGE, results):
        assert result.returncode == 2, (command, result.returncode, result.stderr)
        one_sentence(result.stderr)
        assert result.stdout == "", (command, result.stdout)
    assert not (tmp_path / "d").exists(), "a refused start must not create its data dir"


BAD_FILES = {
    "unknown_key": ("node_id: n1\nbogus: 1\n", "config key bogus"),
    "unknown_nested_key": ("training:\n  steps: 10\n  stepz: 11\n", "config key training.stepz"),
    "bad_value": ("training:\n  steps: -5\n", "config key training.steps"),
    "bad_type": ("max_voters: lots\n", "config key max_voters"),
    "bad_address": ("listen: nohost\n", "config key listen"),
    "bad_site": ("site: lab 2\n", "config key site: site 'lab 2' is not a site name"),
    "measured_site_name": ("site: auto-n1\n", "config key site: site 'auto-n1' starts with 'auto-'"),
    "bad_reduction": ("training:\n  reduction: approximate\n", "config key training.reduction"),
    "exact_needs_whole_micro_batches": ("training:\n  global_batch: 64\n  micro_batch: 10\n",
                                        "config key training: reduction exact needs global_batch (64) to be a "
                                        "multiple of micro_batch (10)"),
    "bad_security_file": ("security:\n  cluster_token_file: /nonexistent/token\n", "config key security.cluster_token_file"),
    "not_yaml": ("node_id: [n1\n", "not valid YAML at line"),
    "not_a_mapping": ("- n1\n- n2\n", "must be a mapping"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_config_file_exits_2_naming_the_key(tmp_path: Path, case: str) -> None:
    text, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    results = cli_many([
        ["config", "check", str(path)],
        ["config", "show", "--config", str(path)],
        ["start", "--node-id", "n1", "--config", str(path), "--data-dir", str(tmp_path / "d")],
        ["status", "--addr", "127.0.0.1:7101", "--config", str(path)],
    ])
    for result in results:
        assert result.returncode == 2, (result.args, result.stderr)
        line = one_sentence(result.stderr)
        assert expected in line and str(path) in line, line
    assert not (tmp_path / "d").exists()


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    results = cli_many([["config", "check", str(path)], ["start", "--node-id", "n1", "--config", str(path)]])
    for result in results:
        assert result.returncode == 2, result
        assert "cannot read the config file" in one_sentence(result.stderr)


def test_config_check_accepts_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.yaml"
    path.write_text("node_id: box-1\nlisten: 127.0.0.1:7101\njoin: 127.0.0.1:7102,127.0.0.1:7103\n"
                    "preset: edge\ntraining:\n  steps: 10\n")
    result = cli("config", "check", str(path))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout and result.stderr == ""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert cli("config", "check", str(empty)).returncode == 0


def test_config_show_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    path = tmp_path / "dpeer.yaml"
    path.write_text("node_id: from-file\npreset: wan\nmax_voters: 3\ntraining:\n  steps: 7\n  seed: 4\n")
    env = {"DPEER_PRESET": "edge", "DPEER_TRAINING__STEPS": "9", "DPEER_NODE_ID": "from-env"}
    shown = cli_many([
        ["config", "show"],
        ["config", "show", "--config", str(path)],
        ["config", "show", "--config", str(path), "--preset", "lan", "--node-id", "from-flag"],
    ], env=env) + cli_many([["config", "show", "--config", str(path)]])
    docs = []
    for result in shown:
        assert result.returncode == 0, result.stderr
        docs.append(yaml.safe_load(result.stdout))
    env_only, file_env, flags, file_only = docs
    # defaults, overridden by env only
    assert env_only["preset"] == "edge" and env_only["training"]["steps"] == 9 and env_only["max_voters"] == 5
    assert env_only["training"]["lr"] == NodeConfig().training.lr and env_only["node_id"] == "from-env"
    # file alone
    assert file_only["preset"] == "wan" and file_only["training"]["steps"] == 7 and file_only["node_id"] == "from-file"
    # env beats file; file beats defaults where env is silent
    assert file_env["preset"] == "edge" and file_env["training"]["steps"] == 9 and file_env["node_id"] == "from-env"
    assert file_env["max_voters"] == 3 and file_env["training"]["seed"] == 4
    # flags beat env
    assert flags["preset"] == "lan" and flags["node_id"] == "from-flag" and flags["training"]["steps"] == 9


def test_bad_environment_value_exits_2_naming_the_variable() -> None:
    """A wrong value or a wrong key inside a config section is an error; DPEER_* names that are no
    config key at all (DPEER_ADDR, DPEER_SLOW, DPEER_TORCH_BUILD) belong to other tools."""
    results = cli_many([["config", "show"]], env={"DPEER_TRAINING__STEPS": "many"})
    results += cli_many([["config", "show"]], env={"DPEER_TRAINING__STPES": "10"})
    results += cli_many([["config", "show"]], env={"DPEER_ADDR": "127.0.0.1:7100", "DPEER_EXPLORE": "1"})
    assert results[0].returncode == 2 and "DPEER_TRAINING__STEPS" in one_sentence(results[0].stderr)
    assert results[1].returncode == 2 and "DPEER_TRAINING__STPES" in one_sentence(results[1].stderr)
    assert results[2].returncode == 0, results[2].stderr


def test_unreachable_node_exits_3(daemons) -> None:
    free = f"127.0.0.1:{daemons.port()}"  # nothing listens: the kernel refuses
    with socket.socket() as mute:  # accepts TCP but never speaks HTTP/2: the call times out
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        silent = f"127.0.0.1:{mute.getsockname()[1]}"
        commands = [[*c, "--addr", addr, "--timeout", "2"] for addr in (free, silent) for c in (
            ["status"], ["status", "--json"], ["members"], ["kv", "get", "k"], ["kv", "put", "k", "v"], ["leave"])]
        results = cli_many(commands)
    for command, result in zip(commands, results):
        assert result.returncode == 3, (command, result.returncode, result.stderr)
        # under --json the sentence comes as {"error": ..., "exit_code": 3}
        line = json.loads(result.stderr)["error"] if "--json" in command else one_sentence(result.stderr)
        assert "unreachable" in line or "did not answer" in line or "refused the connection" in line, line
        assert result.stdout == ""


CONTRACT = {"node_id", "term", "leader", "role", "commit_index", "last_applied", "members", "group", "train"}


def test_cluster_commands_status_members_kv_and_leave(daemons) -> None:
    n1 = daemons.start("n1")
    n2 = daemons.start("n2", join=[n1.addr])
    n3 = daemons.start("n3", join=[n1.addr, n2.addr])
    formed(n1.addr, {"n1", "n2", "n3"})
    formed(n3.addr, {"n1", "n2", "n3"})

    result = cli("status", "--addr", n2.addr, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert CONTRACT <= set(doc), CONTRACT - set(doc)
    assert doc["node_id"] == "n2" and doc["role"] in ("leader", "follower", "candidate", "pre_candidate", "learner")
    assert isinstance(doc["term"], int) and doc["term"] >= 1
    assert doc["leader"] in ("n1", "n2", "n3")
    assert isinstance(doc["commit_index"], int) and 0 < doc["last_applied"] <= doc["commit_index"]
    assert {m["node_id"] for m in doc["members"]} == {"n1", "n2", "n3"}
    for m in doc["members"]:
        assert {"node_id", "addr", "state", "incarnation", "version"} <= set(m), m
        assert m["speed_class"] is None, m  # no job: no worker reported a speed
        assert m["state"] in ("alive", "suspect", "dead", "left")
        assert isinstance(m["incarnation"], int) and isinstance(m["version"], int)
    assert {m["node_id"]: m["addr"] for m in doc["members"]} == {"n1": n1.addr, "n2": n2.addr, "n3": n3.addr}
    group = doc["group"]
    assert group is not None and {"generation", "world_size", "rank", "members"} <= set(group)
    assert group["world_size"] == 3 and group["members"][group["rank"]] == "n2"
    assert group["shares"] == []  # even: no member's speed is known
    assert doc["train"] is None  # no --job

    human, members, members_json, absent, absent_json = cli_many([
        ["status", "--addr", n1.addr], ["members", "--addr", n3.addr], ["members", "--addr", n3.addr, "--json"],
        ["kv", "get", "never-set", "--addr", n2.addr], ["kv", "get", "never-set", "--addr", n2.addr, "--json"],
    ])
    assert human.returncode == 0 and "node n1" in human.stdout and "term" in human.stdout, human
    assert members.returncode == 0 and all(n in members.stdout for n in ("n1", "n2", "n3")), members
    rows = json.loads(members_json.stdout)
    assert sorted(r["node_id"] for r in rows) == ["n1", "n2", "n3"]
    assert absent.returncode == 1 and absent.stdout == "" and "not set" in one_sentence(absent.stderr)
    assert absent_json.returncode == 1 and json.loads(absent_json.stdout) == {
        "key": "never-set", "found": False, "value": None}

    put = cli("kv", "put", "lr", "0.01", "--addr", n3.addr)  # a follower forwards to the leader, most likely
    assert put.returncode == 0, put.stderr
    assert "committed" in put.stdout
    for node in (n1, n2, n3):
        got = cli("kv", "get", "lr", "--addr", node.addr, "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == {"key": "lr", "found": True, "value": "0.01"}
    plain = cli("kv", "get", "lr", "--addr", n1.addr)
    assert plain.returncode == 0 and plain.stdout.strip() == "0.01"

    # dpeer leave: the node commits its leave, its daemon exits 0, the others mark it left.
    left = cli("leave", "--addr", n3.addr)
    assert left.returncode == 0, left.stderr
    assert n3.wait_exit(WAIT) == 0, n3.tail()
    for node in (n1, n2):
        wait_status(node.addr, lambda d: any(m["node_id"] == "n3" and m["state"] == "left"
                                             and m.get("committed") == "left" for m in d["members"]),
                    f"n3 marked left at {node.node_id}")
    after = cli("status", "--addr", n3.addr, "--timeout", "2")
    assert after.returncode == 3, after
    # the rest of the cluster still commits
    assert cli("kv", "put", "after-leave", "1", "--addr", n1.addr).returncode == 0
    assert n1.running and n2.running
    daemons.signal(n1, signal.SIGKILL)


def log_rows(addr: str, *flags: str) -> list[dict]:
    """`dpeer log --json` of a node, parsed (it must succeed)."""
    result = cli("log", "--addr", addr, "--json", *flags)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_dpeer_log_shows_equal_committed_prefixes_on_every_node(daemons) -> None:
    n1 = daemons.start("n1")
    n2 = daemons.start("n2", join=[n1.addr])
    formed(n1.addr, {"n1", "n2"})
    for i in range(3):
        assert cli("kv", "put", f"k{i}", str(i), "--addr", n2.addr).returncode == 0
    commit = min(wait_status(n.addr, lambda d: d["commit_index"] >= 5, "5 committed")["commit_index"] for n in (n1, n2))
    one, two = log_rows(n1.addr, "--to", str(commit)), log_rows(n2.addr, "--to", str(commit))
    assert one == two and [r["index"] for r in one] == list(range(1, commit + 1))
    assert all(set(r) == {"index", "term", "kind", "hash"} and len(r["hash"]) == 64 for r in one)
    assert one[0]["kind"] == "config_change" and sum(r["kind"] == "kv_put" for r in one) == 3
    assert log_rows(n1.addr, "--from", "2", "--to", "3") == one[1:3]
    text = cli("log", "--addr", n1.addr, "--to", "1")
    assert text.returncode == 0 and text.stdout.split() == ["1", str(one[0]["term"]), "config_change", one[0]["hash"]]
    beyond = cli("log", "--addr", n1.addr, "--from", str(commit), "--to", str(commit + 1000), "--json")
    assert beyond.returncode == 1 and "not committed" in json.loads(beyond.stderr)["error"]
    assert json.loads(beyond.stdout.splitlines()[0])["index"] == commit  # what it holds comes first
