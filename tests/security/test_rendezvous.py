"""The rendezvous store takes any client, so a generation's keys carry a tag derived from the secret
the leader drew for it: a store client that is not a member cannot make the group form with its keys.
The heal stream is authenticated with a key derived from the same secret."""

from __future__ import annotations

import json
import subprocess
import sys

from dpeer.launch.cluster import free_port_block
from dpeer.trainer.group import rendezvous_prefix
from dpeer.address import Address
from dpeer.trainer.viewsource import View

SECRET = "5f0c1e7a9b2d4c6e8f0a1b2c3d4e5f60"


def run(*parties: tuple[str, str, str]) -> list[dict]:
    """Start the parties (role, node, secret) against one store port; their JSON answers, in order."""
    port = free_port_block(1)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.security.rendezvous_child", role, node, str(port), secret],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for role, node, secret in parties]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=90)
        assert stdout.strip(), stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_a_stranger_cannot_join_a_generation_with_a_secret() -> None:
    member, stranger = run(("member", "a", SECRET), ("stranger", "-", "-"))
    assert not member["formed"] and "1/2 members arrived" in member["error"], member
    assert not stranger["formed"], stranger


def test_without_a_secret_the_same_stranger_takes_the_rank_so_the_test_can_fail() -> None:
    member, stranger = run(("member", "a", "-"), ("stranger", "-", "-"))
    assert member["formed"] and stranger["formed"], (member, stranger)


def test_members_who_know_the_secret_form_the_group() -> None:
    a, b = run(("member", "a", SECRET), ("member", "b", SECRET))
    assert a == {"formed": True, "error": "", "rank": 0} and b["formed"] and b["rank"] == 1, (a, b)


def test_the_prefix_depends_on_the_secret_and_hides_it() -> None:
    view = View(7, ("a", "b"), Address("127.0.0.1", 1), secret=SECRET)
    other = View(7, ("a", "b"), Address("127.0.0.1", 1), secret="0" * 32)
    assert rendezvous_prefix(view) != rendezvous_prefix(other) != "gen7"
    assert rendezvous_prefix(View(7, ("a",), Address("h", 1))) == "gen7"
    assert SECRET not in rendezvous_prefix(view) and rendezvous_prefix(view).startswith("gen7-")


def test_the_heal_stream_is_authenticated_with_the_generations_key() -> None:
    donor, receiver = run(("heal", "a", "k" * 32), ("heal", "b", "k" * 32))
    assert receiver == {"formed": True, "error": "", "received": True}, receiver
    donor, receiver = run(("heal", "a", "k" * 32), ("heal", "b", "x" * 32))
    assert "authentication tag does not verify" in receiver["error"], receiver
