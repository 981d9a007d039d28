"""The status document of `dpeer status --json` (a public contract: see docs/architecture.md "Interfaces")."""

from __future__ import annotations

from typing import Any

from dpeer.consensus import Role
from dpeer.daemon.node.driver import Node
from dpeer.daemon.decide.quorum import explain_no_leader
from dpeer.daemon.decide.sites import FAR_MS, NEAR_MS, RULE
from dpeer.daemon.decide.proposals import fault_tolerance
from dpeer.statemachine.state import ClusterState


def site_of(state: ClusterState, node_id: str) -> str | None:
    """A member's committed site: the one the committed view names for it, else the one its
    record configures; None while neither names one (measured sites come with a view)."""
    in_view = state.view.site_of(node_id) if state.view is not None else None
    record = state.members.get(node_id)
    return in_view or (record.site if record is not None and record.site else None)


def site_measure(node: Node, configured: str) -> dict[str, Any]:
    """How this box's site is found: its configured site (null: measured), the peers its
    committed record names near, and the rule with its thresholds (daemon/decide/sites.py)."""
    me = node.reads.state.members.get(node.id)
    return {"configured": configured or None, "near": list(me.near) if me is not None else [],
            "near_ms": NEAR_MS, "far_ms": FAR_MS, "rule": RULE}


def members(node: Node) -> list[dict[str, Any]]:
    """Gossip's members with their committed status, the last probe's round trip, their committed
    site and speed class: {node_id, addr, state, incarnation, version, committed, rtt_ms, site,
    speed_class} (speed_class null while unknown: decide/speeds.py)."""
    state = node.reads.state
    committed = state.members
    out = []
    for rec in sorted(node.swim.members(), key=lambda r: r.node_id):
        member = committed.get(rec.node_id)
        out.append({
            "node_id": rec.node_id, "addr": rec.addr, "state": rec.state.value,
            "incarnation": rec.incarnation, "version": rec.last_applied,
            "committed": member.status if member is not None else None,
            "rtt_ms": node.probes.rtt_ms(rec.node_id), "site": site_of(state, rec.node_id),
            "speed_class": member.speed_class if member is not None else None,
        })
    return out


def group(node: Node) -> dict[str, Any] | None:
    """The committed view as seen by this node, or None when it is not in it; `sites`: each
    member's site in rank order (empty when the view names none); `shares`: each member's share of
    a step in rank order (empty: even shares)."""
    view = node.reads.state.view
    if view is None or node.id not in view.members:
        return None
    return {"generation": view.generation, "world_size": len(view.members),
            "rank": view.members.index(node.id), "members": list(view.members), "store_host": str(view.store),
            "sites": list(view.sites), "shares": list(view.shares)}


def checkpoint(node: Node) -> dict[str, Any] | None:
    """The newest committed checkpoint: {step, digest, holders}, or None when none is recorded."""
    ckpt = node.reads.state.checkpoint
    if ckpt is None:
        return None
    return {"step": ckpt.step, "digest": ckpt.digest, "holders": list(ckpt.holders)}


def tolerance(node: Node) -> dict[str, Any] | None:
    """On the leader: how many voter failures the cluster survives now, {voters, live_voters,
    can_lose, unheld} (unheld: voters that have not answered under the store uid the configuration
    names, dead or held by no live box, or that two live processes answer for, a copied disk);
    None on any other node."""
    answering = node.answering_voters(node.clock())
    if answering is None:
        return None
    t = fault_tolerance(node.reads.state.voters, answering)
    return {"voters": t.voters, "live_voters": t.live_voters, "can_lose": t.can_lose, "unheld": list(t.unheld)}


def identity(node: Node) -> dict[str, Any]:
    """This node's store uid, its daemon's boot (sightings), cluster epoch and when it was forced,
    why no leader is known (null while one is), members seen under another store uid than the
    configuration names, and voters of older epochs this node refused."""
    raft, conf = node.raft, node.raft.membership
    no_leader = None
    if node.leader_id is None and node.role is not Role.LEADER:
        why = explain_no_leader(node.id, raft.uid, conf, raft.seen_uids, node.alive_voters(), raft.newest_epoch,
                                node.addr)
        no_leader = {"since_s": round(raft.leaderless_for(node.clock()), 3), "reason": why.reason,
                     "action": why.action}
    return {
        "uid": raft.uid, "boot": node.boot, "epoch": raft.epoch, "forced_at": conf.forced_at or None,
        "no_leader": no_leader,
        "strangers": [{"node_id": n, "uid": u, "configured_uid": conf.uid_of(n)}
                      for n, u in sorted(raft.strangers().items())],
        "old_epoch_peers": dict(sorted(raft.old_epoch_peers.items())),
        "forced": node.commands.forced, "force_refused": node.commands.force_refused,
    }


def document(node: Node, extra: dict[str, Any], configured_site: str) -> dict[str, Any]:
    """The whole status object; `extra` adds train, resync and process fields; this box's site
    is the committed one, with how it is found (`site_measure`)."""
    reads, state = node.reads, node.reads.state
    doc: dict[str, Any] = {
        "node_id": node.id, "addr": node.addr, "term": reads.current_term, "leader": node.leader_id,
        "role": node.role.value, "commit_index": reads.commit_index, "last_applied": reads.last_applied,
        "first_index": reads.first_index, "snapshot_index": reads.snapshot_index,
        "members": members(node), "group": group(node), "train": None,
        "site": site_of(state, node.id), "site_measure": site_measure(node, configured_site),
        "voters": list(state.voters), "learners": list(state.learners), "fault_tolerance": tolerance(node),
        "control": state.control, "checkpoint": checkpoint(node), "invalid_messages": node.invalid_messages, "entries_written": node.entries_written,
        "recovered_from": str(reads.recovered_from) if reads.recovered_from else None,
    }
    doc.update(identity(node))
    doc.update(extra)
    return doc
