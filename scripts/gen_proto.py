"""Generate dpeer/proto/v1 from proto/dpeer/v1/*.proto; with --check, fail when the checked-in code is stale."""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "proto" / "dpeer" / "v1"
OUT = ROOT / "dpeer" / "proto" / "v1"
GENERATED = ("dpeer_pb2.py", "dpeer_pb2.pyi", "dpeer_pb2_grpc.py")


def generate(into: Path) -> None:
    """Run protoc so generated modules import each other as dpeer.proto.v1.*."""
    into.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-Idpeer/proto/v1={SRC}",
        f"-I{include}",
        f"--python_out={into}",
        f"--pyi_out={into}",
        f"--grpc_python_out={into}",
        *[f"dpeer/proto/v1/{p.name}" for p in sorted(SRC.glob("*.proto"))],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed: see the messages above")


def main() -> int:
    """Generate, or with --check compare a fresh generation against the checked-in files."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when the generated code is stale")
    args = parser.parse_args()
    if not args.check:
        generate(ROOT)
        (OUT / "__init__.py").touch()
        print(f"generated {', '.join(GENERATED)} in {OUT.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [n for n in GENERATED if not (OUT / n).exists() or not filecmp.cmp(Path(tmp) / "dpeer/proto/v1" / n, OUT / n, shallow=False)]
    if stale:
        print(f"generated code is stale: {', '.join(stale)}; run python scripts/gen_proto.py", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
