"""Bytes across sites as pure bookkeeping (dpeer/daemon/decide/cross_site.py): which addresses
are far, and what each reading adds."""

from __future__ import annotations

from dpeer.daemon.decide.cross_site import KEEP_READINGS, CrossSiteBytes, Reading, far_addresses

SITES = {"a": "lab", "b": "lab", "c": "cloud", "d": None}
HOSTS = {"a": ["10.0.0.1"], "b": ["10.0.0.2"], "c": ["10.1.0.1", "fd00::1"], "d": ["10.2.0.1"]}


def test_far_addresses_are_the_other_sites_boxes() -> None:
    assert far_addresses(SITES, HOSTS, "a") == {"10.1.0.1", "fd00::1"}  # d's site is not known: not far
    assert far_addresses(SITES, HOSTS, "c") == {"10.0.0.1", "10.0.0.2"}
    assert far_addresses(SITES, HOSTS, "d") == frozenset()  # this box's own site is not known yet


def test_an_address_this_site_shares_is_never_far() -> None:
    """Boxes of two sites on one host (loopback): their bytes cannot be told apart, none count."""
    hosts = {n: ["127.0.0.1"] for n in SITES}
    assert far_addresses(SITES, hosts, "a") == frozenset()


def test_each_reading_adds_what_far_connections_moved_since_the_last() -> None:
    counts = CrossSiteBytes()
    far = {"10.1.0.1"}
    owners = {1: "worker", 2: "daemon", 3: "worker"}
    counts.add({1: Reading("10.1.0.1", 100, 50), 2: Reading("10.1.0.1", 7, 9), 3: Reading("10.0.0.2", 999, 999),
                4: Reading("10.1.0.1", 5000, 5000)}, owners, far)  # 3 is near, 4 is another process's
    assert counts.document() == {"daemon": {"sent": 7, "received": 9}, "worker": {"sent": 100, "received": 50}}
    counts.add({1: Reading("10.1.0.1", 160, 70), 3: Reading("10.0.0.2", 2000, 2000)}, owners, far)  # 2 closed
    counts.add({1: Reading("10.1.0.1", 160, 70), 5: Reading("10.1.0.1", 10, 1)}, {1: "worker", 5: "worker"}, far)
    assert counts.document() == {"daemon": {"sent": 7, "received": 9}, "worker": {"sent": 170, "received": 71}}


def test_a_connection_that_turns_far_counts_from_its_last_reading() -> None:
    """A site learned late (the first view without sites): what moved before the reading that
    found the peer far is counted once, never twice."""
    counts = CrossSiteBytes()
    counts.add({1: Reading("10.1.0.1", 100, 100)}, {1: "worker"}, far=set())
    counts.add({1: Reading("10.1.0.1", 130, 110)}, {1: "worker"}, far={"10.1.0.1"})
    counts.add({1: Reading("10.1.0.1", 130, 110)}, {1: "worker"}, far={"10.1.0.1"})
    assert counts.document()["worker"] == {"sent": 30, "received": 10}


def test_a_connection_one_reading_misses_is_not_counted_again_from_zero() -> None:
    """A sock_diag dump is not atomic (a busy socket table can make it skip a socket) and a
    family's dump can fail: a long-lived connection missing from one reading must go on from its
    last counters, not add its whole life a second time."""
    counts = CrossSiteBytes()
    far, owners = {"10.1.0.1"}, {1: "worker"}
    counts.add({1: Reading("10.1.0.1", 10**9, 10**9)}, owners, far)
    counts.add({}, owners, far)  # missed once
    counts.add({1: Reading("10.1.0.1", 10**9 + 100, 10**9 + 50)}, owners, far)
    assert counts.document()["worker"] == {"sent": 10**9 + 100, "received": 10**9 + 50}


def test_a_reused_inode_counts_its_new_connection_from_zero_and_old_ones_are_forgotten() -> None:
    counts = CrossSiteBytes()
    far, owners = {"10.1.0.1"}, {1: "daemon"}
    counts.add({1: Reading("10.1.0.1", 500, 500)}, owners, far)
    counts.add({1: Reading("10.1.0.1", 20, 30)}, owners, far)  # a new connection under inode 1
    assert counts.document()["daemon"] == {"sent": 520, "received": 530}
    for _ in range(KEEP_READINGS):
        counts.add({}, {}, far)
    assert not counts._last  # closed connections' counters are not kept for ever
