"""The daemon's metrics brought up to date from its owners (the node, the worker link, the leader's
chores, the server's refusals), every METRICS_EVERY seconds of the chores; systemd's watchdog is
fed on the same beat."""

from __future__ import annotations

import collections
import math

from dpeer.consensus import Role
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.leader_chores import LeaderChores
from dpeer.daemon.notify import Notifier, watchdog_interval
from dpeer.daemon.serve.metrics import Metrics
from dpeer.daemon.serve.status import tolerance
from dpeer.daemon.serve.status_report import StatusReport
from dpeer.statemachine.payloads import ControlMode

METRICS_EVERY = 0.5


class MetricsFeed:
    """Called from the daemon's chores; see the module docstring."""

    def __init__(self, metrics: Metrics, node: Node, leader: LeaderChores, report: StatusReport,
                 notifier: Notifier) -> None:
        self.metrics, self.node, self.leader, self.report, self.notifier = metrics, node, leader, report, notifier
        self._last = 0.0
        self._reforms_counted = self._forced_counted = self._refused_counted = 0

    def __call__(self, now: float) -> None:
        """Update the metrics when METRICS_EVERY has passed since the last update."""
        if now - self._last >= METRICS_EVERY:
            self._last = now
            self._update()

    def _update(self) -> None:
        m, node, reads = self.metrics, self.node, self.node.reads
        state, commands = reads.state, node.commands
        m.set_members(collections.Counter(rec.state for rec in node.swim.members()))
        m.term.set(reads.current_term)
        m.is_leader.set(1 if node.role is Role.LEADER else 0)
        m.commit_index.set(reads.commit_index)
        m.last_applied.set(reads.last_applied)
        m.invalid.set(node.invalid_messages)
        if self.report.server is not None:
            m.count_refusals(self.report.server.refusals)
        m.epoch.set(node.raft.epoch)
        m.strangers.set(len(node.raft.strangers()))
        held = tolerance(node)
        m.fault_tolerance.set(held["can_lose"] if held is not None else math.nan)
        m.forced.inc(commands.forced - self._forced_counted)
        m.force_refused.inc(commands.force_refused - self._refused_counted)
        self._forced_counted, self._refused_counted = commands.forced, commands.force_refused
        link = self.report.link
        if link is not None:
            worker = link.worker
            if worker.train is not None:
                m.step.set(worker.train.step)
                m.samples.set(worker.train.samples)
            m.reforms.inc(worker.reforms - self._reforms_counted)
            self._reforms_counted = worker.reforms
            for seconds in worker.take_recoveries():
                m.recovery.observe(seconds)
        m.generation.set(state.view.generation if state.view else 0)
        m.paused.set(1 if state.control is ControlMode.PAUSED else 0)
        m.leaderless.set(0.0 if node.leader_id is not None else node.raft.leaderless_for(node.clock()))
        m.set_committed(state.members)
        m.kept_out.set(len(self.leader.kept_out()) if node.role is Role.LEADER else math.nan)
        m.set_data_dir(self.report.config.data_dir)
        if self.report.site_bytes is not None:
            self.report.site_bytes.read()
            m.count_cross_site(self.report.site_bytes.counts.totals)
        job = self.report.job_status()
        m.set_job(job["state"] if job is not None else None)
        if self.notifier.enabled and watchdog_interval() is not None:
            self.notifier.watchdog()
