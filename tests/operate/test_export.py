"""`dpeer export` as an operator runs it: a data dir's model out as safetensors and torch.save,
loaded by a fresh Python that never imports dpeer and giving the original model's outputs bit for
bit; what it prints (text and --json); and its refusals, each one sentence with its exit code."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dpeer.trainer import state as st

from tests.support.daemons import cli, cli_many, one_sentence

# The model and input the fresh interpreter rebuilds from torch alone (no dpeer, no test code).
MODEL = "torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))"
INPUT = "torch.linspace(-2.0, 2.0, 12).reshape(3, 4)"

OUTSIDER = textwrap.dedent(f"""
    import json, sys
    import torch
    from safetensors.torch import load_file

    outputs = {{}}
    for path in sys.argv[1:]:
        state = load_file(path) if path.endswith(".safetensors") else torch.load(path, weights_only=True)
        model = {MODEL}
        model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            outputs[path] = model({INPUT}).tolist()
    assert "dpeer" not in sys.modules, "the exported files must load without dpeer"
    print(json.dumps(outputs))
""")


def _data_dir(root: Path) -> tuple[Path, torch.nn.Module]:
    """A data dir whose job checkpointed steps 2 and 4 (as the worker does); the model at step 4."""
    torch.manual_seed(0)
    model = eval(MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = root / "data"
    for step in range(1, 5):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
        if step % 2 == 0:
            st.write_checkpoint(str(data / "checkpoints"), step, st.capture(model, opt, step=step).to_bytes())
    return data, model


def _outputs(model: torch.nn.Module) -> list:
    model.eval()
    with torch.no_grad():
        return model(eval(INPUT)).tolist()


def test_exported_files_load_without_dpeer_and_give_the_same_outputs(tmp_path: Path) -> None:
    data, model = _data_dir(tmp_path)
    outs = [tmp_path / "model.safetensors", tmp_path / "model.pt"]
    results = cli_many([["export", str(data), "--out", str(out), "--json"] for out in outs])
    for out, result in zip(outs, results):
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["step"] == 4 and doc["out"] == str(out) and doc["skipped"] == []
        assert doc["format"] == out.suffix[1:] and doc["tensors"] == len(model.state_dict())
        assert doc["bytes"] == out.stat().st_size and doc["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
        assert doc["checkpoint"].endswith("ckpt-000000000004.bin")
    pure = tmp_path / "pure"
    pure.mkdir()
    (pure / "outsider.py").write_text(OUTSIDER)
    run = subprocess.run([sys.executable, "-I", str(pure / "outsider.py"), *map(str, outs)], cwd=pure,
                         env={"PYTHONPATH": str(pure)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    expected = _outputs(model)
    assert json.loads(run.stdout) == {str(out): expected for out in outs}


def test_text_output_and_a_torn_newest_checkpoint(tmp_path: Path) -> None:
    data, _ = _data_dir(tmp_path)
    newest = data / "checkpoints" / "ckpt-000000000004.bin"
    newest.write_bytes(newest.read_bytes()[:100])
    out = tmp_path / "m.pt"
    result = cli("export", str(data), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {out} (pt): step 2 from ") and "ckpt-000000000002.bin" in result.stdout
    assert hashlib.sha256(out.read_bytes()).hexdigest() in result.stdout
    assert "skipped" in result.stderr and str(newest) in result.stderr
    assert len(newest.read_bytes()) == 100  # the torn file is left as it was


def test_dcp_export(tmp_path: Path) -> None:
    data, _ = _data_dir(tmp_path)
    result = cli("export", str(data), "--out", str(tmp_path / "resume"), "--format", "dcp", "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "dcp" and doc["sha256"] is None and (tmp_path / "resume" / ".metadata").is_file()


@pytest.mark.parametrize("case", ["exists", "missing", "suffix", "corrupt"])
def test_refusals_are_one_sentence_with_exit_2(tmp_path: Path, case: str) -> None:
    data, _ = _data_dir(tmp_path)
    out = tmp_path / "m.safetensors"
    args = {"exists": [str(data), "--out", str(out)], "missing": [str(tmp_path / "nope"), "--out", str(out)],
            "suffix": [str(data), "--out", str(tmp_path / "m.onnx")],
            "corrupt": [str(data / "checkpoints" / "ckpt-000000000002.bin"), "--out", str(out)]}[case]
    expected = {"exists": "--force", "missing": "does not exist", "suffix": "cannot tell the format",
                "corrupt": "digest mismatch"}[case]
    if case == "exists":
        out.write_bytes(b"keep")
    if case == "corrupt":
        path = data / "checkpoints" / "ckpt-000000000002.bin"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    text, as_json = cli_many([["export", *args], ["export", *args, "--json"]])
    assert text.returncode == 2 and expected in one_sentence(text.stderr), text.stderr
    assert as_json.returncode == 2 and json.loads(as_json.stderr) == {"error": one_sentence(text.stderr)[7:],
                                                                      "exit_code": 2}
    if case == "exists":
        assert out.read_bytes() == b"keep"
        forced = cli("export", *args, "--force")
        assert forced.returncode == 0 and out.read_bytes() != b"keep", forced.stderr
