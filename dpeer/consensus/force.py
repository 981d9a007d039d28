"""Forced reconfiguration, the operator's last resort after losing a majority of voters for good.

Unsafe by design (entries only the lost voters held may be lost), so it is refused unless it is
the last resort as far as this node can tell:
- it has known no leader for force_after(cfg) = 2 x the longest election timeout (the busy one or,
  when idle beats are on, idle_election_timeout): a live leader beats its followers at least that
  often even when idle, and a voter without one campaigns at least once per election timeout, so
  a node that saw neither for that long has watched at least one whole election fail;
- it cannot reach a majority of its voting configuration right now: a voter counts as reachable
  when its Raft messages (under the uid the configuration names) reached us within
  reach_window(cfg) = 2 x election_timeout_max (a live voter without a leader campaigns that
  often), or when the caller's failure detector holds it alive under that uid.
The forced configuration starts the next cluster epoch (VotingConfig.forced), persisted with it in
the log: voters of the old epoch that come back are refused until they rejoin on fresh data.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Collection, Mapping

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.ready import Proposed, ProposeResult, Refused, Role
from dpeer.consensus.voting import ConfigChangeError, VotingConfig
from dpeer.consensus.entry import Entry, RaftKind

if TYPE_CHECKING:
    from dpeer.consensus.core import RaftNode

log = logging.getLogger("dpeer.consensus.core")


def force_after(cfg: RaftConfig) -> float:
    """Seconds without any leader before a forced reconfiguration is allowed."""
    return 2 * max(cfg.election_timeout_max, cfg.idle_election_timeout)


def reach_window(cfg: RaftConfig) -> float:
    """How recent a voter's Raft message must be for it to count as reachable now."""
    return 2 * cfg.election_timeout_max


def reachable_voters(conf: VotingConfig, me: str, now: float, heard: Mapping[str, float], alive: Collection[str],
                     window: float) -> set[str]:
    """This node and the voters heard from within window or held alive by the failure detector."""
    recent = {v for v in conf.voters if now - heard.get(v, -math.inf) <= window}
    return ({me} & conf.voters) | recent | (set(alive) & conf.voters)


def force_refusal(conf: VotingConfig, me: str, my_uid: str, leading: bool, voters: set[str], silent_for: float,
                  reachable: set[str], cfg: RaftConfig) -> str:
    """Why a forced reconfiguration to `voters` must be refused here, or '' when it may proceed.
    silent_for: seconds since this node last knew a leader (itself leading included)."""
    if leading:
        return "this node leads a working quorum; a forced reconfiguration is not needed"
    if not conf.is_voter(me, my_uid):
        return (f"this node is not a voter of the configuration in force (voters {sorted(conf.voters)}; its "
                "store is new or it was removed): run force on a surviving voter")
    if me not in voters:
        return "name this node among the voters it forces"
    if not voters <= conf.voters:
        return f"forced voters must be voters now: {sorted(voters - conf.voters)} are not"
    wait = force_after(cfg)
    if silent_for < wait:
        return (f"a leader was known {silent_for:.1f}s ago; force is allowed only after {wait:g}s without one "
                "(twice the longest election timeout)")
    if len(reachable) >= conf.quorum:
        return (f"{len(reachable)} of {len(conf.voters)} voters are reachable ({', '.join(sorted(reachable))}): "
                "a majority can still elect a leader, so force is not needed")
    return ""


def force(node: RaftNode, voters: set[str], alive: Collection[str], forced_at: float) -> ProposeResult:
    """Run RaftNode.force_new_configuration at node.now: unless refused (see the module docstring;
    `alive` are the voters the failure detector holds alive under the uid the configuration
    names), append a config_change that makes `voters` the only voters in the next epoch
    (forced_at: unix seconds) and campaign under it. Entries committed by the lost majority but
    missing here may be lost: run it on the survivor with the most up-to-date log, on one node only."""
    now, conf = node.now, node.membership
    reach = reachable_voters(conf, node.id, now, node.heard, alive, reach_window(node.cfg))
    silent = node.leaderless_for(now)
    refusal = force_refusal(conf, node.id, node.uid, node.role is Role.LEADER, voters, silent, reach, node.cfg)
    if refusal:
        log.warning("%s refused a forced reconfiguration to voters %s: %s", node.id, sorted(voters), refusal)
        return Refused(refusal)
    try:
        new = conf.forced(voters, forced_at)
    except ConfigChangeError as exc:
        return Refused(str(exc))
    log.warning("FORCED reconfiguration by %s in term %d: voters %s -> %s, cluster epoch %d -> %d (unsafe: "
                "entries only the lost voters held may be lost)", node.id, node.term, sorted(conf.voters),
                sorted(new.voters), conf.epoch, new.epoch)
    node.election.follow(node.term + 1, None)
    entry = Entry(node.log.last_index() + 1, node.term, RaftKind.CONFIG_CHANGE, new.to_payload())
    node.log.append([entry])
    node.confs.appended([entry])
    node.election.campaign(pre_vote=False)
    return Proposed(entry.index, entry.term)
