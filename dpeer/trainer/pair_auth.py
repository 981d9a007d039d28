"""Every pair of ranks proves the generation's key over its own data-plane connection, once the
group is formed and before any gradient or heal piece crosses it.

Gloo tells the peers that connect to a rank apart only by a sequence number sent on connect, so
a stranger who connects first with the right number takes a peer's place (issue 35). Here each
rank sends every peer a fresh nonce, then a tag over (sender, receiver, the receiver's nonce, its
own nonce) under the pair key derived from the generation's secret; a receiver that finds a tag it
did not expect fails the group, naming the rank whose connection did not prove the key. The
exchange runs over the very connections the collectives use (send/recv to each peer), so what is
proven is the connection, not just the process. A stranger in the middle that relays both sides
and then injects bytes is not caught: that needs an encrypted data plane (docs/operations.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os

import torch
import torch.distributed as dist

NONCE_BYTES = 16
TAG_BYTES = 32


class PairUnproven(RuntimeError):
    """A peer's connection did not prove the generation's key; the text names the rank."""


def pair_tag(key: bytes, sender: int, receiver: int, receiver_nonce: bytes, sender_nonce: bytes) -> bytes:
    """What sender sends receiver to prove it holds key, bound to both nonces of this exchange."""
    message = b"dpeer/pair/%d/%d/" % (sender, receiver) + receiver_nonce + sender_nonce
    return hmac.new(key, message, hashlib.sha256).digest()


def _exchange(rank: int, outgoing: dict[int, bytes], size: int, device: torch.device) -> dict[int, bytes]:
    """Send each peer its bytes and receive as many from each, all posted at once."""
    inbox = {p: torch.empty(size, dtype=torch.uint8, device=device) for p in outgoing}
    works = [dist.irecv(buf, src=p) for p, buf in inbox.items()]
    for p, data in outgoing.items():
        works.append(dist.isend(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device), dst=p))
    for work in works:
        work.wait()
    return {p: bytes(buf.cpu().tolist()) for p, buf in inbox.items()}


def authenticate_pairs(rank: int, world: int, key: bytes, device: torch.device = torch.device("cpu")) -> None:
    """Prove key to every peer and check every peer's proof; PairUnproven names a peer whose
    connection did not prove it (a collective failure raises as any would)."""
    peers = [p for p in range(world) if p != rank]
    if not peers:
        return
    mine = os.urandom(NONCE_BYTES)
    theirs = _exchange(rank, {p: mine for p in peers}, NONCE_BYTES, device)
    proofs = _exchange(rank, {p: pair_tag(key, rank, p, theirs[p], mine) for p in peers}, TAG_BYTES, device)
    for p in peers:
        if not hmac.compare_digest(proofs[p], pair_tag(key, p, rank, mine, theirs[p])):
            raise PairUnproven(f"the data-plane connection of rank {p} did not prove the generation's key: "
                               "a stranger may have connected in its place")
