"""docs/jobs.md "Port your own script" against examples/porting: the page shows the two files as
they are and the diff between them as it is; before.py trains with plain python, and after.py
trains on a two-box `dpeer demo`."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.examples.test_examples import REPO, demo_env

GUIDE = REPO / "docs" / "jobs.md"
BEFORE, AFTER = REPO / "examples" / "porting" / "before.py", REPO / "examples" / "porting" / "after.py"


def section() -> str:
    """The guide's "Port your own script" section."""
    text = GUIDE.read_text()
    start = text.index("## Port your own script\n")
    return text[start:text.index("\n## ", start + 1)]


def blocks(kind: str) -> list[str]:
    """The section's fenced code blocks of one kind, in order."""
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def the_diff() -> str:
    """The unified diff from before.py to after.py, without context lines."""
    lines = difflib.unified_diff(BEFORE.read_text().splitlines(), AFTER.read_text().splitlines(), "before.py",
                                 "after.py", n=0, lineterm="")
    return "".join(line + "\n" for line in lines)


def test_the_guide_shows_both_files_as_they_are() -> None:
    assert blocks("python") == [BEFORE.read_text(), AFTER.read_text()]


def test_the_guide_shows_the_whole_diff_between_them() -> None:
    assert blocks("diff") == [the_diff()]


def test_every_dpeer_call_in_the_diff_is_explained_line_by_line() -> None:
    explained = section().split("Line by line:", 1)[1]
    for call in ("dj.connect()", "torch.manual_seed(run.seed)", "run.register(", "batch_size=run.micro_batch",
                 "run.steps(loader", "with step:", "step.micro_batches()", "step.backward(loss)", "run.is_writer",
                 "run.finish()", "opt.zero_grad()", "torch.save"):
        assert call in the_diff() and call in explained, call


def test_before_trains_with_plain_python(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(BEFORE)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 80: loss" in result.stdout and (tmp_path / "model.pt").exists()


def test_after_refuses_plain_python_in_one_sentence(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(AFTER)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env=demo_env())
    assert result.returncode != 0 and "runs inside a worker that dpeer starts" in result.stderr, result.stderr[-2000:]


def test_after_trains_on_a_two_box_demo(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "dpeer.cli.main", "demo", "--job", str(AFTER), "--nodes", "2", "--steps", "40",
           "--json", "--dir", str(tmp_path / "cluster")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=demo_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    end = json.loads(result.stdout.splitlines()[-1])
    assert end["type"] == "end" and end["ok"] and end["step"] == 40, end
    logs = "".join((tmp_path / "cluster" / f"n{i}.log").read_text() for i in (1, 2))
    assert "step 20: loss" in logs  # the writer printed
