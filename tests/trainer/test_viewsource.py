"""The worker side of the local channel: views in, reports out, on the OS clock and on a fake one."""

import json

import pytest

from dpeer.channel.local import SYSTEM
from dpeer.address import Address
from dpeer.trainer.viewsource import Assignment, DirViewSource, View, make_view_source, publish_view, read_reports
from tests.support.clocks import ManualClock


@pytest.mark.parametrize("clock", [SYSTEM, ManualClock()], ids=["system clock", "manual clock"])
def test_wait_view_returns_newest_after_generation(tmp_path, clock):
    """The same behaviour on the OS's clock and on the fake the other tests use."""
    d = str(tmp_path)
    src = DirViewSource(d, "a", clock)
    assert src.wait_view(-1, 0.0) is None
    publish_view(d, Assignment(View(1, ("a", "b"), Address("127.0.0.1", 1234))))
    publish_view(d, Assignment(View(3, ("b", "a"), Address("127.0.0.1", 1235))))
    v = src.wait_view(-1, 0.0)
    assert v == Assignment(View(3, ("b", "a"), Address("127.0.0.1", 1235)))
    assert v.view.rank_of("a") == 1 and v.view.rank_of("z") is None
    assert src.wait_view(3, 0.0) is None
    t0 = clock.now()
    assert src.wait_view(3, 0.1) is None
    assert clock.now() - t0 >= 0.1


def test_reports_are_appended(tmp_path):
    d = str(tmp_path)
    src = DirViewSource(d, "a", ManualClock(5.0))
    src.report_progress(3, 48, 0.5, "ab")
    src.report_failure("peer died", 2)
    src.wait_view(5, 0.01)
    kinds = [r["kind"] for r in read_reports(d, "a")]
    assert kinds == ["progress", "failure", "waiting"]
    assert read_reports(d, "a")[1]["gen"] == 2 and {r["t"] for r in read_reports(d, "a")} == {5.0}
    assert read_reports(d, "nobody") == []


def test_make_view_source_specs(tmp_path):
    assert isinstance(make_view_source(f"dir:{tmp_path}", "a"), DirViewSource)
    src = make_view_source(f"py:dpeer.trainer.viewsource:DirViewSource:{tmp_path}", "b")
    assert isinstance(src, DirViewSource) and src.node_id == "b"
    with pytest.raises(ValueError):
        make_view_source("grpc:/tmp/x", "a")


def test_a_peek_sees_a_view_published_with_an_unchanged_folder_mtime_within_the_rescan_period(tmp_path):
    """Folder mtimes can be coarser than two renames: a peek trusts an unchanged mtime only for
    PEEK_RESCAN_S, then scans anyway."""
    import os

    from dpeer.channel.local import PEEK_RESCAN_S

    d, clock = str(tmp_path), ManualClock()
    src = DirViewSource(d, "a", clock)
    assert src.wait_view(-1, 0.0) is None
    views = os.path.join(d, "views")
    before = os.stat(views)
    publish_view(d, Assignment(View(1, ("a",), Address("127.0.0.1", 1234))))
    os.utime(views, ns=(before.st_atime_ns, before.st_mtime_ns))  # as if within one mtime tick
    assert src.wait_view(-1, 0.0) is None  # trusted the mtime
    clock.advance(PEEK_RESCAN_S + 0.01)
    assert src.wait_view(-1, 0.0) == Assignment(View(1, ("a",), Address("127.0.0.1", 1234)))
    publish_view(d, Assignment(View(2, ("a",), Address("127.0.0.1", 1234))))
    assert src.wait_view(1, 0.0).view.generation == 2  # a moved mtime is seen at once


def test_an_assignment_reads_back_as_written_with_an_ipv6_store(tmp_path):
    """The view file keeps the host and port apart (the worker's format); an IPv6 host travels bare; the
    members' sites come along."""
    d = str(tmp_path)
    given = Assignment(View(2, ("a",), Address("::1", 29500), "s" * 32, ("lab-2",)), 400, "d" * 64, "::1")
    publish_view(d, given)
    assert DirViewSource(d, "a", ManualClock(0.0)).wait_view(1, 0.0) == given


@pytest.mark.parametrize("shares", [[True, 2], [2.5, 1], ["3", "1"], [1], [0, 1], [-1, 2], [65, 1], "12", {"a": 1}])
def test_a_view_file_with_bad_shares_is_refused_not_read_as_another_split(shares):
    """Each member's worker splits a step by its own view file: a forged or torn one's shares are a
    clear error, never coerced (True as 1, 2.5 as 2) or left for the step to trip on."""
    text = json.dumps({"generation": 3, "members": ["a", "b"], "store_host": "127.0.0.1", "store_port": 5000,
                       "shares": shares})
    with pytest.raises(ValueError, match="shares"):
        Assignment.from_json(text)


def test_a_view_files_shares_read_back_as_written():
    given = Assignment(View(2, ("a", "b"), Address("127.0.0.1", 29500), shares=(8, 3)))
    assert Assignment.from_json(given.to_json()) == given
