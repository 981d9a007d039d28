"""One party to a rendezvous, as its own process (torch has one default group per process).

python -m tests.security.rendezvous_child member NODE PORT SECRET   form view gen 7 [a, b] as NODE
python -m tests.security.rendezvous_child pair NODE PORT KEY        form [a, b], then prove pair key KEY
python -m tests.security.rendezvous_child heal NODE PORT KEY [DIGEST] form [a, b], then heal with heal key KEY:
    a is at step 5 (the donor), b at step 0 (it receives); DIGEST: the committed checkpoint's at step 5
Prints one JSON line: {"formed": bool, "error": str, ...}.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from dpeer.trainer.group import GroupError, GroupManager
from dpeer.trainer.heal import HealError, heal
from dpeer.trainer.pair_auth import PairUnproven, authenticate_pairs
from dpeer.address import Address
from dpeer.view import View
from tests.support.heal_state import State

TIMEOUT = float(os.environ.get("RENDEZVOUS_CHILD_TIMEOUT", "8"))
SECRET = "5f0c1e7a9b2d4c6e8f0a1b2c3d4e5f60"


def member(node: str, port: int, secret: str) -> dict:
    view = View(7, ("a", "b"), Address("127.0.0.1", port), secret=secret)
    gm = GroupManager(node, backend="gloo", init_timeout=TIMEOUT)
    try:
        m = gm.form(view, bind_host="127.0.0.1")
    except GroupError as exc:
        return {"formed": False, "error": str(exc)}
    gm.close()
    return {"formed": True, "error": "", "rank": m.rank}


def pair(node: str, port: int, key: str) -> dict:
    """Form with the shared secret, then prove `key` (each party may be given another)."""
    gm = GroupManager(node, backend="gloo", init_timeout=TIMEOUT)
    m = gm.form(View(7, ("a", "b"), Address("127.0.0.1", port), SECRET), bind_host="127.0.0.1")
    try:
        authenticate_pairs(m.rank, m.world, key.encode())
    except PairUnproven as exc:
        return {"formed": True, "error": str(exc)}
    finally:
        gm.close()
    return {"formed": True, "error": ""}


def healing(node: str, port: int, key: str, committed: str = "") -> dict:
    """Heal b from a under `key` (each party may be given another): did b take a's state?"""
    gm = GroupManager(node, backend="gloo", init_timeout=TIMEOUT)
    m = gm.form(View(7, ("a", "b"), Address("127.0.0.1", port), SECRET), bind_host="127.0.0.1")
    torch.manual_seed(1 if node == "a" else 2)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 5 if node == "a" else 0
    state = State(model, opt, step)
    try:
        result = heal(m.rank, m.world, step, state, key=key.encode(), committed=(5, committed))
    except (HealError, RuntimeError) as exc:  # the donor's sends fail once the receiver refused and left
        return {"formed": True, "error": str(exc).splitlines()[0]}
    finally:
        gm.close()
    return {"formed": True, "error": "", "received": result.received, "digest": state.digest()}


if __name__ == "__main__":
    role, node, port, secret = sys.argv[1:5]
    if role == "heal":
        out = healing(node, int(port), secret, *sys.argv[5:6])
    elif role == "pair":
        out = pair(node, int(port), secret)
    else:
        out = member(node, int(port), "" if secret == "-" else secret)
    print(json.dumps(out), flush=True)
