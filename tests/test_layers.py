"""The architecture as a test: which layer may import what (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpeer

ROOT = Path(dpeer.__file__).parent
IMPURE = {"asyncio", "grpc", "lmdb", "torch", "time", "socket", "subprocess"}
# The daemon's pure decisions are its decide/ folder: a file put there is held to these rules.
DECIDE = "daemon/decide"
PURE = [
    "statemachine/entry.py", "statemachine/payloads.py", "statemachine/state.py", "statemachine/snapshot.py", "statemachine/meta.py",
    "statemachine/errors.py", "statemachine/props.py", "statemachine/txn.py", "view.py", "address.py", "errors.py",
    "ids.py", "cli/demo_events.py", "cli/status_text.py", "security/auth.py", "security/exposure.py", "security/proof.py",
    "trainer/decisions.py", "trainer/sampler.py", "trainer/rendezvous_table.py", "chaos/linear.py", "chaos/prefix.py",
    *[p.relative_to(ROOT).as_posix() for d in ("membership", "consensus", "sim", DECIDE)
      for p in sorted((ROOT / d).glob("*.py"))],
]


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; a relative import resolved against its package)."""
    package = ["dpeer", *path.relative_to(ROOT).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.add(".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])))
    return names


def importers(root_name: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if any(n == root_name or n.startswith(root_name + ".") for n in imports(p))}


def test_pure_cores_import_no_io_clock_or_framework() -> None:
    for rel in PURE:
        bad = {n.split(".")[0] for n in imports(ROOT / rel)} & IMPURE
        assert not bad, f"{rel} is a pure core but imports {sorted(bad)}"


def test_the_daemons_decisions_import_no_driver() -> None:
    """decide/ sits below the daemon's drivers: it may import the layers below the daemon and its
    own folder, never node/, worker/, serve/ or the daemon's top (what a driver does is its caller's)."""
    own = "dpeer." + DECIDE.replace("/", ".")
    decisions = sorted((ROOT / DECIDE).glob("*.py"))
    assert len(decisions) > 1, f"no decisions found under {DECIDE}"
    for path in decisions:
        wrong = {n for n in imports(path)
                 if n.startswith("dpeer.daemon") and n != own and not n.startswith(own + ".")}
        assert not wrong, f"{DECIDE}/{path.name} is a decision but imports the daemon's {sorted(wrong)}"


def test_only_the_store_imports_lmdb() -> None:
    assert importers("lmdb") == {"statemachine/store.py"}


def test_only_the_transport_and_generated_code_import_grpc() -> None:
    assert all(p.startswith(("transport/", "proto/")) for p in importers("grpc")), importers("grpc")


# The transport's seam, written in the cores' messages and calls.py's dataclasses: the simulation's
# in-memory network and the fault wrapper pass them as they are, without the wire's protobuf.
SEAM = {"transport/api.py", "transport/calls.py", "transport/memory.py", "transport/faulty.py"}


def test_the_transport_owns_the_wire() -> None:
    """Only the gRPC transport and the generated code import dpeer.proto (or a *_pb2 module) and
    the conversions to and from it (codec.py, wire.py); the CLI's client is transport/client.py."""
    generated = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if any("_pb2" in n for n in imports(p))}
    wire = importers("dpeer.proto") | generated
    converters = importers("dpeer.transport.codec") | importers("dpeer.transport.wire")
    outside = {p for p in wire | converters if not p.startswith(("transport/", "proto/"))}
    assert not outside, f"{sorted(outside)} import the wire's protobuf or its codec (the transport's own)"
    assert not wire & SEAM, f"{sorted(wire & SEAM)} are the transport's seam but import protobuf"


def test_consensus_imports_nothing_of_the_state_machine() -> None:
    """Consensus owns its log: the entry type (an opaque application kind), the storage contract and
    its errors; it knows only its own kinds (config_change, which it decodes itself, and the no-op)
    and never the state machine's entry codec, kinds, payloads or rules."""
    users = {p for p in importers("dpeer.statemachine") if p.startswith("consensus/")}
    assert not users, f"{sorted(users)} import the state machine"


# A class is one job: past these it is several owners in one namespace (issue 39).
MAX_CLASS_LINES, MAX_CLASS_METHODS = 300, 25


Classes = dict[tuple[str, str], tuple[ast.ClassDef, dict[str, str]]]


def _classes_of(sources: dict[str, str]) -> Classes:
    """Every class of the sources (file -> text) by (file, name), with the names its file imports
    from dpeer modules (name -> file), so that a base from another file resolves."""
    found = {}
    for rel, text in sources.items():
        tree = ast.parse(text, rel)
        imported = {a.asname or a.name: node.module.removeprefix("dpeer.").replace(".", "/") + ".py"
                    for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0
                    and (node.module or "").startswith("dpeer.") for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found[(rel, node.name)] = (node, imported)
    return found


def class_size(classes: Classes, key: tuple[str, str]) -> tuple[int, int]:
    """(lines, methods) of a class counted with the dpeer classes it inherits from."""
    cls, imported = classes[key]
    assert cls.end_lineno is not None
    lines = cls.end_lineno - cls.lineno + 1
    methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in cls.body)
    for base in cls.bases:
        if isinstance(base, ast.Name):
            home = (key[0], base.id) if (key[0], base.id) in classes else (imported.get(base.id, ""), base.id)
            if home in classes:
                more_lines, more_methods = class_size(classes, home)
                lines, methods = lines + more_lines, methods + more_methods
    return lines, methods


def test_no_class_in_dpeer_is_too_big() -> None:
    """No class in dpeer/ (the generated code aside) above MAX_CLASS_LINES lines or
    MAX_CLASS_METHODS methods, counted with the dpeer classes it inherits from (mixins and base
    classes share its namespace)."""
    classes = _classes_of({p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(ROOT.rglob("*.py"))
                           if not p.relative_to(ROOT).as_posix().startswith("proto/")})
    sizes = {key: class_size(classes, key) for key in classes}
    too_big = [f"{rel}: {name} has {lines} lines and {methods} methods" for (rel, name), (lines, methods)
               in sizes.items() if lines > MAX_CLASS_LINES or methods > MAX_CLASS_METHODS]
    assert len(sizes) > 300, "the rule found too few classes to be looking at dpeer/"
    assert not too_big, (f"classes to split into owners (at most {MAX_CLASS_LINES} lines and "
                         f"{MAX_CLASS_METHODS} methods, bases included):\n" + "\n".join(too_big))


def test_the_class_size_counts_bases_from_the_same_and_other_files() -> None:
    sources = {"a.py": "class Base:\n    def one(self): ...\n    def two(self): ...\n",
               "b.py": ("from dpeer.a import Base\nclass Mixin:\n    def three(self): ...\n"
                        "class Big(Base, Mixin, object):\n    def four(self): ...\n")}
    classes = _classes_of(sources)
    assert class_size(classes, ("b.py", "Big")) == (2 + 2 + 3, 4)


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
    # what a process holds, read from /proc (its sockets): the daemon's byte counts, the worker's cut
    "procfs": set(),
    # (host, port) values, parsed and written in one place
    "address": set(),
    # the Ids seam: where a node draws its random ids (secrets, or a simulation's seeded source)
    "ids": set(),
    # the one View type: committed by the log, handed through the channel, formed by the worker
    "view": {"address"},
    # consensus: the entry type and the storage errors the store raises under the log's rules
    "statemachine": {"address", "view", "consensus", "ids"},
    "channel": {"address", "view"},
    "membership": {"address"},
    "consensus": {"ids"},
    # sim: the in-memory transport routes through the seeded SimNetwork's link policies
    "transport": {"proto", "errors", "statemachine", "membership", "consensus", "security", "sim"},
    "daemon": {"errors", "statemachine", "membership", "consensus", "transport", "security", "channel",
               "clock", "address", "view", "ids", "procfs"},
    "trainer": {"channel", "address", "view", "procfs"},
    # the public API a user's training script imports (dpeer.job.connect)
    "job": {"trainer"},
    "launch": {"errors", "transport", "security"},
    # daemon: the chaos daemon entry builds a daemon with its fault wrapper around the transport
    "chaos": {"errors", "transport", "security", "launch", "daemon"},
    # trainer: only `dpeer export` (TRAINER_USERS), which imports it when it runs
    "cli": {"errors", "statemachine", "transport", "security", "channel", "daemon", "launch", "chaos",
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
