"""After a failed init a rank must name its next group as its peers do (chaos run regression)."""

from __future__ import annotations


import pytest
import torch.distributed as dist

from dpeer.launch.cluster import free_port_block
from dpeer.address import Address
from dpeer.view import View
from dpeer.trainer.group import GroupError, GroupManager, derive
from dpeer.trainer.rendezvous import GenerationStore, RendezvousClient


def test_a_failed_init_does_not_shift_the_next_groups_name() -> None:
    port = free_port_block(2)
    manager = GroupManager("a", backend="gloo", init_timeout=2.0)
    try:
        # A peer that arrives at the rendezvous but never joins init: init times out after it.
        view = View(1, ("a", "ghost"), Address("127.0.0.1", port))
        key = derive(view.secret, "rendezvous", 1)
        manager._host_store(view.store.host, view.store.port).allow(1, key)
        GenerationStore(RendezvousClient(view.store.host, view.store.port), 1, key, 2.0).add("arrived", 1)
        with pytest.raises(GroupError):
            manager.form(view)
        assert dist.distributed_c10d._world.group_count == 0
        manager.form(View(2, ("a",), Address("127.0.0.1", port)))
        assert dist.distributed_c10d._get_default_group().group_name == "0"
    finally:
        manager.close()
