"""Healing after a re-form: ranks behind the group's highest step copy full state from ranks at it,
and so do ranks at that step whose parameters belong to another lineage than the winning one.

Every rank allgathers its step; the ranks at the highest step allgather their parameter digests
too (two lineages are possible) and all compute the same ``plan_heal``. When ranks are behind,
the pieces start before the digests are known, on the plan that the top ranks hold one lineage,
and the digests, computed and exchanged while the pieces travel and the receiver checks them,
confirm it (a fork: the pieces are dropped and the heal runs again, planned first). The first
donor broadcasts the state header (step, RNG states, optimizer hyper-parameters, tensor specs),
HMAC-tagged with the generation's key. The tensors
travel in pieces (heal_transfer), each donor sending a different share, from the donors' live
tensors straight into the receiver's own parameters and optimizer state: nothing is flattened,
pickled or staged on the way.

Integrity: the model's bytes are covered by the final check, every rank allgathering its
parameter digest (sha256 of parameters and buffers), which must all be equal; every other byte
(optimizer state and the rest) travels in pieces that carry the donor's checksum
(heal_transfer._check), checked on arrival. A full sha256 of the whole state on both sides, as
before, cost more than the copy itself. A receiver whose model tensors are received in place hashes
each as soon as its pieces have landed, while the optimizer's still travel (heal_digest).

Resumption: a receiver writes into its live tensors, so from its first receive until the digests
agree its state is torn: it then reports step -1 (it never donates nor wins a lineage) and keeps the
pieces that arrived whole. The next heal from the same source (step and digest) fetches only the
missing pieces (pieces from donors lost before their digests were exchanged are fetched again).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from dpeer.trainer.decisions import HealPlan, plan_heal
from dpeer.trainer.group import GroupError
from dpeer.trainer import heal_transfer
from dpeer.trainer.heal_digest import DigestCancelled, EarlyDigest
from dpeer.trainer.heal_transfer import Layout, Transfer, TransferError, assigned_pieces
from dpeer.trainer.state import StateError, StateParts, model_tensor_indices, tensor_bytes

PROGRESS_AFTER_S = 1.0  # a transfer that lasts longer reports its progress, about once a second
_hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpeer-heal-donor-digest")


class HealError(RuntimeError):
    """The group's replicas disagree after healing, or the state could not be received."""


class HealInterrupted(HealError, GroupError):
    """The transfer or the digests' exchange failed (a donor died, hung or was cut off): a group
    failure, transient, which never counts towards judging the job broken (decisions.classify_failure)."""


class Healable(Protocol):
    """The training state as the heal sees it."""

    def parts(self) -> StateParts:
        """The header and the live tensors (a donor sends them where they lie)."""

    def targets(self, header: dict) -> list[torch.Tensor]:
        """Where each tensor of ``header`` is received (the receiver's own live tensors where they fit)."""

    def load(self, parts: StateParts) -> None:
        """Take the received state (its tensors are already in place where targets gave live ones)."""

    def digest(self) -> str:
        """The parameters' (and buffers') digest."""

    def digest_order(self, header: dict, targets: list[torch.Tensor]) -> list[int] | None:
        """The header's tensors that digest() hashes, in its order, when all are received in place
        into ``targets`` (so the receiver hashes them as they land); None when not."""


@dataclass(frozen=True)
class HealProgress:
    """How far a transfer got: a receiver's bytes received from its ``donors``, or a donor's bytes
    sent (``donors`` 0)."""

    done_bytes: int
    total_bytes: int
    seconds: float
    donors: int


@dataclass
class _Partial:
    source: tuple[int, str]  # the step and parameter digest of the state being received
    specs: str  # its tensor specs and piece size, canonical JSON
    targets: list[torch.Tensor]
    done: set[int]


class HealSession:
    """What a worker keeps from one heal to the next: a partial (torn) state to resume, and where
    progress of long transfers goes."""

    def __init__(self, on_progress: Callable[[HealProgress], None] | None = None) -> None:
        self.on_progress = on_progress
        self.partial: _Partial | None = None

    @property
    def torn(self) -> bool:
        """True while an interrupted heal left this replica's state half overwritten."""
        return self.partial is not None

    def forget(self) -> None:
        """The whole state was replaced (a checkpoint load): nothing torn remains to resume."""
        self.partial = None


@dataclass(frozen=True)
class HealResult:
    """What healing did on this rank."""

    plan: HealPlan
    received: bool
    sent_bytes: int
    received_bytes: int
    seconds: float
    resumed_bytes: int = 0


def _allgather_ints(values: list[int], world: int, device: torch.device) -> list[list[int]]:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.zeros(len(values), dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    return [[int(v) for v in t.tolist()] for t in out]


def _digest_words(digest: str) -> list[int]:
    raw = bytes.fromhex(digest) if digest else bytes(32)
    return [int.from_bytes(raw[i : i + 8], "big", signed=True) for i in range(0, 32, 8)]


def _words_digest(words: list[int]) -> str:
    return b"".join(w.to_bytes(8, "big", signed=True) for w in words).hex()


def _broadcast_bytes(data: bytes | None, src: int, rank: int, device: torch.device) -> bytes:
    size = torch.tensor([len(data) if rank == src and data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    if rank == src and data is not None:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if buf.numel():
        dist.broadcast(buf, src)
    return tensor_bytes(buf)


def _tag(key: bytes, header: bytes) -> bytes:
    return hmac.new(key, header, hashlib.sha256).digest()


def gather_digests(digest: str, world: int, device: torch.device = torch.device("cpu")) -> list[str]:
    """Allgather every rank's hex params digest."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8).to(device)
    out = [torch.zeros(32, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    return [tensor_bytes(t).hex() for t in out]


def _check_equal(digests: list[str]) -> None:
    """Raise HealError unless every rank's digest is the same."""
    if len(set(digests)) != 1:
        raise HealError(f"replicas disagree after heal: {sorted(set(d[:12] for d in digests))}")


def heal(
    rank: int,
    world: int,
    my_step: int,
    state: Healable,
    n_chunks: int | None = None,
    device: torch.device = torch.device("cpu"),
    key: bytes = b"",
    vouched: bool = False,
    session: HealSession | None = None,
    committed: tuple[int, str] = (0, ""),
) -> HealResult:
    """Bring every rank of the new group to the highest step among them and to one lineage
    (collective: all ranks call). Ranks at that step whose parameters differ from the winning
    lineage's (decisions.pick_lineage; ``vouched``: this rank's lineage holds the committed
    checkpoint) receive its state too, so a group whose replicas forked converges instead of
    failing its digest check at every re-form.

    ``device`` is where collective buffers live (cuda for NCCL). ``key`` (the generation's heal
    key, the same on every rank) authenticates the header: a receiver takes nothing whose tag does
    not verify. ``session`` carries a torn state from an interrupted heal into the next one.
    ``committed`` (step, parameter digest) is the cluster's committed checkpoint: a receiver healed
    to that step whose parameters do not have that digest refuses them (the log, carried over mutual
    TLS, outranks whatever the data plane delivered).
    """
    t0 = time.monotonic()
    session = session or HealSession()
    chunks = n_chunks or max(1, world - 1)
    rows = _allgather_ints([-1 if session.torn else my_step, int(vouched), int(session.torn)], world, device)
    steps = {r: row[0] for r, row in enumerate(rows)}
    max_step = max(steps.values())
    if max_step < 0:
        raise HealError("every rank holds a state torn by an interrupted heal; no peer can give a whole one")
    at_max = [r for r, s in steps.items() if s == max_step]
    any_torn = any(row[2] for row in rows)
    vouchers = {r for r, row in enumerate(rows) if row[1]}
    mine, digests = "", None
    if any_torn:  # a resumption needs the source's digest before it asks for pieces
        mine, digests = _gather_lineages(state, rank, at_max, world, device)
    plan = plan_heal(steps, chunks, digests=digests, vouched=vouchers)
    # Several ranks at the top step and some behind: the plan assumes the former hold one lineage and
    # the pieces start at once; their digests, computed while the pieces travel, confirm it.
    speculative = digests is None and len(at_max) > 1
    if speculative and not plan.needed:  # nobody behind: only a fork can need a heal, and it must be known first
        mine, digests = _gather_lineages(state, rank, at_max, world, device)
        plan, speculative = plan_heal(steps, chunks, digests=digests, vouched=vouchers), False
    if not plan.needed:  # every rank at the highest step, their digests equal (compared just above)
        return HealResult(plan, False, 0, 0, time.monotonic() - t0)
    primary = plan.donors[0]
    source = (plan.max_step, digests[primary] if digests else "")
    is_donor, is_receiver = rank in plan.donors, rank in plan.receivers
    parts = state.parts() if is_donor else None
    offer = {"state": parts.header, "piece_bytes": heal_transfer.PIECE_BYTES} if rank == primary and parts else None
    header_bytes = _broadcast_bytes(json.dumps(offer, sort_keys=True).encode() if offer else None, primary, rank, device)
    if key:
        tag = _broadcast_bytes(_tag(key, header_bytes) if rank == primary else None, primary, rank, device)
        if is_receiver and not hmac.compare_digest(tag, _tag(key, header_bytes)):
            raise HealError("the heal header's authentication tag does not verify; refusing the state")
    offered = json.loads(header_bytes.decode())
    header = offered["state"]
    specs = json.dumps([header["tensors"], offered["piece_bytes"]])
    if parts is not None and parts.header["tensors"] != header["tensors"]:
        raise HealError("this donor's tensors differ from the primary donor's; refusing to send them")
    layout = Layout(header["tensors"], model_tensor_indices(header), int(offered["piece_bytes"]))
    transfer = Transfer(rank, layout, device, sources=parts.tensors if parts else None)
    resumed = 0
    if is_receiver:
        p = session.partial
        if p is None or p.source != source or p.specs != specs:
            p = session.partial = _Partial(source, specs, state.targets(header), set())
        transfer.targets, transfer.done = p.targets, p.done
        resumed = sum(layout.piece_range(j)[1] - layout.piece_range(j)[0] for j in p.done)
    order = state.digest_order(header, transfer.targets) if is_receiver and transfer.targets is not None else None
    early = EarlyDigest(layout, transfer.targets, order, transfer.done) if order else None  # type: ignore[arg-type]
    try:
        kept = _gather_kept(transfer.done, layout.n_pieces, world, device) if any_torn else [set()] * world
        posted = _post(rank, plan, layout, transfer, kept, chunks)
        # a lone donor's digest, needed only for the closing comparison: hashed while its pieces travel
        later = _hashing.submit(state.digest) if is_donor and not mine and not speculative else None
        if speculative:  # the top ranks' digests travel while the receiver checks its pieces as they land
            mine, lineages = _post_lineages(state, rank, at_max, world, device)
            try:
                _finish(transfer, posted, session, t0, early)
            except HealError:
                _note_source(session, plan, primary, lineages, is_receiver)  # resumable if the digests came
                raise
            digests = _note_source(session, plan, primary, lineages, is_receiver)
            if digests is None:
                raise HealInterrupted("the top ranks' digests never arrived; the pieces' lineage is unknown, "
                                "so the next heal fetches them again")
            if plan_heal(steps, chunks, digests=digests, vouched=vouchers).donors != plan.donors:
                if is_receiver and session.partial is not None:
                    session.partial.done.clear()  # the pieces may be another lineage's: take none of them
                if early is not None:
                    early.cancel()
                return heal(rank, world, my_step, state, n_chunks, device, key, vouched, session,  # torn now: planned first
                            committed)
        else:
            _finish(transfer, posted, session, t0, early)
        if is_receiver:
            try:
                state.load(StateParts(header, transfer.targets or []))
            except (StateError, RuntimeError, KeyError, ValueError) as exc:
                transfer.done.clear()
                raise HealError(f"received state rejected: {exc}") from None
            mine = _received_digest(state, early)
        elif later is not None:
            mine = later.result()
        all_digests = gather_digests(mine or state.digest(), world, device)
        if is_receiver and all_digests[rank] == all_digests[primary]:
            session.partial = None
        elif is_receiver and session.partial is not None:
            session.partial.done.clear()  # whole pieces and a wrong result: something else is wrong, fetch all again
    finally:
        if early is not None:
            early.cancel()
    _check_equal(all_digests)
    if is_receiver and committed[1] and plan.max_step == committed[0] and all_digests[rank] != committed[1]:
        session.partial = None
        raise HealError(f"the state healed to step {committed[0]} has digest {all_digests[rank][:12]}, not the committed "
                        f"checkpoint's {committed[1][:12]}; refusing it")
    return HealResult(plan, is_receiver, transfer.sent, transfer.received, time.monotonic() - t0, resumed)


def _received_digest(state: Healable, early: EarlyDigest | None) -> str:
    """The receiver's parameter digest after the load: hashed as the pieces landed when it could be."""
    if early is not None:
        try:
            return early.result()
        except DigestCancelled:  # not expected once every piece landed; the full hash is as good, only later
            pass
    return state.digest()


def _gather_kept(done: set[int], n_pieces: int, world: int, device: torch.device) -> list[set[int]]:
    """Every rank's pieces already held (a torn receiver's resumption); one byte per piece."""
    mine = torch.zeros(max(1, n_pieces), dtype=torch.uint8, device=device)
    for j in done:
        mine[j] = 1
    out = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(out, mine)
    return [{j for j, v in enumerate(t.tolist()[:n_pieces]) if v} for t in out]


def _gather_lineages(state: Healable, rank: int, at_max: list[int], world: int,
                     device: torch.device) -> tuple[str, dict[int, str]]:
    """This rank's digest (ranks at the top step only) and every top rank's, for the lineage pick."""
    mine, lineages = _post_lineages(state, rank, at_max, world, device)
    return mine, lineages()


def _post_lineages(state: Healable, rank: int, at_max: list[int], world: int,
                   device: torch.device) -> tuple[str, Callable[[], dict[int, str]]]:
    """This rank's digest (ranks at the top step only, hashed now) and a wait for every top rank's:
    the allgather runs on the group's own threads, so a receiver checks its pieces meanwhile."""
    mine = state.digest() if rank in at_max else ""
    words = torch.tensor(_digest_words(mine), dtype=torch.int64, device=device)
    out = [torch.zeros_like(words) for _ in range(world)]
    work = dist.all_gather(out, words, async_op=True)

    def lineages() -> dict[int, str]:
        work.wait()
        return {r: _words_digest([int(v) for v in t.tolist()]) if r in at_max else "" for r, t in enumerate(out)}

    return mine, lineages


def _note_source(session: HealSession, plan: HealPlan, primary: int, lineages: Callable[[], dict[int, str]],
                 is_receiver: bool) -> dict[int, str] | None:
    """The top ranks' digests, or None when their exchange failed; a receiver records its pieces'
    lineage (a resumption needs it: pieces of an unknown lineage are fetched again)."""
    try:
        digests = lineages()
    except RuntimeError:
        return None
    if is_receiver and session.partial is not None:
        session.partial.source = (plan.max_step, digests[primary])
    return digests


@dataclass
class _Posted:
    sends: list
    receives: dict[int, tuple[list, list, list]]
    order: list[int]  # the receiver's pieces, round-robin over its donors
    donors: int


def _post(rank: int, plan: HealPlan, layout: Layout, transfer: Transfer, kept: list[set[int]],
          chunks: int) -> _Posted:
    """Post this rank's sends (a donor) or receives (a receiver) of the pieces missing on each receiver."""
    sends: list = []
    receives: dict = {}
    mine: list[list[int]] = []
    for recv in plan.receivers:
        missing = [j for j in range(layout.n_pieces) if j not in kept[recv]]
        for donor, pieces in assigned_pieces(plan, recv, missing, chunks):
            if rank == donor:
                sends.extend(transfer.send(recv, pieces))
            elif rank == recv:
                receives.update(transfer.post_receive(donor, pieces))
                mine.append(pieces)
    return _Posted(sends, receives, [j for group in _interleave(mine) for j in group], len(mine))


def _finish(transfer: Transfer, posted: _Posted, session: HealSession, t0: float,
            early: EarlyDigest | None = None) -> None:
    """Wait for this rank's pieces; a receiver checks each as it lands, and both sides report the
    progress of a long transfer (a donor too: its daemon takes a worker silent for a minute as
    hung). On a failure every posted operation is drained and whatever arrived whole is kept, then
    HealInterrupted."""
    layout = transfer.layout
    report = _Reporter(session, t0, posted.donors)
    try:
        for j in posted.order:
            transfer.finish_piece(j, *posted.receives[j])
            if early is not None:
                early.landed_piece(j)
            report(min(layout.total, len(transfer.done) * layout.piece_bytes), layout.total)
        for i, w in enumerate(posted.sends, 1):
            transfer.wait(w)
            report(transfer.sent * i // len(posted.sends), transfer.sent)
    except (RuntimeError, TransferError) as exc:
        transfer.drain(posted.sends)
        transfer.salvage(posted.receives)
        raise HealInterrupted(f"heal failed ({len(transfer.done)} of {layout.n_pieces} pieces held): {exc}") from None
    if posted.order and session.on_progress is not None and time.monotonic() - t0 > PROGRESS_AFTER_S:
        session.on_progress(HealProgress(layout.total, layout.total, time.monotonic() - t0, posted.donors))


class _Reporter:
    """Calls the session's progress callback about once a second once a transfer has run a second."""

    def __init__(self, session: HealSession, t0: float, donors: int) -> None:
        self.session, self.t0, self.donors, self.last = session, t0, donors, t0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.session.on_progress is None or now - self.t0 <= PROGRESS_AFTER_S or now - self.last < PROGRESS_AFTER_S:
            return
        self.last = now
        self.session.on_progress(HealProgress(done, total, now - self.t0, self.donors))


def _interleave(lists: list[list[int]]) -> list[list[int]]:
    """Round-robin over the donors' piece lists (the order pieces are likely to land)."""
    out, i = [], 0
    while any(i < len(x) for x in lists):
        out.append([x[i] for x in lists if i < len(x)])
        i += 1
    return out
