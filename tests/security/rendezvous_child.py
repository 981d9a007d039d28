"""One party to a rendezvous, as its own process (torch has one default group per process).

python -m tests.security.rendezvous_child member NODE PORT SECRET   form view gen 7 [a, b] as NODE
python -m tests.security.rendezvous_child stranger - PORT -          a store client that is no member:
    it writes the keys it can guess (gen7/...) and tries to take rank 1
python -m tests.security.rendezvous_child heal NODE PORT KEY         form [a, b], then heal with heal key KEY:
    a is at step 5 (the donor), b at step 0 (it receives)
Prints one JSON line: {"formed": bool, "error": str, ...}.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time

import torch
import torch.distributed as dist

from dpeer.trainer.group import GroupError, GroupManager
from dpeer.trainer.heal import HealError, heal
from dpeer.address import Address
from dpeer.view import View
from tests.support.heal_state import State

TIMEOUT = 6.0


def member(node: str, port: int, secret: str) -> dict:
    view = View(7, ("a", "b"), Address("127.0.0.1", port), secret=secret)
    gm = GroupManager(node, backend="gloo", init_timeout=TIMEOUT)
    try:
        m = gm.form(view, bind_host="127.0.0.1")
    except GroupError as exc:
        return {"formed": False, "error": str(exc)}
    gm.close()
    return {"formed": True, "error": "", "rank": m.rank}


def stranger(port: int) -> dict:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=TIMEOUT))
            break
        except (RuntimeError, ValueError):
            if time.monotonic() > deadline:
                return {"formed": False, "error": "no store"}
            time.sleep(0.05)
    prefix = dist.PrefixStore("gen7", store)
    prefix.add("arrived", 1)
    try:
        dist.init_process_group("gloo", store=prefix, rank=1, world_size=2, timeout=dt.timedelta(seconds=TIMEOUT))
    except (RuntimeError, ValueError) as exc:
        return {"formed": False, "error": str(exc).splitlines()[0]}
    return {"formed": True, "error": ""}


def healing(node: str, port: int, key: str) -> dict:
    """Heal b from a under `key` (each party may be given another): did b take a's state?"""
    gm = GroupManager(node, backend="gloo", init_timeout=TIMEOUT)
    m = gm.form(View(7, ("a", "b"), Address("127.0.0.1", port)), bind_host="127.0.0.1")
    torch.manual_seed(1 if node == "a" else 2)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 5 if node == "a" else 0
    try:
        result = heal(m.rank, m.world, step, State(model, opt, step), key=key.encode())
    except (HealError, RuntimeError) as exc:  # the donor's sends fail once the receiver refused and left
        return {"formed": True, "error": str(exc).splitlines()[0]}
    finally:
        gm.destroy()
    return {"formed": True, "error": "", "received": result.received}


if __name__ == "__main__":
    role, node, port, secret = sys.argv[1:5]
    if role == "heal":
        out = healing(node, int(port), secret)
    else:
        out = member(node, int(port), "" if secret == "-" else secret) if role == "member" else stranger(int(port))
    print(json.dumps(out), flush=True)
