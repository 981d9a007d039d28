"""A step's digest hashed beside the next step (trainer/digests.py) is the digest of that step's
state: the next forward writes BatchNorm's running statistics while the hash runs, and the hash
must not see them (a chaos run once showed three replicas with three digests at one step)."""

from __future__ import annotations

import torch

from dpeer.trainer import state as st
from dpeer.trainer.digests import BackgroundDigest


def test_a_digest_taken_before_a_forward_is_the_digest_of_that_state() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    before = st.params_digest(model)
    later = st.digest_later(model)
    model(torch.randn(16, 8))  # the next step's forward: new running statistics
    assert st.params_digest(model) != before
    digests = BackgroundDigest()
    digests.start(5, later)
    assert digests.settle() == (5, before) and digests.settle() is None
    digests.close()
