"""The typed payloads: what each kind of entry must hold, the dict form the log stores, and the
read back of dicts an older build or a stranger wrote."""

from __future__ import annotations

import pytest

from dpeer.statemachine.entry import EntryKind, pack_payload, unpack_payload
from dpeer.statemachine.payloads import (
    MAX_SPEED_CLASS, MIN_SPEED_CLASS, BadPayload, CheckpointTaken, ConfigChange, ControlChange, ControlMode, JobChange,
    JobState, KvPut, MemberJoined, Noop, ViewChange, decode,
)
from dpeer.view import MAX_SHARE

U1, U2 = "1" * 32, "2" * 32


@pytest.mark.parametrize("kind,payload,ok", [
    (EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1"}, True),
    (EntryKind.MEMBER_JOINED, {"node_id": "", "addr": "h:1"}, False),
    (EntryKind.VIEW, {"generation": 1, "members": ["a", "b"], "store_host": "h:2"}, True),
    (EntryKind.VIEW, {"generation": 0, "members": ["a"], "store_host": "h:2"}, False),
    (EntryKind.VIEW, {"generation": 1, "members": ["a", "a"], "store_host": "h:2"}, False),
    (EntryKind.VIEW, {"generation": True, "members": ["a"], "store_host": "h"}, False),
    (EntryKind.CHECKPOINT, {"step": 5, "digest": "ab", "holders": ["a"]}, True),
    (EntryKind.CHECKPOINT, {"step": -1, "digest": "ab", "holders": []}, False),
    (EntryKind.KV_PUT, {"key": "k", "value": "v"}, True),
    (EntryKind.KV_PUT, {"key": "k", "value": 3}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": ["b"], "uids": {"a": U1, "b": U2}, "epoch": 1}, True),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": [], "uids": {"a": U1}, "epoch": 2, "forced_at": 1.5},
     True),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": ["a"], "uids": {"a": U1}, "epoch": 1}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": [], "learners": [], "uids": {}, "epoch": 1}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": ["b"]}, False),  # no identities
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": ["b"], "uids": {"a": U1}, "epoch": 1}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": [], "uids": {"a": "xyz"}, "epoch": 1}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": [], "uids": {"a": U1}, "epoch": 0}, False),
    (EntryKind.CONFIG_CHANGE, {"voters": ["a"], "learners": [], "uids": {"a": U1}, "epoch": 1, "forced_at": 3},
     False),  # forced_at is a float
    (EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1", "uid": U1}, True),
    (EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1", "uid": "nope"}, False),
    (EntryKind.NOOP, {}, True),
    (EntryKind.JOB, {"state": "failed", "error": "boom", "node": "a", "step": 3}, True),
    (EntryKind.JOB, {"state": "finished"}, False),  # only the final checkpoint finishes a job
    (EntryKind.JOB, {"state": "running", "step": -1}, False),
])
def test_payload_schemas(kind: EntryKind, payload: dict, ok: bool) -> None:
    if ok:
        typed = decode(kind, payload)
        assert typed.KIND is kind and decode(kind, typed.to_payload()) == typed
    else:
        with pytest.raises(BadPayload, match=kind.value):
            decode(kind, payload)


def test_every_kind_but_noop_refuses_an_empty_dict() -> None:
    for kind in EntryKind:
        if kind is EntryKind.NOOP:
            assert decode(kind, {}) == Noop()
        else:
            with pytest.raises(BadPayload, match=f"^{kind.value}: .* missing$"):
                decode(kind, {})


def test_the_dict_form_lists_every_field_and_survives_msgpack() -> None:
    view = ViewChange(3, ("a", "b"), "h:1", "s", ("lab-2", "auto-b"))
    assert view.to_payload() == {"generation": 3, "members": ["a", "b"], "store_host": "h:1", "secret": "s",
                                 "sites": ["lab-2", "auto-b"], "shares": []}
    assert decode(EntryKind.VIEW, unpack_payload(pack_payload(view.to_payload()))) == view
    conf = ConfigChange(("a",), ("b",), {"a": U1, "b": U2}, 2, 1.5)
    assert decode(EntryKind.CONFIG_CHANGE, unpack_payload(pack_payload(conf.to_payload()))) == conf


def test_sites_are_checked_and_absent_from_an_older_build_means_none() -> None:
    old_view = {"generation": 1, "members": ["a", "b"], "store_host": "h:1", "secret": "s"}
    assert decode(EntryKind.VIEW, old_view).sites == ()
    assert decode(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1"}) == MemberJoined("a", "h:1", site="", near=())
    joined = MemberJoined("a", "h:1", site="lab-2", near=("b", "c"))
    assert decode(EntryKind.MEMBER_JOINED, unpack_payload(pack_payload(joined.to_payload()))) == joined
    for bad in ({"sites": ["x"]}, {"sites": ["x", "bad site"]}, {"sites": ["x", ""]}):
        with pytest.raises(BadPayload, match="sites"):
            decode(EntryKind.VIEW, {**old_view, **bad})
    for bad, what in (({"site": "a b"}, "site"), ({"near": ["a"]}, "near"), ({"near": ["b", "b"]}, "near")):
        with pytest.raises(BadPayload, match=what):
            decode(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1", **bad})


def test_speed_classes_and_shares_are_checked_and_absent_from_an_older_build_mean_unknown_and_even() -> None:
    old_view = {"generation": 1, "members": ["a", "b"], "store_host": "h:1", "secret": "s"}
    assert decode(EntryKind.VIEW, old_view).shares == ()
    assert decode(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1"}).speed_class is None
    view = ViewChange(2, ("a", "b"), "h:1", shares=(8, 4))
    assert decode(EntryKind.VIEW, unpack_payload(pack_payload(view.to_payload()))) == view
    for klass in (MIN_SPEED_CLASS, 0, MAX_SPEED_CLASS):
        joined = MemberJoined("a", "h:1", speed_class=klass)
        assert decode(EntryKind.MEMBER_JOINED, unpack_payload(pack_payload(joined.to_payload()))) == joined
    for bad in ([8], [8, 0], [8, MAX_SHARE + 1], [8, 4.0], [8, True], "84"):
        with pytest.raises(BadPayload, match="shares must give every member a weight"):
            decode(EntryKind.VIEW, {**old_view, "shares": bad})
    for bad in (MIN_SPEED_CLASS - 1, MAX_SPEED_CLASS + 1, 1.5, "3", True):
        with pytest.raises(BadPayload, match="speed_class must be None"):
            decode(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1", "speed_class": bad})


def test_absent_optional_fields_take_defaults_and_extra_keys_are_ignored() -> None:
    assert decode(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "h:1", "later": 1}) == MemberJoined("a", "h:1")
    assert decode(EntryKind.CHECKPOINT, {"step": 1, "digest": "d", "holders": []}) == CheckpointTaken(1, "d", ())
    assert decode(EntryKind.NOOP, {"anything": 1}) == Noop()


def test_a_job_state_reads_back_as_the_enum() -> None:
    assert decode(EntryKind.JOB, {"state": "failed"}).state is JobState.FAILED
    assert JobChange(JobState.RUNNING).to_payload()["state"] == "running"


def test_a_control_mode_reads_back_as_the_enum_and_an_unknown_one_is_refused() -> None:
    assert decode(EntryKind.CONTROL, {"mode": "paused"}).mode is ControlMode.PAUSED
    assert ControlChange(ControlMode.RUNNING).to_payload() == {"mode": "running"}
    for bad in ("draining", "", 1, None, ["paused"]):
        with pytest.raises(BadPayload, match="^control: mode must be one of running, paused$"):
            decode(EntryKind.CONTROL, {"mode": bad})


def test_a_missing_required_field_names_the_kind() -> None:
    with pytest.raises(BadPayload, match="^kv_put: value missing$"):
        decode(EntryKind.KV_PUT, {"key": "k"})


@pytest.mark.parametrize("build", [
    lambda: KvPut("", "v"), lambda: JobChange(JobState.FINISHED), lambda: ViewChange(1, ["a"], "h:1"),
    lambda: MemberJoined("a", "h:1", store_port=70000), lambda: CheckpointTaken(1, "d", ("a", "a")),
])
def test_a_proposer_cannot_build_a_malformed_payload(build) -> None:
    with pytest.raises(BadPayload):
        build()
