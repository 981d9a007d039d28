"""The demo's first line says when an operator's pause holds training."""

from __future__ import annotations

from dpeer.cli.demo_screen import Frame, headline


def frame(*controls: str) -> Frame:
    docs = {f"n{i}": {"control": c, "leader": "n1", "group": None, "train": {"step": 40}} for i, c in enumerate(controls)}
    return Frame(1.0, docs | {"gone": None}, 100, 0.0, [], [])


def test_the_headline_shows_a_pause_and_only_then() -> None:
    assert "PAUSED" in headline(frame("paused", "paused"))
    assert "PAUSED" not in headline(frame("running", "running"))
