"""The architecture as a test: which layer may import what (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpeer

ROOT = Path(dpeer.__file__).parent
IMPURE = {"asyncio", "grpc", "lmdb", "torch", "time", "socket", "subprocess"}
PURE = [
    "statemachine/entry.py", "statemachine/payloads.py", "statemachine/state.py", "statemachine/snapshot.py", "statemachine/meta.py",
    "statemachine/errors.py", "statemachine/props.py", "statemachine/txn.py", "view.py", "address.py",
    "daemon/views.py", "daemon/sightings.py", "daemon/resync.py", "daemon/quorum.py", "errors.py", "daemon/checkpoints.py",
    "daemon/worker_health.py", "daemon/failures.py", "daemon/probe_rtt.py", "daemon/sites.py", "daemon/job_status.py", "cli/demo_events.py", "cli/status_text.py", "security/auth.py",
    "security/exposure.py", "security/proof.py",
    "trainer/decisions.py", "trainer/sampler.py", "trainer/rendezvous_table.py", "chaos/linear.py", "chaos/prefix.py",
    *[p.relative_to(ROOT).as_posix() for d in ("membership", "consensus", "sim")
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
    assert all(p.startswith(("transport/", "proto/")) for p in importers("grpc")), importers("grpc")


def test_the_raft_core_reads_no_application_payload() -> None:
    """Entries are opaque to consensus/: it takes the entry codec, store errors and uids from the
    state machine, never its typed payloads or its rules (the config_change it owns, it decodes itself)."""
    allowed = {"dpeer.statemachine.entry", "dpeer.statemachine.errors", "dpeer.statemachine.meta"}
    for path in sorted((ROOT / "consensus").glob("*.py")):
        used = {n for n in imports(path) if n.startswith("dpeer.statemachine")}
        assert used <= allowed, f"consensus/{path.name} imports {sorted(used - allowed)}"


# Beside the worker's own package: the API a user's script imports in the worker's process, and the
# offline `dpeer export` command, which imports the trainer when it runs (never the daemon).
TRAINER_USERS = {"job.py", "cli/export.py"}


def test_nothing_imports_the_trainer_and_the_daemon_needs_no_torch() -> None:
    outside = {p for p in importers("dpeer.trainer") if not p.startswith("trainer/")} - TRAINER_USERS
    assert not outside, f"{outside} import dpeer.trainer (the daemon starts it as a process, never imports it)"
    torch_users = {p for p in importers("torch") if not p.startswith("trainer/")}
    assert not torch_users, f"{torch_users} import torch (only the worker's process may)"


# Which layer may import which (arrows point down; a package may always import itself). The pure
# cores at the bottom, the wire above them, the daemon that drives them, the launcher, the chaos
# tool and the CLI on top; the trainer runs in the worker's process and talks to the daemon only
# through the data-dir channel.
ALLOWED: dict[str, set[str]] = {
    "errors": set(), "proto": set(), "security": set(), "sim": set(),
    # the Clock seam: read by the daemon's loops and the worker channel, imports nothing of ours
    "clock": set(),
    # (host, port) values, parsed and written in one place
    "address": set(),
    # the one View type: committed by the log, handed through the channel, formed by the worker
    "view": {"address"},
    "statemachine": {"address", "view"},
    "channel": {"address", "view"},
    "membership": {"address"},
    "consensus": {"statemachine"},
    # sim: the in-memory transport routes through the seeded SimNetwork's link policies
    "transport": {"proto", "errors", "statemachine", "membership", "consensus", "security", "sim"},
    "daemon": {"errors", "proto", "statemachine", "membership", "consensus", "transport", "security", "channel",
               "clock", "address", "view"},
    "trainer": {"channel", "address", "view"},
    # the public API a user's training script imports (dpeer.job.connect)
    "job": {"trainer"},
    "launch": {"errors", "transport", "security"},
    # daemon: the chaos daemon entry builds a daemon with its fault wrapper around the transport
    "chaos": {"errors", "transport", "security", "launch", "daemon"},
    # trainer: only `dpeer export` (TRAINER_USERS), which imports it when it runs
    "cli": {"errors", "proto", "statemachine", "transport", "security", "channel", "daemon", "launch", "chaos",
            "clock", "trainer"},
}


def package_of(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


def test_every_package_imports_only_the_layers_below_it() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        pkg = package_of(rel)
        if pkg == "__init__":
            continue
        assert pkg in ALLOWED, f"{rel}: package {pkg!r} has no place in the layer table"
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "dpeer" and len(parts) > 1 and parts[1] != pkg and parts[1] not in ALLOWED[pkg]:
                wrong.append(f"{rel} imports {name}")
    assert not wrong, "wrong-way imports:\n" + "\n".join(wrong)
