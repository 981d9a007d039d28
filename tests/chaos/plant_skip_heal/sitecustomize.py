"""Test code, never part of dpeer: tests/chaos/test_planted_bug.py puts this directory on
PYTHONPATH for the chaos run, so every process it starts imports this module at start-up and, the
moment ``dpeer.trainer.heal`` is imported (in the workers only: nothing heavy is loaded here), plants
a deliberate bug in it: a rank behind the group receives the donors' state into scratch tensors,
keeps its own (stale) parameters and optimizer state, takes only the donors' step, and the
replicas' digest check after the heal is skipped, so replicas silently diverge."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

TARGET = "dpeer.trainer.heal"


class _Stale:
    """A heal's view of the state that takes nothing of what it receives but the step."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def parts(self) -> Any:
        return self._state.parts()

    def digest(self) -> str:
        return self._state.digest()

    def targets(self, header: dict) -> list:
        import torch

        return [torch.empty(shape, dtype=getattr(torch, dtype)) for dtype, shape in header["tensors"]]

    def digest_order(self, header: dict, targets: list) -> None:
        return None  # scratch targets: the digest is taken after the load, of the stale state

    def load(self, parts: Any) -> None:
        own = self._state.parts()
        own.header["step"] = parts.header["step"]
        self._state.load(own)


def plant(module: ModuleType) -> None:
    """Wrap the module's heal so receivers keep their stale state; drop the digest comparison."""
    real = module.heal

    def heal(rank: int, world: int, my_step: int, state: Any, *args: Any, **kwargs: Any) -> Any:
        return real(rank, world, my_step, _Stale(state), *args, **kwargs)

    module.heal = heal
    module._check_equal = lambda digests: None


class _PlantOnImport(importlib.abc.MetaPathFinder):
    """Finds the heal module the usual way and plants the bug right after it has run."""

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
