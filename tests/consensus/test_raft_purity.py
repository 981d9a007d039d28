"""The consensus core stays pure: importing it loads no I/O, clock or framework modules."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("asyncio", "grpc", "lmdb", "torch", "time")


def test_the_core_imports_no_io_clock_or_framework_module() -> None:
    code = (
        "import sys\n"
        f"before = {{m for m in {FORBIDDEN!r} if m in sys.modules}}\n"
        "import dpeer.consensus, dpeer.consensus.sim_adapter\n"
        f"print(sorted({{m for m in {FORBIDDEN!r} if m in sys.modules}} - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
