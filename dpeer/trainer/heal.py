"""Healing after a re-form: ranks behind the group's highest step copy full state from ranks at it,
and so do ranks at that step whose parameters belong to another lineage than the winning one.

Every rank allgathers its step and parameter digest; all compute the same ``plan_heal``. The first donor broadcasts the
state header (step, RNG states, optimizer hyper-parameters, tensor specs, payload digest); each
receiver then gets the payload in contiguous chunks from several donors over send/recv in the new
group. The receiver checks the payload digest (every donor's bytes must equal the first donor's),
restores, and finally all ranks allgather their parameter digests, which must all be equal.
A failure anywhere raises and the caller re-forms; nothing is resumed half-way (the state is small
next to the link speed here, so a retry from scratch is the simple, correct choice).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from dpeer.trainer.decisions import HealPlan, plan_heal
from dpeer.trainer.sampler import shard_bounds
from dpeer.trainer.state import StateBlob, StateError, tensor_bytes


# TEST HOOK, inert unless set: TEST_DPEER_PLANT_BUG=skip_heal plants a deliberate bug so that
# tests/chaos/test_planted_bug.py can show the chaos checks catch it: a rank behind the group
# receives the state but keeps its own (stale) parameters, takes only the donor's step, and the
# digest check is skipped, so replicas silently diverge. (Not a DPEER_* name: those are config
# keys, and the daemon refuses unknown ones.)
PLANT_ENV = "TEST_DPEER_PLANT_BUG"


def _planted(bug: str) -> bool:
    return os.environ.get(PLANT_ENV, "") == bug


class HealError(RuntimeError):
    """The group's replicas disagree after healing."""


@dataclass(frozen=True)
class HealResult:
    """What healing did on this rank."""

    plan: HealPlan
    received: bool
    sent_bytes: int
    received_bytes: int
    seconds: float


def _allgather_replicas(step: int, digest: str, vouched: bool, world: int,
                        device: torch.device) -> list[tuple[int, str, bool]]:
    """Every rank's (step, parameter digest, whether its lineage holds the committed checkpoint)."""
    words = [int.from_bytes(bytes.fromhex(digest)[i : i + 8], "big", signed=True) for i in range(0, 32, 8)]
    mine = torch.tensor([step, int(vouched), *words], dtype=torch.int64, device=device)
    out = [torch.zeros(6, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    rows = [[int(v) for v in t.tolist()] for t in out]
    return [(r[0], b"".join(w.to_bytes(8, "big", signed=True) for w in r[2:]).hex(), bool(r[1])) for r in rows]


def _broadcast_bytes(data: bytes | None, src: int, rank: int, device: torch.device) -> bytes:
    size = torch.tensor([len(data) if rank == src else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    if rank == src:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if buf.numel():
        dist.broadcast(buf, src)
    return tensor_bytes(buf)


def _tag(key: bytes, header: bytes) -> bytes:
    return hmac.new(key, header, hashlib.sha256).digest()


def _byte_range(total: int, n_chunks: int, first: int, end: int) -> tuple[int, int]:
    return shard_bounds(total, first, n_chunks)[0], shard_bounds(total, end - 1, n_chunks)[1]


def verify_digests(digest: str, world: int, device: torch.device = torch.device("cpu")) -> list[str]:
    """Allgather every rank's hex params digest; raise HealError unless all are equal."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8).to(device)
    out = [torch.zeros(32, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(out, mine)
    digests = [tensor_bytes(t).hex() for t in out]
    if len(set(digests)) != 1:
        raise HealError(f"replicas disagree after heal: {sorted(set(d[:12] for d in digests))}")
    return digests


def heal(
    rank: int,
    world: int,
    my_step: int,
    capture: Callable[[], StateBlob],
    apply: Callable[[StateBlob], None],
    digest: Callable[[], str],
    n_chunks: int | None = None,
    device: torch.device = torch.device("cpu"),
    key: bytes = b"",
    vouched: bool = False,
) -> HealResult:
    """Bring every rank of the new group to the highest step among them and to one lineage
    (collective: all ranks call). Ranks at that step whose parameters differ from the winning
    lineage's (decisions.pick_lineage; ``vouched``: this rank's lineage holds the committed
    checkpoint) receive its state too, so a group whose replicas forked converges instead of
    failing its digest check at every re-form.

    ``device`` is where collective buffers live (cuda for NCCL); the state itself is staged on CPU.
    ``key`` (the generation's heal key, the same on every rank) authenticates the stream: the
    primary donor sends an HMAC of the header, which names the payload's sha256, and a receiver
    takes nothing whose tag does not verify.
    """
    t0 = time.monotonic()
    chunks = n_chunks or max(1, world - 1)
    mine = digest()
    replicas = _allgather_replicas(my_step, mine, vouched, world, device)
    plan = plan_heal({r: v[0] for r, v in enumerate(replicas)}, chunks,
                     digests={r: v[1] for r, v in enumerate(replicas)},
                     vouched={r for r, v in enumerate(replicas) if v[2]})
    sent = received = 0
    if plan.needed:
        is_donor = rank in plan.donors
        blob = capture() if is_donor else None
        primary = plan.donors[0]
        header = _broadcast_bytes(blob.header_bytes() if rank == primary else None, primary, rank, device)
        if key:
            tag = _broadcast_bytes(_tag(key, header) if rank == primary else None, primary, rank, device)
            if rank in plan.receivers and not hmac.compare_digest(tag, _tag(key, header)):
                raise HealError("the heal header's authentication tag does not verify; refusing the state")
        total = int(json.loads(header.decode())["payload_len"])
        buf = torch.empty(total, dtype=torch.uint8, device=device) if rank in plan.receivers else None
        payload = blob.payload.to(device) if blob is not None else None
        works = []
        for recv in plan.receivers:
            for donor, first, end in plan.assignment[recv]:
                a, b = _byte_range(total, chunks, first, end)
                if a == b:
                    continue
                if rank == donor:
                    works.append(dist.isend(payload[a:b].contiguous(), dst=recv))
                    sent += b - a
                elif rank == recv:
                    works.append(dist.irecv(buf[a:b], src=donor))
                    received += b - a
        for w in works:
            w.wait()
        works.clear()
        if buf is not None:
            try:
                received_blob = StateBlob.from_parts(header, buf.cpu())
                if _planted("skip_heal"):  # TEST HOOK (see PLANT_ENV): keep stale params, take the step
                    received_blob = capture()
                    received_blob.header["step"] = int(json.loads(header.decode())["step"])
                apply(received_blob)
            except StateError as exc:
                raise HealError(f"received state rejected: {exc}") from None
    if not _planted("skip_heal"):  # TEST HOOK: the planted bug also skips the replicas' digest check
        verify_digests(digest() if rank in plan.receivers else mine, world, device)
    return HealResult(plan, rank in plan.receivers, sent, received, time.monotonic() - t0)

