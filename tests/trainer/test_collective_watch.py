"""An overdue collective is cut once a newer view is committed: at once, not at the collective
timeout; never a healthy one, never without a newer view; the group re-forms after a cut."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
import torch
import torch.distributed as dist

from dpeer.address import Address
from dpeer.launch.cluster import free_port_block
from dpeer.trainer.collective_watch import PATIENCE_FLOOR_S, CollectiveWatch, patience
from dpeer.trainer.group import GroupManager
from dpeer.view import View


def test_patience_is_a_few_typical_steps_and_never_below_the_floor() -> None:
    assert patience([]) == PATIENCE_FLOOR_S
    assert patience([0.001] * 10) == PATIENCE_FLOOR_S
    assert patience([0.1, 0.2, 0.3, 5.0]) == pytest.approx(4 * 0.3)


class Probe:
    """A view source's answer (the newer view's members, None: no newer view) and the cuts made."""

    def __init__(self, newer: tuple[str, ...] | None) -> None:
        self.newer, self.asked, self.cut = newer, threading.Event(), threading.Event()

    def ask(self, generation: int) -> tuple[str, ...] | None:
        self.asked.set()
        return self.newer

    def do_cut(self) -> int:
        self.cut.set()
        return 2


def test_an_overdue_collective_is_cut_once_a_newer_view_drops_a_member() -> None:
    probe, seen = Probe(newer=("a",)), []
    watch = CollectiveWatch(probe.ask, lambda gen, s, why: seen.append((gen, why, probe.cut.is_set())))
    try:
        watch.arm(3, ("a", "b"), 0.05, probe.do_cut)
        assert probe.cut.wait(10)
    finally:
        watch.close()
    assert watch.cuts == 1 and seen == [(3, "the newer view drops b", False)]  # recorded before the cut


@pytest.mark.parametrize("newer,patience_s", [(None, 0.05), (("a", "b", "c"), 1.0)])
def test_no_cut_without_a_newer_view_or_at_a_joins_patience_nor_once_disarmed(newer, patience_s) -> None:
    probe = Probe(newer=newer)
    watch = CollectiveWatch(probe.ask)
    try:
        watch.arm(3, ("a", "b"), patience_s, probe.do_cut)
        assert probe.asked.wait(30)  # overdue and asked: no newer view, or one that only adds c: no cut yet
        watch.disarm()
        probe.newer = ("a",)
    finally:
        watch.close()
    assert not probe.cut.is_set() and watch.cuts == 0


def test_a_collective_stuck_far_past_a_joins_view_is_cut_too() -> None:
    """A failed group re-formed with a newcomer looks like a join: only far past patience is it cut."""
    probe, seen = Probe(newer=("a", "b", "c")), []
    watch = CollectiveWatch(probe.ask, lambda gen, s, why: seen.append(s))
    try:
        watch.arm(3, ("a", "b"), 0.05, probe.do_cut)
        assert probe.cut.wait(30)
    finally:
        watch.close()
    assert seen[0] >= 8 * 0.05


def test_a_view_source_that_raises_does_not_end_the_watch() -> None:
    answers = iter([OSError("view file half written"), ("a",)])

    def ask(generation: int) -> tuple[str, ...]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    probe = Probe(newer=None)
    watch = CollectiveWatch(ask)
    try:
        watch.arm(3, ("a", "b"), 0.05, probe.do_cut)
        assert probe.cut.wait(30)
    finally:
        watch.close()


def _member(node: str, port: int, results: mp.Queue, go: mp.Event) -> None:
    """Form generation 1; "a" enters an allreduce that "b" never joins, the watch cuts it; then both
    form generation 2 and reduce together."""
    torch.set_num_threads(1)
    manager = GroupManager(node, backend="gloo", init_timeout=30.0)
    try:
        manager.form(View(1, ("a", "b"), Address("127.0.0.1", port)))
        manager.set_timeout(60.0)
        if node == "a":
            watch = CollectiveWatch(lambda gen: ("a",))  # a view without b: b is gone
            watch.arm(1, ("a", "b"), 0.05, manager.cutter())
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(4))
                results.put(("a", "the stuck allreduce returned"))
            except RuntimeError:
                results.put(("a cut after", time.monotonic() - t0))
            watch.close()
            go.set()
        else:
            go.wait(120)
        manager.destroy()
        manager.form(View(2, ("a", "b"), Address("127.0.0.1", port)))
        x = torch.ones(4)
        dist.all_reduce(x)
        results.put((node, x.tolist()))
    finally:
        manager.close()


@pytest.mark.timeout(180)
def test_a_real_gloo_allreduce_is_cut_long_before_its_timeout_and_the_group_reforms() -> None:
    ctx = mp.get_context("spawn")
    port, results, go = free_port_block(1), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_member, args=(n, port, results, go)) for n in ("a", "b")]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=150) for _ in range(3)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    by = {k: v for k, v in got}
    assert "a cut after" in by, got
    assert by["a cut after"] < 10.0  # the collective timeout was 60 s
    assert by["a"] == by["b"] == [2.0] * 4
