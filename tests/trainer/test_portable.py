"""Training state in and out of dpeer's format (dpeer/trainer/portable.py): a model trained a few
steps and checkpointed as the worker does, exported as safetensors and torch.save and loaded back
bit for bit; starting points from other tools' files; the errors for what does not fit."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpeer.trainer import portable
from dpeer.trainer import state as st


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def _trained(steps: int = 3, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _checkpointed(data_dir: Path, step: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer, str]:
    """A model trained `step` steps, checkpointed into DATA_DIR/checkpoints as the worker does."""
    model, opt = _trained(step)
    path, _ = st.write_checkpoint(str(data_dir / "checkpoints"), step, st.capture(model, opt, step=step).to_bytes())
    return model, opt, path


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(123)
    model = _model()
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def test_model_state_of_a_data_dir_is_its_newest_checkpoint(tmp_path: Path) -> None:
    model, opt, _ = _checkpointed(tmp_path, 3)
    st.write_checkpoint(str(tmp_path / "checkpoints"), 1, st.capture(_model(), opt, step=1).to_bytes())
    ckpt = portable.load_checkpoint(tmp_path)
    assert ckpt.step == 3 and ckpt.skipped == ()
    assert _same(portable.model_state(tmp_path), model.state_dict())
    assert _same(portable.model_state(ckpt.path), model.state_dict())
    assert ckpt.sha256 == hashlib.sha256(ckpt.path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt", "model.pth"])
def test_export_round_trips_bit_for_bit(tmp_path: Path, name: str) -> None:
    model, _, path = _checkpointed(tmp_path / "data")
    before = Path(path).read_bytes()
    out = tmp_path / name
    done = portable.export_model(tmp_path / "data", out)
    loaded = load_file(out) if name.endswith(".safetensors") else torch.load(out, weights_only=True)
    assert _same(loaded, model.state_dict())
    assert done.step == 3 and done.tensors == len(loaded) and done.size == out.stat().st_size
    assert done.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    assert Path(path).read_bytes() == before  # the input is never changed
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_safetensors_metadata_names_the_step_and_checkpoint(tmp_path: Path) -> None:
    from safetensors import safe_open

    _, _, path = _checkpointed(tmp_path)
    portable.export_model(path, tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["dpeer_step"] == "3"
    assert meta["dpeer_checkpoint_sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_export_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    _checkpointed(tmp_path)
    out = tmp_path / "m.pt"
    out.write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        portable.export_model(tmp_path, out)
    assert out.read_bytes() == b"keep me"
    portable.export_model(tmp_path, out, force=True)
    assert torch.load(out, weights_only=True).keys() == _model().state_dict().keys()


def test_export_format_from_suffix_or_given(tmp_path: Path) -> None:
    _checkpointed(tmp_path)
    with pytest.raises(ValueError, match="cannot tell the format"):
        portable.export_model(tmp_path, tmp_path / "m.bin")
    with pytest.raises(ValueError, match="unknown format"):
        portable.export_model(tmp_path, tmp_path / "m.pt", fmt="onnx")
    portable.export_model(tmp_path, tmp_path / "m.bin", fmt="safetensors")
    assert load_file(tmp_path / "m.bin").keys() == _model().state_dict().keys()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_export_as_dcp_holds_model_and_optimizer(tmp_path: Path) -> None:
    """No process group: torch.distributed.checkpoint saves in this one process."""
    import torch.distributed.checkpoint as dcp

    model, opt, _ = _checkpointed(tmp_path / "data")
    done = portable.export_model(tmp_path / "data", tmp_path / "resume", fmt="dcp")
    assert done.sha256 is None and (tmp_path / "resume" / ".metadata").is_file()
    fresh, fresh_opt = _fresh()
    target = {"model": fresh.state_dict()}
    dcp.load(target, checkpoint_id=str(tmp_path / "resume"))
    assert _same(fresh.state_dict(), model.state_dict())
    saved = opt.state_dict()["state"][0]["exp_avg"]
    into = {"optimizer": {"state": {0: {"exp_avg": torch.zeros_like(saved)}}}}
    dcp.load(into, checkpoint_id=str(tmp_path / "resume"))
    assert torch.equal(into["optimizer"]["state"][0]["exp_avg"], saved)


def test_a_torn_newest_checkpoint_is_skipped_and_said(tmp_path: Path) -> None:
    model, opt, _ = _checkpointed(tmp_path, 3)
    newer, _ = st.write_checkpoint(str(tmp_path / "checkpoints"), 5, st.capture(model, opt, step=5).to_bytes())
    raw = Path(newer).read_bytes()
    Path(newer).write_bytes(raw[: len(raw) // 2])
    ckpt = portable.load_checkpoint(tmp_path)
    assert ckpt.step == 3 and len(ckpt.skipped) == 1 and newer in ckpt.skipped[0]
    with pytest.raises(st.StateError, match="digest mismatch.*torn"):
        portable.model_state(newer)
    assert Path(newer).read_bytes() == raw[: len(raw) // 2]  # not deleted nor repaired


@pytest.mark.parametrize("content", [b"", b"hello, not a checkpoint", b"DPCK" + b"0" * 64 + b"xyz"])
def test_corrupt_or_foreign_files_are_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "ckpt-000000000001.bin"
    bad.write_bytes(content)
    with pytest.raises(st.StateError, match=str(bad)):
        portable.model_state(bad)
    with pytest.raises(st.StateError, match=f"none of the 1 checkpoints in {tmp_path}"):
        portable.model_state(tmp_path)


def test_a_dir_without_checkpoints_and_a_missing_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(st.StateError, match="holds no dpeer checkpoint"):
        portable.model_state(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        portable.model_state(tmp_path / "nope")


@pytest.mark.parametrize("wrap", [None, "state_dict", "model"])
def test_load_initial_from_torch_save(tmp_path: Path, wrap: str | None) -> None:
    model, opt = _trained()
    saved = model.state_dict() if wrap is None else {wrap: model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(saved, tmp_path / "start.pt")
    fresh, fresh_opt = _fresh()
    line = portable.load_initial(tmp_path / "start.pt", fresh, fresh_opt)
    assert _same(fresh.state_dict(), model.state_dict())
    digest = hashlib.sha256((tmp_path / "start.pt").read_bytes()).hexdigest()
    assert line.startswith("torch.save ") and digest[:12] in line and f"{len(model.state_dict())} tensors" in line
    assert ("model and optimizer" in line) == (wrap is not None)
    if wrap is not None:
        assert _same(fresh_opt.state_dict()["state"][1], opt.state_dict()["state"][1])


def test_load_initial_strips_a_ddp_module_prefix(tmp_path: Path) -> None:
    model, _ = _trained()
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "ddp.pt")
    fresh, _ = _fresh()
    portable.load_initial(tmp_path / "ddp.pt", fresh)
    assert _same(fresh.state_dict(), model.state_dict())


def test_load_initial_from_safetensors_and_dpeer_checkpoints(tmp_path: Path) -> None:
    model, opt, path = _checkpointed(tmp_path / "data")
    portable.export_model(path, tmp_path / "m.safetensors")
    for source, kind, took in ((tmp_path / "m.safetensors", "safetensors", "model only"),
                               (Path(path), "dpeer checkpoint (step 3)", "model and optimizer"),
                               (tmp_path / "data", "dpeer checkpoint (step 3)", "model and optimizer")):
        fresh, fresh_opt = _fresh()
        line = portable.load_initial(source, fresh, fresh_opt)
        assert line.startswith(kind) and line.endswith(took), line
        assert _same(fresh.state_dict(), model.state_dict())
    assert _same(fresh_opt.state_dict()["state"][0], opt.state_dict()["state"][0])


def test_a_model_from_dpeer_continues_like_the_original(tmp_path: Path) -> None:
    """Weights and optimizer state from a dpeer checkpoint: the next step is the original's, bit for bit."""
    model, opt, path = _checkpointed(tmp_path)
    fresh, fresh_opt = _fresh()
    portable.load_initial(path, fresh, fresh_opt)
    x = torch.randn(16, 4)
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    assert st.params_digest(fresh) == st.params_digest(model)


def test_missing_unexpected_and_mismatched_keys_are_listed(tmp_path: Path) -> None:
    state = _model().state_dict()
    state.pop("0.bias")
    state["extra.weight"] = torch.zeros(1)
    state["2.weight"] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "off.pt")
    fresh, _ = _fresh()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError) as err:
        portable.load_initial(tmp_path / "off.pt", fresh)
    text = str(err.value)
    assert str(tmp_path / "off.pt") in text and "missing keys 0.bias" in text
    assert "unexpected keys extra.weight" in text and "2.weight [3, 3] vs the model's [2, 8]" in text
    assert _same(fresh.state_dict(), before)  # nothing was loaded


def test_shape_mismatch_alone_is_refused(tmp_path: Path) -> None:
    other = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.BatchNorm1d(9), torch.nn.Linear(9, 2))
    torch.save(other.state_dict(), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match="shape mismatches 0.weight"):
        portable.load_initial(tmp_path / "wide.pt", _model())


class Payload:
    """A class a weights_only load must refuse to build."""

    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize("obj, expected", [
    ({"w": Payload()}, "cannot be loaded with torch.load\\(weights_only=True\\)"),
    ([1, 2, 3], "holds a list, not a state dict"),
    ({"epoch": 3}, "holds a dict, not a state dict"),
])
def test_a_pickle_that_is_no_state_dict_is_refused(tmp_path: Path, obj: object, expected: str) -> None:
    torch.save(obj, tmp_path / "x.pt", pickle_module=pickle)
    with pytest.raises(ValueError, match=expected):
        portable.load_initial(tmp_path / "x.pt", _model())


def test_corrupt_and_unknown_starting_points_are_refused(tmp_path: Path) -> None:
    _, _, path = _checkpointed(tmp_path / "data")
    portable.export_model(path, tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-7])
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        portable.load_initial(tmp_path / "cut.safetensors", _model())
    (tmp_path / "text.pt").write_text("weights, honest")
    with pytest.raises(ValueError, match="is not a torch.save file, a safetensors file nor a dpeer checkpoint"):
        portable.load_initial(tmp_path / "text.pt", _model())
    torn = Path(path).read_bytes()
    (tmp_path / "torn.bin").write_bytes(torn[:-3])
    with pytest.raises(st.StateError, match="digest mismatch"):
        portable.load_initial(tmp_path / "torn.bin", _model())


def test_a_dcp_folder_is_not_read_back(tmp_path: Path) -> None:
    """Its .metadata is a plain pickle: dpeer says how to convert it instead of unpickling it."""
    _checkpointed(tmp_path / "data")
    portable.export_model(tmp_path / "data", tmp_path / "resume", fmt="dcp")
    with pytest.raises(ValueError, match="dcp_to_torch_save"):
        portable.load_initial(tmp_path / "resume", _model())


def test_safetensors_refuses_what_it_cannot_hold() -> None:
    import io

    with pytest.raises(ValueError, match="'w' \\(torch.complex128\\).*export as .pt"):
        portable.write_safetensors({"w": torch.zeros(2, dtype=torch.complex128)}, io.BytesIO(), {})


def test_an_optimizer_that_does_not_fit_is_refused_before_the_model_changes(tmp_path: Path) -> None:
    _, _, path = _checkpointed(tmp_path)
    fresh, _ = _fresh()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    partial = torch.optim.Adam(list(fresh.parameters())[:2])
    with pytest.raises(ValueError, match="optimizer state does not fit the optimizer"):
        portable.load_initial(path, fresh, partial)
    assert _same(fresh.state_dict(), before)
