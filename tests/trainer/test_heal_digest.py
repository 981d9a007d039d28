"""The receiver's digest hashed as pieces land: equal to params_digest after the load, never taken
from tensors that are not the model's own, and never waiting for pieces that will not come."""

from __future__ import annotations

import random

import pytest
import torch

from dpeer.trainer import state as st
from dpeer.trainer.heal_digest import DigestCancelled, EarlyDigest
from dpeer.trainer.heal_transfer import Layout


def job() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def layout_of(header: dict, piece_bytes: int = 64) -> Layout:
    return Layout(header["tensors"], st.model_tensor_indices(header), piece_bytes)


def test_the_order_covers_what_params_digest_hashes_and_the_hash_matches() -> None:
    model, opt = job()
    header = st.capture_parts(model, opt).header
    targets = st.receive_targets(header, model, opt)
    order = st.digest_order(header, targets, model)
    assert order is not None and len(order) == len(list(model.parameters())) + len(list(model.buffers()))
    layout = layout_of(header)
    early = EarlyDigest(layout, targets, order, set())
    pieces = list(range(layout.n_pieces))
    random.Random(1).shuffle(pieces)
    for j in pieces:
        early.landed_piece(j)
    assert early.result() == st.params_digest(model)


def test_no_order_when_a_tensor_would_land_in_scratch_space() -> None:
    model, opt = job()
    header = st.capture_parts(model, opt).header
    targets = st.receive_targets(header, model, opt)
    scratch = [torch.empty_like(t) for t in targets]
    assert st.digest_order(header, scratch, model) is None


def test_no_order_when_the_model_has_a_buffer_the_state_does_not_carry() -> None:
    model, opt = job()
    model.register_buffer("scale", torch.ones(2), persistent=False)
    header = st.capture_parts(model, opt).header
    assert st.digest_order(header, st.receive_targets(header, model, opt), model) is None


def test_a_resumed_heals_pieces_count_as_landed() -> None:
    model, opt = job()
    header = st.capture_parts(model, opt).header
    targets = st.receive_targets(header, model, opt)
    layout = layout_of(header)
    early = EarlyDigest(layout, targets, st.digest_order(header, targets, model), set(range(layout.n_pieces)))
    assert early.result() == st.params_digest(model)


def test_a_missing_piece_is_refused_not_waited_for_and_cancel_ends_the_thread() -> None:
    model, opt = job()
    header = st.capture_parts(model, opt).header
    targets = st.receive_targets(header, model, opt)
    layout = layout_of(header)
    early = EarlyDigest(layout, targets, st.digest_order(header, targets, model), set())
    for j in range(1, layout.n_pieces):
        early.landed_piece(j)
    with pytest.raises(DigestCancelled):
        early.result()
    stopped = EarlyDigest(layout, targets, st.digest_order(header, targets, model), set())
    stopped.cancel()
    assert not stopped._thread.is_alive()


def test_no_order_when_two_targets_share_memory() -> None:
    """Tied weights: one storage under two names; a late piece of one would change bytes hashed for the other."""
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    opt = torch.optim.Adam(model.parameters())
    header = st.capture_parts(model, opt).header
    assert st.digest_order(header, st.receive_targets(header, model, opt), model) is None
