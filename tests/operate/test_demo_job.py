"""Jobs of the user's own (issue 36): `job: PATH.py` and `--job PATH.py` beside demo and
MODULE:FUNCTION in the config and on `dpeer start`, and `dpeer demo --job JOB` training any of
them on the demo's local cluster.

The config and flag tests are unit-level. One demo run trains a MODULE:FUNCTION job from a
module in the working directory (the demo puts it on its daemons' PYTHONPATH); the script job's
run waits for the worker to accept a `.py` job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpeer.cli.demo import checked_job, daemon_env, job_label
from dpeer.cli.demo_screen import Frame, headline
from dpeer.cli.parser import UsageError, build_parser
from dpeer.daemon import config as cfg
from dpeer.daemon.job_name import job_refusal
from tests.support.daemons import cli_many, one_sentence

REPO = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT = 120.0

TINY_JOB = '''"""A tiny TrainSpec job: seeded blobs, a linear classifier."""
import torch

from dpeer.trainer.job_api import JobContext, TrainSpec


def build(ctx: JobContext) -> TrainSpec:
    torch.manual_seed(ctx.seed)
    model = torch.nn.Linear(8, 2)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(256, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, (x.sum(dim=1) > 0).long())
    return TrainSpec(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=ctx.lr), dataset=data,
                     loss_fn=torch.nn.CrossEntropyLoss(), loss_reduction="mean", global_batch=ctx.global_batch,
                     micro_batch=ctx.micro_batch, steps=ctx.steps, seed=ctx.seed)
'''

SCRIPT_JOB = '''import torch, dpeer.job as dj
run = dj.connect()                     # this box's place in the run; raises outside a dpeer worker
torch.manual_seed(run.seed)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=run.lr)
run.register(model=model, optimizer=opt)
data = torch.utils.data.TensorDataset(torch.randn(512, 8, generator=torch.Generator().manual_seed(run.seed)), torch.randint(0, 2, (512,), generator=torch.Generator().manual_seed(1)))
loader = torch.utils.data.DataLoader(data, batch_size=run.micro_batch, num_workers=0)
for step in run.steps(loader):
    with step:
        for x, y in step.micro_batches():
            step.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
run.finish()
'''


def user_env() -> dict[str, str]:
    """The environment a user's shell gives `dpeer`: no DPEER_* keys, and this checkout on
    PYTHONPATH (the venv's editable install may point at another one) in place of the module's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    return {**env, "PYTHONPATH": str(REPO)}


def demo(tmp_path: Path, job: str, *more: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`dpeer demo --job JOB --nodes 2 --steps 20 --json` run from cwd (default tmp_path)."""
    cmd = [sys.executable, "-m", "dpeer.cli.main", "demo", "--job", job, "--nodes", "2", "--steps", "20", "--json",
           "--dir", str(tmp_path / "cluster"), *more]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=DEMO_TIMEOUT, env=user_env(),
                          cwd=cwd or tmp_path)


def assert_trained_to_the_end(result: subprocess.CompletedProcess, job: str) -> None:
    """The --json run ended with exit 0, step 20 and a digest every replica holds, naming its job."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[0]["type"] == "start" and records[0]["job"] == job and records[0]["steps"] == 20, records[0]
    end = records[-1]
    assert end["type"] == "end" and end["exit_code"] == 0 and end["ok"] is True and end["step"] == 20, end
    assert re.fullmatch(r"[0-9a-f]{64}", end["digest"]) and end["digest"][:12] in end["verdict"], end
    for node in ("n1", "n2"):
        assert (Path(records[0]["dir"]) / node / "worker" / "final.pt").exists(), f"{node} did not finish"


# --- the config and the flags -----------------------------------------------------------------


def test_a_script_path_is_made_absolute_against_the_working_directory_as_data_dir_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("print('hi')\n")
    conf = tmp_path / "dpeer.yaml"
    conf.write_text("job: jobs/train.py\ndata_dir: state\n")
    monkeypatch.chdir(tmp_path)
    from_file = cfg.load(conf, environ={})
    from_flag = cfg.load(None, {"job": "jobs/train.py"}, environ={})
    from_env = cfg.load(None, environ={"DPEER_JOB": "./jobs/train.py"})
    assert from_file.job == from_flag.job == str(tmp_path / "jobs" / "train.py")
    assert from_env.job == str(tmp_path / "jobs" / "train.py")
    assert from_file.data_dir == tmp_path / "state"
    assert cfg.load(None, {"job": str(tmp_path / "jobs" / "train.py")}, environ={}).job == from_flag.job


def test_demo_and_module_jobs_are_unchanged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for job in ("demo", "myjob:build", "pkg.sub.mod:make_spec"):
        assert cfg.load(None, {"job": job}, environ={}).job == job
    assert cfg.load(None, {}, environ={}).job is None


def test_a_script_that_cannot_run_is_one_sentence_naming_the_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.py").mkdir()
    cases = {
        "gone.py": f"flag --job (config key job): job script {tmp_path / 'gone.py'} does not exist",
        "folder.py": f"flag --job (config key job): job script {tmp_path / 'folder.py'} is not a regular file",
        "train.sh": "flag --job (config key job): job is 'demo', MODULE:FUNCTION or the path of a Python script "
                    "ending in .py, not 'train.sh'",
        "no-colon": "not 'no-colon'",
    }
    for job, message in cases.items():
        with pytest.raises(cfg.ConfigError) as refused:
            cfg.load(None, {"job": job}, environ={})
        assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    conf = tmp_path / "dpeer.yaml"
    conf.write_text("job: gone.py\n")
    with pytest.raises(cfg.ConfigError, match=rf"{conf}: config key job: job script .*gone.py does not exist"):
        cfg.load(conf, environ={})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_script_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "secret.py"
    script.write_text("")
    script.chmod(0)
    with pytest.raises(cfg.ConfigError, match="is not readable by this user"):
        cfg.load(None, {"job": str(script)}, environ={})


def test_job_refusal_reads_a_script_as_a_script_not_as_a_module(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert job_refusal(str(script)) is None
    assert job_refusal(str(tmp_path / "gone.py")) == f"job script {tmp_path / 'gone.py'} does not exist"
    assert "no module 'no_such_module_anywhere'" in (job_refusal("no_such_module_anywhere:build") or "")


def test_config_check_reports_a_missing_script_as_a_missing_module_and_passes_a_present_one(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    files = {"present": f"job: {script}\n", "missing": f"job: {tmp_path / 'gone.py'}\n",
             "module": "job: no_such_module_anywhere:build\n"}
    for name, body in files.items():
        (tmp_path / f"{name}.yaml").write_text(body)
    present, missing, module = cli_many([["config", "check", str(tmp_path / f"{n}.yaml")] for n in files])
    assert present.returncode == 0, present.stderr
    assert missing.returncode == module.returncode == 2, (missing.stderr, module.stderr)
    assert f"config key job: job script {tmp_path / 'gone.py'} does not exist" in one_sentence(missing.stderr)
    assert "no module 'no_such_module_anywhere'" in one_sentence(module.stderr)


# --- dpeer demo --job -------------------------------------------------------------------------


def test_demo_job_flag_defaults_to_the_demo_and_is_in_the_help() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).job == "demo"
    assert parser.parse_args(["demo", "--job", "train.py"]).job == "train.py"
    start_help = parser._subparsers._group_actions[0].choices["start"].format_help()  # type: ignore[union-attr]
    assert "PATH.py" in start_help and "MODULE:FUNCTION" in start_help


def test_demo_checks_the_job_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    assert checked_job("train.py") == str(tmp_path / "train.py")
    assert checked_job("demo") == "demo"
    with pytest.raises(UsageError, match=r"^--job: job script .*gone.py does not exist$"):
        checked_job("gone.py")
    with pytest.raises(UsageError, match=r"^--job: job no_such_module_anywhere:build: no module"):
        checked_job("no_such_module_anywhere:build")
    with pytest.raises(UsageError, match=r"^--job: job is 'demo', MODULE:FUNCTION or"):
        checked_job("train.sh")


def test_a_refused_demo_job_exits_2_in_one_sentence_and_starts_no_cluster(tmp_path: Path) -> None:
    jobs = ["gone.py", "no_such_module_anywhere:build", "train.sh"]
    results = cli_many([["demo", "--job", job, "--dir", str(tmp_path / f"d{i}")] for i, job in enumerate(jobs)])
    for i, (job, result) in enumerate(zip(jobs, results)):
        assert result.returncode == 2 and one_sentence(result.stderr).startswith("dpeer: --job: "), (job, result.stderr)
        assert result.stdout == "" and not (tmp_path / f"d{i}").exists(), job


def test_the_demo_puts_the_working_directory_first_on_its_daemons_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/dpeer/jobs")
    assert daemon_env("/home/me/work") == {"PYTHONPATH": f"/home/me/work{os.pathsep}/opt/dpeer/jobs"}
    monkeypatch.delenv("PYTHONPATH")
    assert daemon_env("/home/me/work") == {"PYTHONPATH": "/home/me/work"}


def test_the_headline_names_the_job() -> None:
    assert job_label("/home/me/work/train.py") == "train.py" and job_label("myjob:build") == "myjob:build"
    line = headline(Frame(1.0, {"n1": None}, 20, 0.0, [], [], job_label("/home/me/work/train.py")))
    assert line.startswith("dpeer demo ") and "job train.py  leader" in line, line
    assert "job demo  " in headline(Frame(1.0, {"n1": None}, 20, 0.0, [], []))


def test_demo_trains_a_module_job_found_in_the_working_directory(tmp_path: Path) -> None:
    """The module lies in the folder `dpeer demo` runs from, which is not otherwise on its
    PYTHONPATH: the demo puts it there for its daemons and their workers."""
    (tmp_path / "tinyjob.py").write_text(TINY_JOB)
    assert_trained_to_the_end(demo(tmp_path, "tinyjob:build"), "tinyjob:build")


def test_demo_trains_a_script_job(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT_JOB)
    assert_trained_to_the_end(demo(tmp_path, "train.py"), str(tmp_path / "train.py"))
