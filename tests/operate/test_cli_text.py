"""`dpeer status` and `dpeer members` as text (cli/status_text.py, from status documents shaped as
the daemon writes them), and "did you mean" for a mistyped command or config key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpeer.cli.status_text import committed_step, member_rows, members_table, status_lines
from tests.support.daemons import cli_many, one_sentence


def member(node: str, port: int, state: str = "alive") -> dict[str, Any]:
    return {"node_id": node, "addr": f"10.0.0.{port}:7100", "state": state, "incarnation": 1, "version": 40,
            "committed": "joined", "rtt_ms": 0.4}


def doc(job: dict[str, Any] | None, train: dict[str, Any] | None = None, group: list[str] | None = None,
        **more: Any) -> dict[str, Any]:
    """A status document of n1 (leader) with n2 (voter), n3 (learner) and n4 (not committed)."""
    members = [member("n1", 1), member("n2", 2), member("n3", 3, "dead"), member("n4", 4)]
    view = None if group is None else {"generation": 4, "world_size": len(group), "rank": group.index("n1"),
                                       "members": group}
    return {"node_id": "n1", "addr": "10.0.0.1:7100", "term": 3, "leader": "n1", "role": "leader",
            "commit_index": 40, "last_applied": 40, "members": members, "voters": ["n1", "n2"], "learners": ["n3"],
            "group": view, "train": train, "job": job, "control": "running", "no_leader": None, **more}


TRAIN = {"step": 10, "samples": 640, "loss": 0.25, "params_digest": "ab" * 32, "latest_step": 17}
TRAINING = {"state": "training", "error": None, "last_failure": None, "kept_out": None}


def test_the_step_is_the_newest_committed_one_not_the_newest_digested_one() -> None:
    assert committed_step(doc(TRAINING, TRAIN)) == 17
    # a restarted worker counts from where it resumes: the digested step still stands until then
    assert committed_step(doc(TRAINING, {**TRAIN, "latest_step": 0})) == 10
    assert committed_step(doc({"state": "finished", "error": None, "step": 80, "digest": "cd" * 32}, TRAIN)) == 80
    assert committed_step(doc(None)) is None
    lines = status_lines(doc(TRAINING, TRAIN, ["n1", "n2"]))
    assert "job training  step 17" in lines, lines
    assert any(line.startswith("digest at step 10  samples 640  loss 0.25") for line in lines), lines


def test_a_halted_job_shows_its_reason_and_what_to_do() -> None:
    error = ("ValueError: boom (at step 3 on n2; the same failure 3 times in a row): the job cannot train")
    lines = status_lines(doc({"state": "failed", "error": error, "node": "n2", "step": 3}, TRAIN))
    assert f"job failed: {error}" in lines, lines
    assert "what to do: fix the cause on every box, then `dpeer job retry`" in lines, lines


def test_a_failure_here_and_the_boxes_kept_out_are_shown() -> None:
    job = {**TRAINING, "last_failure": {"phase": "build", "step": 0, "error": "ImportError: no torchvision",
                                        "repeats": 2},
           "kept_out": {"n3": "ModuleNotFoundError: No module named 'x'"}}
    lines = status_lines(doc(job, TRAIN, ["n1", "n2"]))
    assert "last failure here: build at step 0, 2 times in a row: ImportError: no torchvision" in lines, lines
    assert "kept out of the group: n3: ModuleNotFoundError: No module named 'x'" in lines, lines


def test_a_node_without_a_job_says_so() -> None:
    assert "job none (this node runs no job: `dpeer start --job`)" in status_lines(doc(None))


def test_one_line_per_member_with_address_state_role_and_step() -> None:
    rows = member_rows(doc(TRAINING, TRAIN, ["n2", "n1"]))
    assert [(r["role"], r["kind"], r["rank"], r["step"]) for r in rows] == [
        ("leader", "voter", 1, 17), ("voter", "voter", 0, 17), ("learner", "learner", None, None),
        (None, None, None, None)]
    table = members_table(rows)
    assert table[0].split() == ["NODE", "ADDR", "STATE", "ROLE", "RANK", "STEP", "INC", "VERSION", "SITE", "SPEED",
                                "SHARE"]
    assert [line.split()[:6] for line in table[1:]] == [
        ["n1", "10.0.0.1:7100", "alive", "leader", "1", "17"], ["n2", "10.0.0.2:7100", "alive", "voter", "0", "17"],
        ["n3", "10.0.0.3:7100", "dead", "learner", "-", "-"], ["n4", "10.0.0.4:7100", "alive", "-", "-", "-"]]
    assert table[1:] == status_lines(doc(TRAINING, TRAIN, ["n2", "n1"]))[-4:]
    # a node outside the group does not know the group's step
    assert {r["step"] for r in member_rows(doc(TRAINING, TRAIN))} == {None}


def test_the_members_table_shows_each_member_s_site() -> None:
    status = doc(TRAINING, TRAIN, ["n1", "n2"])
    for m, site in zip(status["members"], ["lab-2", "lab-2", "auto-n3", None]):
        m["site"] = site
    del status["members"][3]["site"]  # a status from a daemon older than sites
    table = members_table(member_rows(status))
    assert [line.split()[0:9:8] for line in table] == [
        ["NODE", "SITE"], ["n1", "lab-2"], ["n2", "lab-2"], ["n3", "auto-n3"], ["n4", "-"]]


def test_the_members_table_shows_each_member_s_speed_and_share_of_a_step() -> None:
    status = doc(TRAINING, TRAIN, ["n1", "n2"])
    for m, speed_class in zip(status["members"], [12, 8, None, "fast"]):
        m["speed_class"] = speed_class  # n4's: a status of another version, shown as unknown
    status["group"]["shares"] = [8, 4]
    table = members_table(member_rows(status))
    assert [line.split()[-2:] for line in table] == [
        ["SPEED", "SHARE"], ["8/s", "8"], ["4/s", "4"], ["-", "-"], ["-", "-"]]
    status["group"]["shares"] = []  # an even split
    assert [line.split()[-1] for line in members_table(member_rows(status))][1:3] == ["even", "even"]


def test_the_speed_and_share_columns_of_a_status_of_another_shape_do_not_raise() -> None:
    status = doc(TRAINING, TRAIN, ["n1", "n2"])
    # classes out of the records' range (-80 to 80): 2 ** (5000 / 4) overflows a float, 10 ** 400 / 4 too
    for m, speed_class in zip(status["members"], [5000, 10 ** 400, -5000, 81]):
        m["speed_class"] = speed_class
    status["group"]["shares"] = [8, 4]
    assert [line.split()[-2] for line in members_table(member_rows(status))][1:] == ["-", "-", "-", "-"]
    # shares that are not one weight per member: "-" (not known), never "even", never a raise
    for shares in (5, True, {"n1": 8}, "84", [8], [8, 4, 2]):
        status["group"]["shares"] = shares
        table = members_table(member_rows(status))
        assert [line.split()[-1] for line in table][1:3] == ["-", "-"], (shares, table)
    status["group"]["shares"] = None  # an even split, as an empty list
    assert [line.split()[-1] for line in members_table(member_rows(status))][1:3] == ["even", "even"]


def test_share_weights_and_group_members_of_another_shape_show_unknown_and_do_not_raise() -> None:
    status = doc(TRAINING, TRAIN, ["n1", "n2"])
    # one entry per member, but not weights: a bool, a list, a line break that would end the row, 0
    for shares in ([True, 4], [[8], 4], ["8\nn9 forged row", 4], [0, 4], [8.5, 4], [None, 4]):
        status["group"]["shares"] = shares
        table = members_table(member_rows(status))
        assert len(table) == 5 and [line.split()[-1] for line in table][1:3] == ["-", "-"], (shares, table)
    status["group"]["shares"] = [8, 4]
    for members in (None, 5, [["n1"], "n2"], {"n1": 0}):  # group.members not a list of node ids
        status["group"]["members"] = members
        table = members_table(member_rows(status))
        assert [line.split()[4] for line in table][1:] == ["-"] * 4, (members, table)  # RANK: not in a group
    for group in ([1, 2], "n1", 7):  # a group that is no object
        status["group"] = group
        assert len(members_table(member_rows(status))) == 5

def test_a_mistyped_command_gets_the_closest_one() -> None:
    cases = {("stauts",): "did you mean 'status'?", ("kv", "gte", "k"): "did you mean 'get'?",
             ("job", "pase"): "did you mean 'pause'?", ("membres", "--json"): "did you mean 'members'?",
             ("config", "init"): "'init' is not a `dpeer config` command (commands: show, check"}
    results = cli_many([list(c) for c in cases])
    for (command, expected), result in zip(cases.items(), results):
        assert result.returncode == 2 and result.stdout == "", (command, result)
        if "--json" in command:
            assert expected in result.stderr and '"exit_code": 2' in result.stderr, result.stderr
        else:
            assert expected in one_sentence(result.stderr), result.stderr


MISTYPED = {
    "traning:\n  steps: 3\n": "config key traning: no such key; did you mean training?",
    "training:\n  stpes: 3\n": "config key training.stpes: no such key; did you mean training.steps?",
    "timing:\n  raft:\n    heartbeat: 2\n": "did you mean timing.raft.heartbeat_interval?",
    "bogus: 1\n": "config key bogus: no such key; `dpeer config show` prints every key",
}


@pytest.mark.parametrize("body", sorted(MISTYPED))
def test_a_mistyped_config_key_gets_the_closest_one(tmp_path: Path, body: str) -> None:
    path = tmp_path / "dpeer.yaml"
    path.write_text(body)
    check, start = cli_many([["config", "check", str(path)],
                             ["start", "--node-id", "n1", "--config", str(path), "--data-dir", str(tmp_path / "d")]])
    for result in (check, start):
        assert result.returncode == 2 and MISTYPED[body] in one_sentence(result.stderr), result.stderr


def test_a_mistyped_environment_variable_gets_the_closest_variable() -> None:
    result, = cli_many([["config", "show"]], env={"DPEER_TRAINING__STPES": "10"})
    assert result.returncode == 2
    assert "DPEER_TRAINING__STPES (config key training.stpes): no such key; did you mean DPEER_TRAINING__STEPS?" \
        in one_sentence(result.stderr)


def test_bytes_across_sites_show_once_some_crossed() -> None:
    quiet = {"daemon": {"sent": 0, "received": 0}, "worker": {"sent": 0, "received": 0}}
    assert not any(line.startswith("across sites") for line in status_lines(doc(TRAINING, cross_site_bytes=quiet)))
    assert not any(line.startswith("across sites") for line in status_lines(doc(TRAINING, cross_site_bytes=None)))
    moved = {"daemon": {"sent": 800, "received": 2048}, "worker": {"sent": 3 * 2**30 + 2**29, "received": 1}}
    assert ("across sites: daemon sent 800 B received 2.0 KiB  worker sent 3.5 GiB received 1 B"
            in status_lines(doc(TRAINING, cross_site_bytes=moved)))


def test_bytes_across_sites_of_another_shape_are_left_out_not_raised_on() -> None:
    """A daemon of another version may write the field otherwise: the status text still renders."""
    odd = {"daemon": {"sent": "lots"}, "worker": [1, 2], "gloo": {"sent": 5, "received": 7}}
    assert "across sites: gloo sent 5 B received 7 B" in status_lines(doc(TRAINING, cross_site_bytes=odd))
    for field in ([1, 2], "x", 3, {"daemon": None}):
        assert not any(line.startswith("across sites") for line in status_lines(doc(TRAINING, cross_site_bytes=field)))
