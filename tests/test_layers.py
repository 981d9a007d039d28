"""The architecture as a test: which layer may import what (DESIGN.md "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import dpeer

ROOT = Path(dpeer.__file__).parent
IMPURE = {"asyncio", "grpc", "lmdb", "torch", "time", "socket", "subprocess"}
PURE = [
    "statemachine/entry.py", "statemachine/state.py", "statemachine/snapshot.py", "statemachine/meta.py",
    "statemachine/errors.py", "statemachine/props.py", "statemachine/txn.py",
    "peer/views.py", "peer/resync.py", "peer/quorum.py", "peer/errors.py", "peer/checkpoints.py", "peer/worker_health.py",
    "peer/failures.py", "peer/probe_rtt.py", "peer/demo_events.py", "peer/auth.py",
    "peer/exposure.py",
    "trainer/decisions.py", "trainer/sampler.py",
    *[p.relative_to(ROOT).as_posix() for d in ("peer/membership", "peer/consensus", "sim")
      for p in sorted((ROOT / d).glob("*.py"))],
]


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def importers(root_name: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if any(n == root_name or n.startswith(root_name + ".") for n in imports(p))}


def test_pure_cores_import_no_io_clock_or_framework() -> None:
    for rel in PURE:
        bad = {n.split(".")[0] for n in imports(ROOT / rel)} & IMPURE
        assert not bad, f"{rel} is a pure core but imports {sorted(bad)}"


def test_only_the_store_imports_lmdb() -> None:
    assert importers("lmdb") == {"statemachine/store.py"}


def test_only_the_transport_and_generated_code_import_grpc() -> None:
    assert all(p.startswith(("peer/transport/", "proto/")) for p in importers("grpc")), importers("grpc")


def test_nothing_imports_the_trainer_and_the_daemon_needs_no_torch() -> None:
    outside = {p for p in importers("dpeer.trainer") if not p.startswith("trainer/")}
    assert not outside, f"{outside} import dpeer.trainer (arrows point down: trainer -> peer)"
    assert not {p for p in importers("torch") if p.startswith(("peer/", "statemachine/"))}
