"""The pure apply function and the cluster state's serialization."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import CorruptState
from dpeer.statemachine.snapshot import decode_snapshot, encode_snapshot
from dpeer.statemachine.state import (
    ClusterState,
    apply,
    apply_many,
    decode_state,
    encode_state,
    state_from_dict,
    state_to_dict,
)

K = EntryKind


def conf(voters: list[str], learners: list[str]) -> dict:
    """A config_change payload naming each member with a store uid derived from its name."""
    return {"voters": voters, "learners": learners, "uids": {n: f"{sum(map(ord, n)):032x}" for n in voters + learners},
            "epoch": 1}


def run(*specs: tuple[EntryKind, dict]) -> tuple[ClusterState, list]:
    entries = [Entry(i, 1, kind, payload) for i, (kind, payload) in enumerate(specs, 1)]
    return apply_many(ClusterState(), entries)


def join(n: str) -> tuple[EntryKind, dict]:
    return K.MEMBER_JOINED, {"node_id": n, "addr": f"{n}:1"}


def view(gen: int, *members: str) -> tuple[EntryKind, dict]:
    return K.VIEW, {"generation": gen, "members": list(members), "store_host": "h:9"}


def test_membership_lifecycle() -> None:
    s, res = run(join("a"), join("b"), (K.MEMBER_DEAD, {"node_id": "b"}),
                 (K.MEMBER_LEFT, {"node_id": "a"}), (K.MEMBER_LEFT, {"node_id": "zz"}), join("b"))
    assert [r.accepted for r in res] == [True, True, True, True, False, True]
    assert s.members["a"].status == "left" and s.members["b"].status == "active"
    assert s.members["b"].joined_index == 6, "a rejoin starts a new membership"
    assert "unknown member" in res[4].reason


def test_one_view_per_generation() -> None:
    s, res = run(join("a"), join("b"), view(1, "b", "a"), view(1, "a"), view(3, "a"), view(2, "a"))
    assert [r.accepted for r in res[2:]] == [True, False, False, True]
    assert s.view is not None and s.view.generation == 2 and s.view.members == ("a",)
    assert s.applied_index == 6


def control(mode: str) -> tuple[EntryKind, dict]:
    return K.CONTROL, {"mode": mode}


def test_a_pause_admits_only_an_empty_view_and_a_resume_only_a_full_one() -> None:
    s, res = run(join("a"), view(1, "a"), view(2), control("paused"), view(2, "a"), view(2), control("paused"),
                 control("running"), view(3), view(3, "a"), control("draining"))
    assert [r.accepted for r in res] == [True, True, False, True, False, True, False, True, False, True, False]
    assert "only ends a group while training is paused" in res[2].reason
    assert "training is paused" in res[4].reason and "already paused" in res[6].reason
    assert "malformed payload" in res[10].reason
    assert s.control == "running" and s.view.generation == 3 and s.view.members == ("a",)
    paused, _ = apply_many(s, [Entry(12, 1, K.CONTROL, {"mode": "paused"})])
    assert state_from_dict(state_to_dict(paused)).control is paused.control
    assert state_from_dict(state_to_dict(paused)) == paused


def test_a_paused_state_with_its_empty_view_survives_a_snapshot() -> None:
    s, res = run(join("a"), view(1, "a"), control("paused"), (K.VIEW, {"generation": 2, "members": [], "store_host": ""}))
    assert all(r.accepted for r in res) and s.view.members == () and s.control == "paused"
    assert state_from_dict(state_to_dict(s)) == s


def test_a_final_checkpoint_that_lands_after_a_pause_finishes_the_job_and_ends_the_pause() -> None:
    s, res = run(join("a"), view(1, "a"), control("paused"),
                 (K.CHECKPOINT, {"step": 5, "digest": "d", "holders": ["a"], "final": True}))
    assert all(r.accepted for r in res) and s.job.state == "finished" and s.control == "running"


def test_a_finished_job_cannot_be_paused() -> None:
    s, res = run(join("a"), view(1, "a"), (K.CHECKPOINT, {"step": 5, "digest": "d", "holders": ["a"], "final": True}),
                 control("paused"))
    assert not res[3].accepted and "already finished" in res[3].reason and s.control == "running"


def test_view_must_name_active_members() -> None:
    s, res = run(join("a"), (K.MEMBER_DEAD, {"node_id": "a"}), view(1, "a"))
    assert not res[2].accepted and s.view is None


def test_checkpoint_kv_config() -> None:
    s, res = run((K.CHECKPOINT, {"step": 10, "digest": "d1", "holders": ["a"]}),
                 (K.CHECKPOINT, {"step": 10, "digest": "d2", "holders": ["a"]}),
                 (K.KV_PUT, {"key": "x", "value": "1"}), (K.KV_DELETE, {"key": "y"}),
                 (K.CONFIG_CHANGE, conf(["a"], ["b"])), (K.NOOP, {}), (K.KV_PUT, {"key": "x"}))
    assert [r.accepted for r in res] == [True, False, True, False, True, True, False]
    assert s.checkpoint is not None and s.checkpoint.digest == "d1"
    assert dict(s.kv) == {"x": "1"}
    assert s.voters == ("a",) and s.learners == ("b",)
    assert res[6].reason == "malformed payload (kv_put: value missing)"


def test_apply_refuses_out_of_order_and_term_regression() -> None:
    s, _ = run((K.NOOP, {}))
    with pytest.raises(ValueError, match="out of order"):
        apply(s, Entry(3, 1, K.NOOP, {}))
    with pytest.raises(ValueError, match="out of order"):
        apply(s, Entry(1, 1, K.NOOP, {}))
    s2, _ = apply(s, Entry(2, 5, K.NOOP, {}))
    with pytest.raises(ValueError, match="term"):
        apply(s2, Entry(3, 4, K.NOOP, {}))


def test_state_is_read_only() -> None:
    s, _ = run((K.KV_PUT, {"key": "x", "value": "1"}))
    with pytest.raises(TypeError):
        s.kv["x"] = "2"  # type: ignore[index]


ids = st.sampled_from(["a", "b", "c", "d"])
specs = st.one_of(
    st.builds(lambda n: join(n), ids),
    st.builds(lambda n: (K.MEMBER_DEAD, {"node_id": n}), ids),
    st.builds(lambda n: (K.MEMBER_LEFT, {"node_id": n}), ids),
    st.builds(lambda g, m: view(g, *m), st.integers(0, 6), st.lists(ids, min_size=1, max_size=3, unique=True)),
    st.builds(lambda s: (K.CHECKPOINT, {"step": s, "digest": "d", "holders": ["a"]}), st.integers(0, 9)),
    st.builds(lambda k, v: (K.KV_PUT, {"key": k, "value": v}), ids, st.text(max_size=3)),
    st.builds(lambda k: (K.KV_DELETE, {"key": k}), ids),
    st.builds(lambda v: (K.CONFIG_CHANGE, conf(v[:2], v[2:])),
              st.lists(ids, min_size=2, max_size=4, unique=True)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(specs, max_size=30), st.integers(0, 30))
def test_apply_is_pure_deterministic_and_batch_independent(spec_list: list, cut: int) -> None:
    entries = [Entry(i, 1, k, p) for i, (k, p) in enumerate(spec_list, 1)]
    whole, res = apply_many(ClusterState(), entries)
    before = state_to_dict(whole)
    again, res2 = apply_many(ClusterState(), entries)
    assert again == whole and res2 == res
    head, _ = apply_many(ClusterState(), entries[:cut])
    frozen_head = state_to_dict(head)
    one = head
    for e in entries[cut:]:
        one, _ = apply(one, e)
    assert one == whole, "applying in any batching gives the same state"
    assert state_to_dict(head) == frozen_head and state_to_dict(whole) == before, "inputs unchanged"
    accepted_views = [r for r in res if r.kind is K.VIEW and r.accepted]
    assert len(accepted_views) == (whole.view.generation if whole.view else 0)
    assert state_from_dict(state_to_dict(whole)) == whole
    assert decode_state(encode_state(whole)) == whole
    snap = encode_snapshot(whole)
    assert decode_snapshot(snap.index, snap.term, snap.data) == whole


def test_bad_state_dicts_are_refused() -> None:
    s, _ = run(join("a"), view(1, "a"), (K.KV_PUT, {"key": "x", "value": "1"}))
    good = state_to_dict(s)
    bad = [dict(good, v=2), dict(good, applied_index=-1), dict(good, control="x"),
           dict(good, kv={"x": 1}), dict(good, members={"a": ["a:1", "zombie", 1]}),
           dict(good, view=[0, ["a"], "h"]), dict(good, voters=["a", "a"]), {k: good[k] for k in list(good)[:-1]},
           None, []]
    for d in bad:
        with pytest.raises(CorruptState):
            state_from_dict(d)


def test_sealed_state_and_snapshot_detect_damage() -> None:
    s, _ = run(join("a"))
    blob = bytearray(encode_state(s))
    blob[len(blob) // 2] ^= 0x10
    with pytest.raises(CorruptState, match="CRC"):
        decode_state(bytes(blob))
    snap = encode_snapshot(s)
    with pytest.raises(CorruptState, match="expected"):
        decode_snapshot(snap.index + 1, snap.term, snap.data)
    with pytest.raises(CorruptState):
        decode_snapshot(snap.index, snap.term, snap.data[:-1])


def test_store_port_and_readiness_are_kept_through_status_changes_and_snapshots() -> None:
    s, res = run((K.MEMBER_JOINED, {"node_id": "a", "addr": "a:1", "store_port": 7001, "ready": False}),
                 (K.MEMBER_DEAD, {"node_id": "a"}),
                 (K.MEMBER_JOINED, {"node_id": "b", "addr": "b:1", "store_port": 70000}),
                 (K.MEMBER_JOINED, {"node_id": "c", "addr": "c:1", "ready": "yes"}))
    assert [r.accepted for r in res] == [True, True, False, False]
    assert s.members["a"].store_port == 7001 and s.members["a"].status == "dead"
    assert s.members["a"].ready is False
    assert decode_state(encode_state(s)) == s
    assert decode_snapshot(s.applied_index, s.applied_term, encode_snapshot(s).data) == s


@pytest.mark.parametrize("text", ["h:9", "[::1]:29500", "::1:29500", "h:0", ":29500", "[]:8", "", "h", "h:", "h:x1",
                                  "h:²"])
def test_any_committed_store_text_applies_and_survives_a_snapshot(text: str) -> None:
    """Older code committed any string as a view's store host: every node must still apply it (the
    same generation follows), read it as the same Address, and keep it through a snapshot."""
    s, res = run(join("a"), (K.VIEW, {"generation": 1, "members": ["a"], "store_host": text}), view(2, "a"))
    assert all(r.accepted for r in res), [r.reason for r in res]
    s1, _ = run(join("a"), (K.VIEW, {"generation": 1, "members": ["a"], "store_host": text}))
    assert decode_state(encode_state(s1)) == s1
    assert decode_snapshot(s1.applied_index, s1.applied_term, encode_snapshot(s1).data) == s1


def test_sites_of_records_and_views_survive_a_snapshot_and_a_death() -> None:
    s, res = run((K.MEMBER_JOINED, {"node_id": "a", "addr": "a:1", "site": "lab-2"}),
                 (K.MEMBER_JOINED, {"node_id": "b", "addr": "b:1", "near": ["c"]}), join("c"),
                 (K.VIEW, {"generation": 1, "members": ["a", "b", "c"], "store_host": "h:9",
                           "sites": ["lab-2", "auto-b", "auto-b"]}),
                 (K.MEMBER_DEAD, {"node_id": "b"}))
    assert all(r.accepted for r in res)
    assert s.members["a"].site == "lab-2" and s.members["b"].near == ("c",) and s.members["b"].status == "dead"
    assert s.view.site_of("c") == "auto-b" and s.view.site_of("zz") is None
    assert state_from_dict(state_to_dict(s)) == s


def test_a_state_written_before_sites_reads_with_none_and_an_older_reader_ignores_them() -> None:
    s, _ = run((K.MEMBER_JOINED, {"node_id": "a", "addr": "a:1", "site": "lab-2"}),
               (K.VIEW, {"generation": 1, "members": ["a"], "store_host": "h:9", "sites": ["lab-2"]}))
    d = state_to_dict(s)
    assert len(d["members"]["a"]) == 6 and len(d["view"]) == 4, "the lists an older build unpacks keep their length"
    older = {k: v for k, v in d.items() if k != "sites"}
    read = state_from_dict(older)
    assert read.members["a"].site == "" and read.view.sites == ()
    with pytest.raises(CorruptState, match="site"):
        state_from_dict({**d, "sites": {"members": {"a": ["bad site", []]}, "view": []}})
    with pytest.raises(CorruptState, match="view sites"):
        state_from_dict({**d, "sites": {"members": {}, "view": ["x", "y"]}})


def test_speed_classes_and_shares_survive_a_snapshot_and_a_state_before_them_reads_as_unknown_and_even() -> None:
    s, res = run((K.MEMBER_JOINED, {"node_id": "a", "addr": "a:1", "speed_class": 12}), join("b"),
                 (K.VIEW, {"generation": 1, "members": ["a", "b"], "store_host": "h:9", "shares": [8, 4]}),
                 (K.MEMBER_DEAD, {"node_id": "a"}))
    assert all(r.accepted for r in res), [r.reason for r in res]
    assert s.members["a"].speed_class == 12 and s.members["a"].status == "dead" and s.members["b"].speed_class is None
    assert s.view.shares == (8, 4)
    d = state_to_dict(s)
    assert state_from_dict(d) == s and decode_state(encode_state(s)) == s
    assert len(d["members"]["a"]) == 6 and len(d["view"]) == 4, "the lists an older build unpacks keep their length"
    read = state_from_dict({k: v for k, v in d.items() if k != "speeds"})
    assert read.members["a"].speed_class is None and read.view.shares == ()
    for bad, what in (({"members": {"a": 81}, "view": []}, "member speed class"),
                      ({"members": {"zz": 1}, "view": []}, "member speed class"),
                      ({"members": {}, "view": [8]}, "view shares"),
                      ({"members": {}, "view": [8, 0]}, "view shares")):
        with pytest.raises(CorruptState, match=what):
            state_from_dict({**d, "speeds": bad})
