"""Step-by-step tests of the pure core on a controlled clock (no simulator)."""

from __future__ import annotations

import random

from dpeer.membership import (
    Ack,
    Gossip,
    HeartbeatObserved,
    SeenDead,
    SeenLeft,
    MemberRecord,
    MemberState,
    SeenSuspect,
    Membership,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Update,
    lan,
)
from dpeer.membership.core import Datagram
from dpeer.membership.messages import Heartbeat

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


def addr(node_id: str) -> str:
    return f"{node_id}:7946"


def core(node_id: str = "a", peers: int = 4, seed: int = 1, **changes: float) -> Membership:
    """A core that knows `peers` other alive members b, c, d, ..."""
    names = [chr(ord("b") + i) for i in range(peers)]
    known = [MemberRecord(n, addr(n), ALIVE, 0) for n in names]
    return Membership(node_id, addr(node_id), lan().with_(**changes), random.Random(seed), 0.0, known=known)


def hb(node_id: str, incarnation: int = 0, now: float = 0.0, version: tuple[int, int, int] = (0, 0, 0)) -> Heartbeat:
    return Heartbeat(node_id, addr(node_id), incarnation, *version, now)


def advance(m: Membership, until: float) -> list[Datagram]:
    """Tick the core at every time it asks for up to `until`; answer nothing (total loss)."""
    out: list[Datagram] = []
    while (t := m.next_tick()) is not None and t <= until:
        out.extend(m.tick(t))
    return out


def first_ping(m: Membership) -> tuple[float, str, Ping]:
    while True:
        t = m.next_tick()
        assert t is not None
        for dst, msg in m.tick(t):
            if isinstance(msg, Ping):
                return t, dst, msg


def test_probe_timeout_ping_req_suspect_dead() -> None:
    m = core()
    t0, dst, ping = first_ping(m)
    out = advance(m, t0 + lan().probe_timeout + 1e-9)
    reqs = [(d, msg) for d, msg in out if isinstance(msg, PingReq)]
    assert len(reqs) == 3 and all(msg.target == ping.target and d != dst for d, msg in reqs)
    out = advance(m, t0 + lan().probe_interval)
    assert m.state_of(ping.target) is SUSPECT
    assert any(d == dst and isinstance(msg, Gossip) and msg.updates[0].state is SUSPECT for d, msg in out)
    assert any(isinstance(e, SeenSuspect) for e in m.drain_effects())
    assert m.health_score == 3  # three relays sent no nack: maybe we are the sick one
    # N=5, no confirmations: the maximum timeout, 3 * 2 * max(1, log10 5) * 0.5 s = 3 s
    advance(m, t0 + lan().probe_interval + 2.9)
    assert m.state_of(ping.target) is SUSPECT
    advance(m, t0 + lan().probe_interval + 3.01)
    assert m.state_of(ping.target) is DEAD
    assert [e for e in m.drain_effects() if isinstance(e, SeenDead)][0].node_id == ping.target


def test_ack_keeps_member_alive_and_health_good() -> None:
    m = core()
    t0, dst, ping = first_ping(m)
    m.receive(t0 + 0.001, Ack(ping.seq, hb(ping.target, now=t0)))
    out = advance(m, t0 + lan().probe_interval)
    assert not any(isinstance(msg, PingReq) for _, msg in out)
    assert m.state_of(ping.target) is ALIVE and m.health_score == 0


def test_an_acked_probe_does_not_ask_for_a_tick_at_its_timeout() -> None:
    m = core()
    t, dst, ping = first_ping(m)
    cfg = lan()
    assert m.next_tick() == t + cfg.probe_timeout  # unanswered: the timeout is the next work
    m.receive(t + 0.001, Ack(ping.seq, hb(ping.target, now=t)))
    assert m.next_tick() == t + cfg.probe_interval  # answered: the next probe round
    assert not any(isinstance(msg, PingReq) for _, msg in m.tick(t + cfg.probe_timeout))


def test_nacks_mean_target_failure_not_ours() -> None:
    m = core()
    t0, _, ping = first_ping(m)
    out = advance(m, t0 + lan().probe_timeout + 1e-9)
    for dst, msg in out:
        if isinstance(msg, PingReq):
            m.receive(t0 + 0.3, Nack(msg.seq, hb(dst.split(":")[0])))
    advance(m, t0 + lan().probe_interval)
    assert m.state_of(ping.target) is SUSPECT and m.health_score == 0


def test_awareness_stretches_probe_interval() -> None:
    m = core()
    t0, _, _ = first_ping(m)
    out = advance(m, t0 + lan().probe_interval)  # failed, 3 missing nacks: score 3
    assert m.health_score == 3
    (_, ping), = [(d, msg) for d, msg in out if isinstance(msg, Ping) and msg.seq > 1]
    m.receive(t0 + 0.6, Ack(ping.seq, hb(ping.target)))
    assert m.health_score == 2
    t1, _, _ = first_ping(m)
    assert abs((t1 - t0) - 4 * lan().probe_interval - lan().probe_interval) < 1e-9  # 0.5 s then 4 x 0.5 s


def test_refutation_bumps_incarnation_and_answers_the_accuser() -> None:
    m = core()
    out = m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "a", addr("a"), 0, "b"),)))
    assert m.incarnation == 1 and m.health_score == 1
    assert any(d == addr("b") and msg.updates[0] == Update(ALIVE, "a", addr("a"), 1, "a") for d, msg in out)
    m.receive(1.1, Gossip(hb("c"), (Update(DEAD, "a", addr("a"), 0, "c"),)))
    assert m.incarnation == 1  # an older accusation is already refuted
    m.receive(1.2, Gossip(hb("c"), (Update(DEAD, "a", addr("a"), 5, "c"),)))
    assert m.incarnation == 6


def test_higher_incarnation_clears_suspicion() -> None:
    m = core()
    m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "c", addr("c"), 0, "b"),)))
    assert m.state_of("c") is SUSPECT
    m.receive(1.1, Gossip(hb("d"), (Update(ALIVE, "c", addr("c"), 0, "c"),)))
    assert m.state_of("c") is SUSPECT  # same incarnation does not refute
    m.receive(1.2, Ping(7, "a", hb("c", incarnation=1)))
    assert m.state_of("c") is ALIVE
    advance(m, 10.0)
    assert m.state_of("c") is not DEAD or m.member("c").incarnation == 1


def _suspect_dead_after(confirmers: list[str]) -> float:
    m = core(peers=9)  # N = 10: min = 2 * 1 * 0.5 = 1 s, max = 3 s, k = 2
    m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "j", addr("j"), 0, "b"),)))
    for i, who in enumerate(confirmers):
        m.receive(1.0 + 0.01 * (i + 1), Gossip(hb(who), (Update(SUSPECT, "j", addr("j"), 0, who),)))
    t = 1.0
    while m.state_of("j") is SUSPECT:
        t += 0.01
        m.tick(t)
    return t - 1.0


def test_confirmations_shrink_suspicion_timeout() -> None:
    none, one, two, three = (_suspect_dead_after(c) for c in ([], ["c"], ["c", "d"], ["c", "d", "e"]))
    assert 2.99 <= none <= 3.02
    assert 1.0 < one < none  # 3 - 2 * log(2)/log(3) = 1.74 s
    assert abs(one - 1.74) < 0.02
    assert 0.99 <= two <= 1.02 and 0.99 <= three <= 1.02


def test_duplicate_confirmation_does_not_count() -> None:
    assert abs(_suspect_dead_after(["b", "b"]) - 3.0) < 0.02


def test_refused_connection_suspects_then_kills_quickly() -> None:
    m = core()
    out = m.unreachable(2.0, addr("c"))
    assert m.state_of("c") is SUSPECT
    assert out == [(addr("c"), Gossip(m.heartbeat(2.0), (Update(SUSPECT, "c", addr("c"), 0, "a", refused=True),)))]
    m.tick(2.0 + lan().refused_suspicion_timeout - 0.01)
    assert m.state_of("c") is SUSPECT
    m.tick(2.0 + lan().refused_suspicion_timeout)
    assert m.state_of("c") is DEAD


def test_a_refused_suspicion_is_refuted_straight_to_every_live_member() -> None:
    # its 0.2 s timer is shorter than gossip takes to spread the refutation
    m = core(peers=4)
    m.receive(1.0, Gossip(hb("c"), (Update(DEAD, "e", addr("e"), 0, "c"),)))
    out = m.receive(1.1, Gossip(hb("b"), (Update(SUSPECT, "a", addr("a"), 0, "b", refused=True),)))
    refutations = [(dst, msg) for dst, msg in out if isinstance(msg, Gossip) and msg.updates[0].node_id == "a"]
    assert m.incarnation == 1 and all(msg.updates[0].state is ALIVE for _, msg in refutations)
    assert sorted(dst for dst, _ in refutations) == [addr("b"), addr("c"), addr("d")]  # not the dead e


def test_a_probe_suspicion_is_refuted_to_its_sender_only() -> None:
    m = core(peers=4)
    out = m.receive(1.1, Gossip(hb("b"), (Update(SUSPECT, "a", addr("a"), 0, "b"),)))
    assert m.incarnation == 1 and [dst for dst, _ in out] == [addr("b")]


def test_refused_evidence_travels_with_the_suspicion() -> None:
    m = core()
    m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "c", addr("c"), 0, "b"),)))
    m.receive(1.1, Gossip(hb("d"), (Update(SUSPECT, "c", addr("c"), 0, "d", refused=True),)))
    m.tick(1.1 + lan().refused_suspicion_timeout)
    assert m.state_of("c") is DEAD


def test_only_our_own_refusal_marks_a_suspicion_refused_and_it_is_told_once() -> None:
    m = core()
    m.drain_effects()
    m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "c", addr("c"), 0, "b", refused=True),)))
    assert [e.refused for e in m.drain_effects() if isinstance(e, SeenSuspect)] == [False]  # relayed
    m.receive(1.04, Gossip(hb("d"), (Update(SUSPECT, "c", addr("c"), 0, "a", refused=True),)))
    assert not [e for e in m.drain_effects() if isinstance(e, SeenSuspect)]  # an echo naming us is still gossip
    m.unreachable(1.05, addr("c"))
    m.unreachable(1.06, addr("c"))
    assert [e.refused for e in m.drain_effects() if isinstance(e, SeenSuspect)] == [True]  # ours, once


def test_retransmit_limit_bounds_piggybacking() -> None:
    m = core(peers=4)  # N = 5: 4 * ceil(log10 6) = 4 transmissions
    m.receive(1.0, Gossip(hb("b"), (Update(ALIVE, "z", addr("z"), 0, "b"),)))
    carried = 0
    for i in range(20):
        out = m.receive(1.0 + i * 0.01, Ping(100 + i, "a", hb("b")))
        carried += sum(1 for _, msg in out for u in msg.updates if u.node_id == "z")
    assert carried == 4


def test_relay_forwards_ack_or_nacks() -> None:
    m = core()
    out = m.receive(1.0, PingReq(42, "c", addr("c"), hb("b")))
    (dst, ping), = out
    assert dst == addr("c") and isinstance(ping, Ping) and ping.target == "c"
    out = m.receive(1.01, Ack(ping.seq, hb("c")))
    assert [(d, type(msg), msg.seq) for d, msg in out] == [(addr("b"), Ack, 42)]
    out = m.receive(2.0, PingReq(43, "d", addr("d"), hb("b")))
    out = advance(m, 2.0 + lan().probe_timeout)
    assert [(d, msg.seq) for d, msg in out if isinstance(msg, Nack)] == [(addr("b"), 43)]


def test_ping_for_someone_else_is_not_acked() -> None:
    m = core()
    assert m.receive(1.0, Ping(1, "zz", hb("b"))) == []


def test_heartbeat_versions_are_observed_and_advertised() -> None:
    m = core()
    m.set_local_version(2, 40, 39)
    out = m.receive(1.0, Ping(5, "a", hb("b", now=0.9, version=(3, 10, 9))))
    (_, ack), = out
    assert (ack.hb.term, ack.hb.last_applied, ack.hb.commit_index, ack.hb.sent_at) == (2, 40, 39, 1.0)
    obs = [e for e in m.drain_effects() if isinstance(e, HeartbeatObserved)]
    assert obs[0].hb.last_applied == 10 and obs[0].at == 1.0
    rec = m.member("b")
    assert rec is not None and (rec.term, rec.last_applied, rec.commit_index) == (3, 10, 9)


def test_push_pull_merge_precedence() -> None:
    m = core()
    m.receive(1.0, Gossip(hb("b", incarnation=1)))
    def pp(*records: MemberRecord, reply: bool = True) -> list[Datagram]:
        return m.receive(2.0, PushPull(hb("c"), records, reply=reply))
    pp(MemberRecord("b", addr("b"), SUSPECT, 1))
    assert m.state_of("b") is SUSPECT
    pp(MemberRecord("b", addr("b"), ALIVE, 1))
    assert m.state_of("b") is SUSPECT  # alive at the same incarnation loses to suspect
    pp(MemberRecord("b", addr("b"), ALIVE, 2))
    assert m.state_of("b") is ALIVE
    pp(MemberRecord("b", addr("b"), DEAD, 1))
    assert m.state_of("b") is ALIVE  # older news
    pp(MemberRecord("b", addr("b"), DEAD, 2))
    assert m.state_of("b") is SUSPECT  # a remote death is only a suspicion (memberlist)
    pp(MemberRecord("b", addr("b"), LEFT, 2))
    assert m.state_of("b") is LEFT
    pp(MemberRecord("b", addr("b"), ALIVE, 2))
    assert m.state_of("b") is LEFT
    pp(MemberRecord("zz", addr("zz"), DEAD, 0))
    assert m.state_of("zz") is None  # no resurrection of unknown dead nodes
    pp(MemberRecord("a", addr("a"), DEAD, 0))
    assert m.incarnation == 1
    out = pp(MemberRecord("y", addr("y"), ALIVE, 3), reply=False)
    assert m.state_of("y") is ALIVE
    (dst, reply), = [(d, msg) for d, msg in out if isinstance(msg, PushPull)]
    assert dst == addr("c") and reply.reply and {r.node_id for r in reply.members} >= {"a", "b", "y"}


def test_join_through_a_seed() -> None:
    seed = core("a")
    x = Membership("x", addr("x"), lan(), random.Random(3), 0.0)
    (dst, hello), = x.join(0.0, [addr("a"), addr("x")])
    assert dst == addr("a") and hello.join
    (back, answer), = [(d, msg) for d, msg in seed.receive(0.01, hello) if isinstance(msg, PushPull)]
    assert back == addr("x") and seed.state_of("x") is ALIVE
    x.receive(0.02, answer)
    assert {r.node_id for r in x.members() if r.state is ALIVE} == {"a", "b", "c", "d", "e", "x"}


def test_join_retries_while_alone() -> None:
    x = Membership("x", addr("x"), lan(), random.Random(3), 0.0)
    x.join(0.0, [addr("a")])
    out = advance(x, 5.0)
    assert sum(1 for d, msg in out if isinstance(msg, PushPull) and msg.join) >= 2


def test_graceful_leave_is_gossiped_and_stops_probing() -> None:
    leaver, peer = core("a"), core("b", peers=0)
    peer.receive(0.0, Gossip(hb("a")))
    out = leaver.leave(1.0)
    assert out and all(isinstance(msg, Gossip) and msg.updates[0].state is LEFT for _, msg in out)
    peer.receive(1.01, out[0][1])
    assert peer.state_of("a") is LEFT
    assert any(isinstance(e, SeenLeft) for e in peer.drain_effects())
    later = advance(leaver, 10.0)
    assert not any(isinstance(msg, (Ping, PushPull)) for _, msg in later)
    # a leaving node does not refute its own departure
    leaver.receive(11.0, Gossip(hb("b"), (Update(DEAD, "a", addr("a"), 0, "b"),)))
    assert leaver.incarnation == 0 and leaver.state_of("a") is LEFT


def test_dead_members_are_reaped() -> None:
    m = core(reap_after=5.0)
    m.unreachable(0.0, addr("c"))
    advance(m, 1.0)
    assert m.state_of("c") is DEAD
    advance(m, 12.0)
    assert m.state_of("c") is None and m.member("c") is None  # the others died of total loss meanwhile


def test_suspect_ping_carries_the_suspicion_to_the_suspect() -> None:
    m = core(peers=2)
    m.receive(0.0, Gossip(hb("c"), (Update(SUSPECT, "b", addr("b"), 0, "c"),)))
    pings = [first_ping(m) for _ in range(2)]
    (dst, ping), = [(d, p) for _, d, p in pings if p.target == "b"]
    assert dst == addr("b") and ping.updates[0].state is SUSPECT


def test_same_seed_same_run() -> None:
    def trace(seed: int) -> list[tuple[str, str]]:
        m = core(seed=seed, peers=6)
        return [(d, type(msg).__name__) for d, msg in advance(m, 20.0)]
    assert trace(5) == trace(5)
    assert trace(5) != trace(6)
