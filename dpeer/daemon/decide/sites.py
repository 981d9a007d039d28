"""Sites: which boxes sit together (a lab, a shop floor, a cloud region), as pure decisions.

A box's site is the one its config names (`site: lab-2`). A box that names none is placed by the
round trips of SWIM's direct probes, in two steps:

1. Each box judges its own links (`near_peers`) by their floor: a peer is near when the smallest
   of the last round trips to it is under NEAR_MS, far once that floor is over FAR_MS (a busy
   box or a full queue only adds to a round trip, never takes from it, so the floor is the
   link's distance: a peer starved of CPU answers late but does not move away); in between it keeps
   what it was (hysteresis, so a link near the threshold does not flap), as it does while it
   has no round trip to the peer (after a restart, or while the peer is down). The box's member
   record carries the near peers, so the leader sees every box's links through the log.
2. The leader groups the boxes that name no site (`assign_sites`) by single linkage: two are in
   one site when either measured the other near (one side that has not measured yet does not
   split a site), and sites are the connected groups. A configured site always wins.

A measured site is named `auto-` and the smallest node id of its group; a group keeps the name
most of its boxes had in the previous view, so a site's name holds while boxes come and go.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from dpeer.statemachine.state import ClusterState, MemberStatus
from dpeer.view import valid_site

NEAR_MS = 10.0  # a link whose smallest recent round trip is under this is near (one site)
FAR_MS = 20.0  # ... and far (another site) once over this; in between it stays as it was
RULE = (f"a configured site wins; the others are grouped by single linkage: two boxes share a site when "
        f"either one's smallest round trip to the other (recent probes) is under {NEAR_MS:g} ms (a near link "
        f"turns far only over {FAR_MS:g} ms); a measured site is named auto- and its smallest node id, and "
        "keeps its name from view to view")
MAX_NEAR = 1024  # near peers a member record names (a join naming more is refused: serve/admission.py)
AUTO = "auto-"  # the prefix of measured sites' names, which a configured site may not take
MAX_CONFIGURED = 64  # characters of a configured site's name (a measured one may be longer: AUTO + a node id)


def site_problem(name: str) -> str:
    """Why `name` cannot be a configured site ("" when it can)."""
    if not valid_site(name) or len(name) > MAX_CONFIGURED:
        return (f"site {name!r} is not a site name: 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit")
    if name.startswith(AUTO):
        return f"site {name!r} starts with {AUTO!r}, which names the sites measured from round trips"
    return ""


def near_peers(samples: Mapping[str, Sequence[float]], before: Collection[str],
               near_ms: float = NEAR_MS, far_ms: float = FAR_MS, most: int = MAX_NEAR) -> tuple[str, ...]:
    """The peers this box's links to are near, sorted: smallest recent round trip (ms) under near_ms, or
    at most far_ms for a peer that was near `before`. A peer with no sample keeps what it was (a
    restarted box has measured nothing yet, a dead peer answers nothing: neither is evidence; nor
    is a sample that is no duration, NaN or below 0). At most `most` of them, the smallest ids (a
    record naming more is refused; the smallest ids are the same on every box of a large site, so
    single linkage still joins it, whatever the jitter)."""
    durations = {peer: [r for r in rtts if r >= 0] for peer, rtts in samples.items()}  # not NaN, not < 0
    near = {peer for peer in before if not durations.get(peer)}
    for peer, rtts in durations.items():
        floor = min(rtts) if rtts else None
        if floor is not None and (floor < near_ms or (peer in before and floor <= far_ms)):
            near.add(peer)
    return tuple(sorted(near)[:most])


@dataclass(frozen=True)
class SiteInput:
    """What one member's record says of its site: the configured name ("" when none) and the
    peers it measured near."""

    configured: str = ""
    near: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sites:
    """Each member's site, and why."""

    of: Mapping[str, str]
    reason: str


def assign_sites(members: Mapping[str, SiteInput], previous: Mapping[str, str]) -> Sites:
    """Every member's site: the configured one, else its single-linkage group's measured name
    (see the module docstring); `previous` is the last view's assignment, whose names are kept."""
    of = {n: m.configured for n, m in members.items() if m.configured}
    groups = _groups({n: m.near for n, m in members.items() if not m.configured})
    names = _names(groups, previous)
    for group, name in zip(groups, names):
        of.update(dict.fromkeys(group, name))
    notes = []
    configured = sorted({s for n, s in of.items() if members[n].configured})
    for site in configured:
        notes.append(f"{site}: {', '.join(sorted(n for n in of if of[n] == site))} (configured)")
    for group, name in zip(groups, names):
        how = f"round trips under {NEAR_MS:g} ms link them" if len(group) > 1 else "no near link measured"
        notes.append(f"{name}: {', '.join(group)} ({how})")
    return Sites(dict(sorted(of.items())), "; ".join(notes) or "no members")


def _groups(near: Mapping[str, tuple[str, ...]]) -> list[list[str]]:
    """The connected groups of `near`'s boxes, an edge where either side names the other (single
    linkage), each sorted, ordered by their smallest id."""
    parent = {n: n for n in near}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a in sorted(near):
        for b in near[a]:
            if b in parent and b != a:
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for n in sorted(near):
        groups.setdefault(root(n), []).append(n)
    return sorted(groups.values(), key=lambda g: g[0])


def _names(groups: list[list[str]], previous: Mapping[str, str]) -> list[str]:
    """One measured name per group: a previous name goes to the group holding most of its boxes
    (ties: the smaller name, then the group with the smaller ids); the others get AUTO and their
    smallest id, with a suffix when that name is kept by another group."""
    claims = []
    for i, group in enumerate(groups):
        counts = Counter(previous[n] for n in group if previous.get(n, "").startswith(AUTO))
        claims += [(-count, name, i) for name, count in counts.items()]
    names: dict[int, str] = {}
    for _, name, i in sorted(claims):
        if i not in names and name not in names.values():
            names[i] = name
    for i, group in enumerate(groups):
        if i not in names:
            base = name = AUTO + group[0]
            k = 2
            while name in names.values():
                name, k = f"{base}.{k}", k + 1
            names[i] = name
    return [names[i] for i in range(len(groups))]


def committed_sites(state: ClusterState) -> Sites:
    """The sites of the active members, from their committed records, keeping the names of the
    committed view's sites: what the leader puts in its next view."""
    view = state.view
    previous = dict(zip(view.members, view.sites)) if view is not None and view.sites else {}
    members = {n: SiteInput(m.site, m.near) for n, m in state.members.items() if m.status is MemberStatus.ACTIVE}
    return assign_sites(members, previous)
