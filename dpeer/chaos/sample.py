"""Reading a node's status document: fetching it over gRPC and the fields the chaos run samples."""

from __future__ import annotations

import json
from typing import Any

from dpeer import errors
from dpeer.launch.cluster import LocalNode
from dpeer.transport.client import Channels, NodeClient


def train_of(doc: dict | None) -> dict:
    """The "train" section of a status document ({} when absent)."""
    return (doc or {}).get("train") or {}


def group_of(doc: dict | None) -> dict:
    """The "group" section of a status document ({} when absent)."""
    return (doc or {}).get("group") or {}


def done_of(doc: dict | None) -> Any:
    """Whether the node's worker reported the job done (truthy) in its status document."""
    return ((doc or {}).get("worker") or {}).get("done")


async def fetch_status(node: LocalNode, channels: Channels) -> dict | None:
    """The node's status document, or None when it does not answer."""
    client = NodeClient(node.addr, channels=channels, timeout=1.5)
    try:
        return json.loads((await client.status()).json)
    except (errors.PeerError, ValueError):
        return None


def sample_row(t: float, node_id: str, life: int, doc: dict) -> dict[str, Any]:
    """One timeline sample of a node: term, role, leader, commit index, group view and step."""
    g, tr = group_of(doc), train_of(doc)
    return {
        "t": t, "node": node_id, "life": life, "term": doc["term"],
        "role": doc["role"], "leader": doc["leader"], "commit": doc["commit_index"],
        "gen": g.get("generation"), "members": g.get("members"), "world": g.get("world_size", 0),
        "step": tr.get("step"), "done": bool(done_of(doc)),
    }
