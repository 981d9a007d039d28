"""A short soak (scripts/soak.py, as an operator runs it): two daemons train the demo job past
step 4500 with a checkpoint every 20 steps while kv pairs are written; every data dir stays under
its stated bound the whole time (the ledger folded, the reports rotated past 512 KiB and pruned),
and the folded ledgers audit clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4500


def test_a_data_dir_stays_under_its_bound_while_steps_and_kv_writes_go_on(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--steps", str(STEPS), "--nodes", "2",
                          "--checkpoint-every", "20", "--kv-per-s", "10", "--every", "5", "--dir", str(tmp_path),
                          "--json", str(out)], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["within"] and not result["audit_problems"] and result["kv_puts"] > 0
    last = result["rows"][-1]["nodes"]
    assert min(n["step"] for n in last.values()) >= STEPS
    for node_id, n in last.items():
        reports = tmp_path / "cluster" / node_id / "worker" / "reports"
        sealed = [p.name for p in reports.iterdir() if p.name != f"{node_id}.jsonl"]
        assert len(sealed) == 1, f"{node_id}'s reports: {sealed} (rotated once at least, the newest read one kept)"
        assert n["sizes"]["ledger"] < 64 * 1024, n  # unfolded, 4500 steps of a global batch of 64 take about 2 MB
