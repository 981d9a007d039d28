"""The worker's feed of committed views: the ViewSource protocol and how a spec names one.

The daemon's side of the default source lives in ``dpeer.channel.local`` (peer's local API, a
directory of atomically written views and appended reports); tests use the same files as
their "view authority".
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from dpeer.channel.local import Assignment, DirViewSource, publish_view, read_reports
from dpeer.view import View

__all__ = ["Assignment", "DirViewSource", "View", "ViewSource", "make_view_source", "publish_view", "read_reports"]


@runtime_checkable
class ViewSource(Protocol):
    """What the daemon offers the worker over its local channel."""

    def wait_view(self, after_generation: int, timeout: float) -> Assignment | None:
        """Block up to ``timeout`` seconds for the newest committed view with a higher generation
        (with where to resume and which address to bind)."""

    def report_failure(self, reason: str, generation: int, phase: str = "group", step: int = 0,
                       error: str = "") -> None:
        """Tell the daemon this worker's group of ``generation`` failed at ``step``: phase "group"
        (a collective: a dead or hung peer) or "train" (the job's code raised ``error``)."""

    def report_progress(self, step: int, samples: int, loss: float, params_digest: str) -> None:
        """Tell the daemon a step was committed (``step`` steps done, ``samples`` consumed); the
        digest of the parameters at that step, or "" on steps that are not digested."""

    def report_speed(self, micro_batches_per_s: float) -> None:
        """Tell the daemon this box's measured compute speed (micro-batches a second), from which
        the leader weighs each member's share of a step (View.shares)."""


def make_view_source(spec: str, node_id: str) -> ViewSource:
    """Build a source from a spec: ``dir:PATH`` or ``py:MODULE:FACTORY[:ARG]`` (FACTORY(ARG, node_id))."""
    scheme, _, rest = spec.partition(":")
    if scheme == "dir" and rest:
        return DirViewSource(rest, node_id)
    if scheme == "py" and rest:
        module, _, tail = rest.partition(":")
        factory, _, arg = tail.partition(":")
        return getattr(importlib.import_module(module), factory)(arg, node_id)
    raise ValueError(f"unknown view source spec {spec!r}; expected dir:PATH or py:MODULE:FACTORY[:ARG]")
