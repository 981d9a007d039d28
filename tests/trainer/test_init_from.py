"""A run that starts from a file (training.init_from -> the worker's --init-from): the built job's
model holds the file's weights before any step, and a file that does not fit is a build failure."""

from __future__ import annotations

import pytest
import torch

from dpeer.channel.local import DirViewSource, read_reports
from dpeer.trainer import state as st
from dpeer.trainer import worker
from dpeer.trainer.demo import build
from dpeer.trainer.loop import JobContext
from dpeer.trainer.portable import load_initial
from dpeer.trainer.script import InitialOptimizers, Named

OPTS = ["--job-opt", "dataset_len=256", "--job-opt", "global_batch=8", "--job-opt", "micro_batch=4"]


def _args(tmp_path, init: str) -> object:
    return worker.parse_args(["--node-id", "a", "--views", f"dir:{tmp_path / 'views'}", "--job", "demo",
                              "--init-from", init, *OPTS])


def test_the_built_model_starts_from_the_file(tmp_path) -> None:
    model = build(JobContext("a", torch.device("cpu"), {"dataset_len": "256"})).model
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.25)
    torch.save(model.state_dict(), tmp_path / "start.pt")
    args = _args(tmp_path, str(tmp_path / "start.pt"))
    trainer, spec = worker._build(args, DirViewSource(str(tmp_path / "views"), "a"), 0.0)
    trainer.group.close()
    assert all(bool((p == 0.25).all()) for p in spec.model.parameters())


def test_a_file_for_another_model_is_a_build_failure(tmp_path) -> None:
    torch.save({"other.weight": torch.zeros(3)}, tmp_path / "wrong.pt")
    code = worker.main(["--node-id", "a", "--views", f"dir:{tmp_path}", "--job", "demo",
                        "--init-from", str(tmp_path / "wrong.pt"), *OPTS])
    assert code == worker.EXIT_BUILD_FAILED
    errors = [x["error"] for x in read_reports(str(tmp_path), "a") if x["kind"] == "job_error"]
    assert len(errors) == 1 and "wrong.pt" in errors[0], errors


def test_a_script_jobs_own_checkpoint_starts_the_same_script_with_its_optimizer(tmp_path) -> None:
    """A finished script run's data dir as training.init_from: its optimizers are saved by name."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    st.write_checkpoint(str(tmp_path / "checkpoints"), 5, st.capture(model, Named({"optimizer": opt}), step=5).to_bytes())
    fresh = torch.nn.Linear(4, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    said = load_initial(str(tmp_path / "checkpoints"), fresh, InitialOptimizers({"optimizer": fresh_opt}))
    assert "model and optimizer" in said, said
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    plain = torch.optim.Adam(torch.nn.Linear(4, 2).parameters())
    one = InitialOptimizers({"adam": plain})
    one.load_state_dict(opt.state_dict())  # a plain script's optimizer state fits the only one
    with pytest.raises(ValueError, match="the script registered"):
        InitialOptimizers({"a": plain, "b": fresh_opt}).load_state_dict(opt.state_dict())
