"""Layering rules: lmdb lives in store.py only; the pure modules import no I/O or clock."""

from __future__ import annotations

import ast
from pathlib import Path

import dpeer

ROOT = Path(dpeer.__file__).parent
PURE = ("entry.py", "state.py", "snapshot.py", "meta.py", "errors.py", "props.py")
IMPURE = {"lmdb", "asyncio", "grpc", "torch", "time"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_store_imports_lmdb() -> None:
    files = sorted(ROOT.rglob("*.py"))
    users = {p.relative_to(ROOT).as_posix() for p in files if "lmdb" in imported_roots(p)}
    assert users == {"statemachine/store.py"}


def test_pure_modules_import_no_io_or_clock() -> None:
    for name in PURE:
        bad = imported_roots(ROOT / "statemachine" / name) & IMPURE
        assert not bad, f"statemachine/{name} imports {bad}"
