"""Why no leader can be elected, and what an operator should do about it (pure, table-tested).

The status document and the log say it in one sentence each, from what this node knows: the
voting configuration in force (voters with their store uids, the epoch), the store uid each
node was last seen with, and which voters the failure detector holds alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from dpeer.consensus.voting import VotingConfig


@dataclass(frozen=True)
class NoLeader:
    """The reason no leader is known, and the operator's way out when there is one to take."""

    reason: str
    action: str | None


def _short(uid: str | None) -> str:
    return (uid or "?")[:8]


def explain_no_leader(me: str, my_uid: str, conf: VotingConfig, seen_uids: Mapping[str, str],
                      alive: Collection[str], newest_epoch: int, addr: str) -> NoLeader:
    """Why this node knows no leader (alive: voters gossip holds alive or suspect, this node
    aside; newest_epoch: the highest cluster epoch any peer follows; addr: this node's address,
    for the command to run)."""
    if not conf.voters:
        return NoLeader("this node has not learned a voting configuration yet: it waits for a leader to admit it",
                        "check that --join names a live member of the cluster")
    if newest_epoch > conf.epoch:
        return NoLeader(f"peers follow cluster epoch {newest_epoch}, this node epoch {conf.epoch}: a forced "
                        "reconfiguration gave up on this node's cluster, so it neither votes nor campaigns",
                        "move this node's data dir aside and restart it: it rejoins as a new member")
    named = conf.uid_of(me)
    if named is not None and named != my_uid:
        return NoLeader(f"this node's store is new (uid {_short(my_uid)}) but the configuration names {me} with "
                        f"uid {_short(named)}, its lost disk: it does not vote or campaign as that member",
                        "none here: a leader replaces the old member by this one once it reaches the cluster; "
                        "if none does, read the status of a surviving voter")
    return _count(me, conf, seen_uids, alive, addr)


def _count(me: str, conf: VotingConfig, seen_uids: Mapping[str, str], alive: Collection[str], addr: str) -> NoLeader:
    lost = sorted(v for v in conf.voters if v != me and seen_uids.get(v) not in (None, conf.uid_of(v)))
    down = sorted(v for v in conf.voters if v != me and v not in lost and v not in alive)
    usable = sorted(set(conf.voters) - set(lost) - set(down))
    counted = f"{len(usable)} of {len(conf.voters)} voters can vote ({', '.join(usable) or 'none'}), {conf.quorum} needed"
    if len(usable) >= conf.quorum:
        return NoLeader(f"an election is under way: {counted}", None)
    notes = [f"{v} lost its data (seen with store uid {_short(seen_uids[v])}, the configuration names "
             f"{_short(conf.uid_of(v))})" for v in lost]
    notes += [f"{v} is unreachable" for v in down]
    reason = f"no leader can be elected: {counted}; " + "; ".join(notes)
    if me not in usable:
        return NoLeader(reason, None)
    gone = ", ".join(lost + down)
    action = (f"if {gone} will not come back with their data, run `dpeer force --addr {addr} --voters "
              f"{','.join(usable)} --yes` on the surviving voter with the most recent log (allowed once no "
              "leader was known for twice the longest election timeout); the others then rejoin as new members")
    return NoLeader(reason, action)
