"""Test code, never part of dpeer: tests/chaos/test_planted_stale_read.py puts this directory on
PYTHONPATH for the chaos run, so every process it starts imports this module at start-up and, the
moment ``dpeer.daemon.serve.service`` is imported (in the daemons: nothing is loaded here until then),
plants a deliberate bug in it: a node that does not lead answers `kv get` from its own applied
state, without the leader's ReadIndex, so a follower that lags (or is cut off) serves stale reads."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TARGET = "dpeer.daemon.serve.service"


def plant(module: ModuleType) -> None:
    """Wrap Service.kv_get: a follower reads its local state; the leader keeps its ReadIndex."""
    from dpeer.consensus import Role

    real = module.Service.kv_get
    calls = module.calls

    async def kv_get(self: Any, request: Any) -> Any:
        if self.node.role is Role.LEADER:
            return await real(self, request)
        value = self.node.reads.state.kv.get(request.key)
        index = self.node.reads.last_applied
        if value is None:
            return calls.KvGetReply(found=False, read_index=index)
        return calls.KvGetReply(found=True, value=value, read_index=index)

    module.Service.kv_get = kv_get


class _PlantOnImport(importlib.abc.MetaPathFinder):
    """Finds the service module the usual way and plants the bug right after it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_and_plant(module: ModuleType) -> None:
            run(module)
            plant(module)

        spec.loader.exec_module = run_and_plant  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PlantOnImport())
