"""The heal's data plane: pieces over the donors, the checksum, a heal into live tensors across real
processes (2 donors, a receiver with no optimizer state yet), and a corrupt piece refused."""

from __future__ import annotations

import multiprocessing as mp
import socket
from typing import Any

import pytest
import torch

from dpeer.trainer import heal_transfer as ht
from dpeer.trainer.decisions import plan_heal
from tests.support.gloo import init_gloo
from tests.support.heal_state import State

CTX = mp.get_context("spawn")


def test_layout_cuts_the_stream_into_pieces_of_tensor_slices() -> None:
    layout = ht.Layout([["float32", [3]], ["int64", []], ["float32", [2, 2]]], {0}, piece_bytes=8)
    assert layout.sizes == [12, 8, 16] and layout.total == 36 and layout.n_pieces == 5
    assert layout.slices(0) == [ht.Slice(0, 0, 8)]
    assert layout.slices(1) == [ht.Slice(0, 8, 12), ht.Slice(1, 0, 4)]
    assert layout.slices(4) == [ht.Slice(2, 12, 16)]
    assert not layout.checked(0) and layout.checked(1)  # tensor 0 is covered by the params digest


def test_each_receiver_gets_every_missing_piece_once_spread_over_the_donors() -> None:
    plan = plan_heal({0: 0, 1: 5, 2: 5, 3: 5}, n_chunks=3)
    missing = [0, 1, 2, 4, 5, 7, 9]
    shares = ht.assigned_pieces(plan, 0, missing, 3)
    assert sorted(j for _, pieces in shares for j in pieces) == missing
    assert len({d for d, _ in shares}) == 3
    assert sorted(pieces[0] for _, pieces in shares) == missing[:3]  # every donor starts at the stream's head (the model)
    assert all(pieces == sorted(pieces) for _, pieces in shares)


def test_the_checksum_sees_a_changed_word_and_a_moved_block() -> None:
    data = torch.randint(0, 255, (3 * ht.BLOCK + 5,), dtype=torch.uint8)
    base = ht._check([data])
    changed = data.clone()
    changed[ht.BLOCK + 17] ^= 1
    swapped = data.clone()
    swapped[: ht.BLOCK], swapped[ht.BLOCK : 2 * ht.BLOCK] = data[ht.BLOCK : 2 * ht.BLOCK].clone(), data[: ht.BLOCK].clone()
    assert ht._check([changed]) != base and ht._check([swapped]) != base
    assert ht._check([data[1:][: 2 * ht.BLOCK]]) == ht._check([data[1:][: 2 * ht.BLOCK].clone()])  # alignment-free


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(seed: int, stepped: bool, width: int = 512) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Many small tensors (packed pieces), a BatchNorm buffer, and Adam with or without state.
    A stepped build takes seeded gradients, not a backward pass: a matmul's float sums may differ
    in the last bit from process to process (the math library picks its kernel by alignment, and
    threads), and two donors meant to hold one lineage would then look forked (a CI run did)."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(64, 64) for _ in range(20)]
    model = torch.nn.Sequential(*layers, torch.nn.BatchNorm1d(64), torch.nn.Linear(64, width), torch.nn.Linear(width, width))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if stepped:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return model, opt


def join(port: int, rank: int, world: int) -> None:
    import datetime as dt

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=dt.timedelta(seconds=60))
    init_gloo(rank, world, store=store, timeout=dt.timedelta(seconds=60))


def heal_rank(rank: int, world: int, port: int, mode: str, out: Any) -> None:
    """Rank 0 is a newcomer at step 0 (fresh Adam, no state); the others donors at step 3 ("fork":
    the last one of another lineage; "corrupt": the last one lies about its pieces' checksums)."""
    import torch.distributed as dist

    from dpeer.trainer import heal as heal_module
    from dpeer.trainer.heal import HealError, HealSession, heal

    ht.PIECE_BYTES = 64 << 10  # many pieces, a few packed (the primary's size rules)
    heal_module.PROGRESS_AFTER_S = 0.0  # report every piece (a real heal waits a second first)
    seen: list = []
    if mode == "corrupt" and rank == world - 1:
        real = ht._check
        ht._check = lambda views: real(views) ^ 1  # this donor lies about its pieces
    model, opt = build(1 if rank else 2, stepped=rank > 0) if mode != "fork" or rank < world - 1 else build(3, True)
    state = State(model, opt, 3 if rank else 0)
    join(port, rank, world)
    try:
        result = heal(rank, world, state.step, state, session=HealSession(seen.append))
        out.put((rank, "ok", state.step, state.digest(), state.optimizer_digest(), result.received_bytes, result.sent_bytes,
                 [(p.done_bytes, p.total_bytes, p.donors) for p in seen]))
    except (HealError, RuntimeError) as exc:  # a donor's last collective fails once the receiver has left
        out.put((rank, "error", state.step, str(exc), "", 0, 0, []))
    finally:
        dist.destroy_process_group()


def run_ranks(target: Any, world: int, *args: Any) -> list[tuple]:
    out = CTX.Queue()
    port = _free_port()
    procs = [CTX.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        rows = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return rows


@pytest.mark.timeout(180)
def test_two_donors_heal_a_fresh_receiver_into_its_live_tensors() -> None:
    rows = run_ranks(heal_rank, 3, "")
    assert [r[1] for r in rows] == ["ok"] * 3, rows
    assert {r[2] for r in rows} == {3}
    assert len({r[3] for r in rows}) == 1 and len({r[4] for r in rows}) == 1  # params and Adam state alike
    assert rows[1][6] > 0 and rows[2][6] > 0 and rows[0][5] == rows[1][6] + rows[2][6]  # both donors sent a share
    progress = rows[0][7]
    assert len(progress) > 2 and progress[-1] == (rows[0][5], rows[0][5], 2)  # the receiver's, from 2 donors
    assert [p[0] for p in progress] == sorted(p[0] for p in progress)
    for donor in rows[1:]:  # a donor reports what it sent (donors 0), so its daemon never takes it for hung
        sent = donor[7]
        assert sent and sent[-1] == (donor[6], donor[6], 0) and [p[0] for p in sent] == sorted(p[0] for p in sent)


@pytest.mark.timeout(180)
def test_a_piece_whose_checksum_differs_is_refused() -> None:
    rows = run_ranks(heal_rank, 3, "corrupt")
    assert rows[0][1] == "error" and "arrived corrupt" in rows[0][3], rows
    assert rows[0][2] == 0  # the newcomer took nothing of the refused state


@pytest.mark.timeout(180)
def test_a_fork_at_the_top_step_drops_the_early_pieces_and_heals_everyone_to_one_lineage() -> None:
    """The pieces start before the top ranks' digests are known; these show two lineages (rank 1's
    wins: lowest rank), so the heal runs again, planned first, and rank 2 receives too."""
    rows = run_ranks(heal_rank, 3, "fork")
    assert [r[1] for r in rows] == ["ok"] * 3, rows
    assert len({r[3] for r in rows}) == 1 and len({r[4] for r in rows}) == 1
    assert rows[2][5] > 0 and rows[1][5] == 0  # the other lineage's rank received, the winner did not
