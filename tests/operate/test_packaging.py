"""Packaging as a user and an operator meet it: dependency ranges in pyproject.toml with CI's exact
versions in constraints.txt, the wheel and sdist built and run from a fresh venv outside the checkout,
the offline bundle installed with no index, and scripts/install.sh's flags and early certificate
check (its steps are functions: sourced here with the side effects replaced, never run for real)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import typing
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from dpeer.daemon.config import PresetName

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
INSTALL = REPO / "scripts" / "install.sh"
PROTO = REPO / "dpeer" / "proto" / "v1"
# What a wheel that runs the demo must hold: the CLI, the generated wire code, the demo job.
NEEDED = ("dpeer/cli/main.py", "dpeer/proto/v1/dpeer_pb2.py", "dpeer/proto/v1/dpeer_pb2_grpc.py",
          "dpeer/trainer/demo.py", "dpeer/trainer/worker.py")


def pinned(requirements: list[str]) -> list[str]:
    """The requirements held to one exact version (== or ===, not a wildcard like ==2.*)."""
    return [r for r in requirements
            if any(s.operator == "===" or (s.operator == "==" and not s.version.endswith("*"))
                   for s in Requirement(r).specifier)]


def floor(requirement: str) -> Version | None:
    """The version a >= specifier names, None when the requirement has no floor."""
    return next((Version(s.version) for s in Requirement(requirement).specifier if s.operator == ">="), None)


def constraints() -> dict[str, Version]:
    """constraints.txt as {normalized name: exact version}."""
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[norm(name)] = Version(version)
    return out


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime() -> dict[str, Requirement]:
    return {norm(Requirement(r).name): Requirement(r) for r in PYPROJECT["project"]["dependencies"]}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment with nothing pointing into the checkout or the test venv (no PYTHONPATH)."""
    drop = ("DPEER_", "PYTHON", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


# --- dependency ranges ------------------------------------------------------------------------------

def test_no_runtime_dependency_is_pinned_to_one_version_and_each_has_a_floor() -> None:
    deps = PYPROJECT["project"]["dependencies"]
    assert not pinned(deps), f"runtime dependencies pinned to one version (use a range): {pinned(deps)}"
    assert [d for d in deps if floor(d) is None] == [], "every runtime dependency names its lowest version"


def test_the_pin_check_catches_a_pin() -> None:
    """The check above can fail: the pins pyproject.toml had are caught, ranges and wildcards are not."""
    assert pinned(["torch==2.13.0", "grpcio===1.85.3", "rich>=10.7", "pydantic~=2.0", "lmdb==1.*"]) == \
        ["torch==2.13.0", "grpcio===1.85.3"]


def test_the_generated_code_sets_the_grpc_and_protobuf_floors() -> None:
    """dpeer_pb2.py checks the protobuf runtime against its gencode version, dpeer_pb2_grpc.py refuses
    a grpcio older than the grpcio-tools that made it: those versions are the floors, and the dev
    extra's generator is that very grpcio-tools (the freshness check compares bytes)."""
    gencode = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),"
                        r"\s*(\d+),", (PROTO / "dpeer_pb2.py").read_text())
    assert gencode, "dpeer_pb2.py has no runtime version check"
    grpc_made = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", (PROTO / "dpeer_pb2_grpc.py").read_text())
    assert grpc_made
    deps = runtime()
    assert floor(str(deps["protobuf"])) == Version(".".join(gencode.groups()))
    assert floor(str(deps["grpcio"])) == Version(grpc_made.group(1))
    assert "grpcio-tools" not in deps, "only scripts/gen_proto.py uses grpcio-tools: the dev extra"
    assert PYPROJECT["project"]["optional-dependencies"]["dev"] == [f"grpcio-tools=={grpc_made.group(1)}"]


def test_constraints_pin_every_dependency_within_its_range() -> None:
    """CI installs constraints.txt's versions: each requirement of the package and of its test and dev
    extras has one there, inside pyproject's range, so CI tests versions a user may get."""
    pins = constraints()
    extras = PYPROJECT["project"]["optional-dependencies"]
    for text in [*PYPROJECT["project"]["dependencies"], *extras["test"], *extras["dev"]]:
        req = Requirement(text)
        assert norm(req.name) in pins, f"constraints.txt has no version for {req.name}"
        assert req.specifier.contains(pins[norm(req.name)], prereleases=True), \
            f"constraints.txt's {req.name}=={pins[norm(req.name)]} is outside pyproject's {req}"
    assert pins["torch"].local is None, "torch is pinned without +cpu, so the CUDA build matches too"


# --- the wheel and the bundle -----------------------------------------------------------------------

# Build outputs a checkout collects (.gitignore): a stale dpeer.egg-info/SOURCES.txt would put files
# into the sdist that the package config forgets, so the build starts from a copy without them.
BUILD_LEFTOVERS = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
                   "runs", ".whl")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`python -m build` on a clean copy of the source: the sdist, then the wheel built from it."""
    src, out = tmp_path_factory.mktemp("src") / "dpeer", tmp_path_factory.mktemp("dist")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS), symlinks=True)
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                            capture_output=True, text=True, timeout=600, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheels, sdists = list(out.glob("dpeer-*.whl")), list(out.glob("dpeer-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_the_wheel_and_sdist_hold_the_generated_code_and_the_demo_job(dist: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    assert [n for n in NEEDED if n not in names] == []
    with tarfile.open(dist["sdist"]) as sdist:
        inside = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert [n for n in NEEDED if n not in inside] == []


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_demo(dist: dict[str, Path], tmp_path: Path) -> None:
    """scripts/setup installs the wheel (not editable; torch from the same source as for .venv) into a
    fresh venv; from a directory outside the checkout, with no PYTHONPATH, the demo trains to the end."""
    venv = tmp_path / "venv"
    env = clean_env(DPEER_FROM=str(dist["wheel"]), DPEER_VENV=str(venv), DPEER_TORCH_BUILD="cpu")
    setup = subprocess.run([str(REPO / "scripts" / "setup")], cwd=tmp_path, capture_output=True, text=True,
                           timeout=900, env=env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import dpeer; print(dpeer.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_env())
    assert where.stdout.startswith(str(venv / "lib")), f"dpeer imported from {where.stdout or where.stderr}"
    demo = subprocess.run([str(venv / "bin" / "dpeer"), "demo", "--steps", "200", "--dir", str(tmp_path / "run")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, env=clean_env())
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "training finished: every replica holds step 200 with digest" in demo.stdout


def test_the_bundle_installs_with_no_index_and_runs_a_demo(dist: dict[str, Path], tmp_path: Path) -> None:
    """scripts/bundle (no torch) holds every other wheel: with torch already in a fresh venv (from the
    source scripts/setup uses), the bundle's own scripts/setup installs dpeer with --no-index and pip
    reading no config (no other index or wheel directory); `dpeer version` and the demo run from it."""
    bundle, venv = tmp_path / "bundle", tmp_path / "venv"
    with_pip = clean_env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # python3: this venv's, with pip
    made = subprocess.run([str(REPO / "scripts" / "bundle"), "--wheel", str(dist["wheel"]), str(bundle)],
                          capture_output=True, text=True, timeout=600, env=with_pip)
    assert made.returncode == 0, made.stderr[-3000:]
    assert not list(bundle.glob("torch-*.whl")) and (bundle / dist["wheel"].name).is_file()
    for part in ("scripts/setup", "scripts/install.sh", "scripts/dpeer.service", "constraints.txt", "README.md"):
        assert (bundle / part).is_file(), f"the bundle lacks {part}"
    torch = ('. "$1/scripts/torch_build.sh"; torch_source cpu "$(torch_pinned_version "$1")"; '
             'python3 -m venv "$2" && '
             '"$2/bin/python" -m pip install --quiet --retries 1 "${torch_index[@]}" "$torch_req"')
    made_venv = subprocess.run(["bash", "-c", torch, "bash", str(REPO), str(venv)], capture_output=True, text=True,
                               timeout=900, env=clean_env())
    assert made_venv.returncode == 0, made_venv.stderr[-3000:]
    offline = {k: v for k, v in clean_env(DPEER_FROM=str(bundle), DPEER_VENV=str(venv)).items()
               if not k.startswith("PIP_")}
    setup = subprocess.run([str(bundle / "scripts" / "setup")], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600, env={**offline, "PIP_CONFIG_FILE": os.devnull})
    assert setup.returncode == 0, setup.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "dpeer"), "version"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=clean_env())
    assert version.returncode == 0 and version.stdout.startswith("dpeer "), version.stdout + version.stderr
    demo = subprocess.run([str(venv / "bin" / "dpeer"), "demo", "--steps", "200", "--dir", str(tmp_path / "run")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, env=clean_env())
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "training finished: every replica holds step 200 with digest" in demo.stdout


def test_bundle_and_setup_refuse_bad_input_in_one_sentence(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.whl").write_text("")
    cases = {
        "not empty": ([str(REPO / "scripts" / "bundle"), str(full)], 1),
        "--torch takes cpu or cuda": ([str(REPO / "scripts" / "bundle"), "--torch", "rocm", str(tmp_path / "b")], 2),
        "is not a dpeer wheel file": ([str(REPO / "scripts" / "bundle"), "--wheel", str(full / "old.whl"),
                                       str(tmp_path / "b")], 2),
        "unknown option": ([str(REPO / "scripts" / "bundle"), "--offline", str(tmp_path / "b")], 2),
    }
    for expected, (cmd, code) in cases.items():
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env())
        assert result.returncode == code and expected in result.stderr.splitlines()[0], (cmd, result.stderr)
    assert not (tmp_path / "b").exists()
    setup = subprocess.run([str(REPO / "scripts" / "setup")], capture_output=True, text=True, timeout=60,
                           env=clean_env(DPEER_FROM=str(full), DPEER_VENV=str(tmp_path / "venv")))
    assert setup.returncode == 1 and "is not a dpeer wheel, a checkout or a bundle" in setup.stderr, setup.stderr
    assert not (tmp_path / "venv").exists(), "nothing is made for a bad DPEER_FROM"


# --- scripts/install.sh (sourced: its steps run as functions, the system-changing ones replaced) -----

def sourced(script: str, *args: str, install: Path = INSTALL,
            path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run bash SCRIPT after sourcing install.sh (which then defines its steps without running main);
    PATH, when given, replaces the commands bash finds."""
    env = clean_env() if path is None else clean_env(PATH=path)
    return subprocess.run([shutil.which("bash") or "/bin/bash", "-c", f'source "{install}"; {script}', "install.sh",
                           *args], capture_output=True, text=True, timeout=60, env=env)


def test_install_takes_the_preset_metrics_address_job_and_source_as_flags(tmp_path: Path) -> None:
    wheel = tmp_path / "dpeer-0.1.0-py3-none-any.whl"
    wheel.write_text("")
    shown = 'parse_args "$@"; echo "$job|$preset|$metrics|$from|$node_id|$listen|$join"'
    result = sourced(shown, "--preset", "edge", "--metrics-listen", "10.0.0.1:7190", "--job", "demo", "--from",
                     str(wheel), "n2", "10.0.0.2:7100", "10.0.0.1:7100")
    assert result.stdout.strip() == f"demo|edge|10.0.0.1:7190|{wheel}|n2|10.0.0.2:7100|10.0.0.1:7100", result.stderr
    assert sourced(shown, "n1", "[::1]:7100").stdout.strip() == "||||n1|[::1]:7100|"
    plane = sourced('parse_args "$@"; echo "$data_plane"', "--insecure-data-plane", "--job", "demo", "n1", "h:7100")
    assert plane.stdout.strip() == "insecure", plane.stderr
    scripts = [sourced('parse_args "$@"; echo "$job"', "--job", job, "n1", "h:7100").stdout.strip()
               for job in ("jobs/train.py", "/opt/dpeer/jobs/train.py", "myjob:build")]
    assert scripts == [f"{Path.cwd()}/jobs/train.py", "/opt/dpeer/jobs/train.py", "myjob:build"], scripts


def test_install_refuses_a_bad_flag_with_one_sentence_and_its_usage(tmp_path: Path) -> None:
    cases = {
        "--preset takes lan, wan or edge, not 'fast'": ["--preset", "fast", "n1", "h:7100"],
        "--metrics-listen takes HOST:PORT": ["--metrics-listen", "9100", "n1", "h:7100"],
        "unknown option --prest": ["--prest", "wan", "n1", "h:7100"],
        "node ids are 1-64 letters": ["../etc", "h:7100"],
        "is neither a dpeer wheel": ["--from", str(tmp_path), "n1", "h:7100"],
    }
    for expected, args in cases.items():
        result = sourced('parse_args "$@"', *args)
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and expected in lines[0] and lines[1].startswith("usage:"), (args, result.stderr)


def test_install_presets_are_the_configs() -> None:
    """install.sh checks --preset before installing anything; its list is the config's."""
    accepted = [p for p in ("lan", "wan", "edge", "fast", "LAN") if sourced('parse_args "$@"', "--preset", p, "n1",
                                                                           "h:1").returncode == 0]
    assert accepted == list(typing.get_args(PresetName))


def certs_case(tmp_path: Path, files: list[str], join: str) -> subprocess.CompletedProcess[str]:
    certs = tmp_path / "certs"
    certs.mkdir(exist_ok=True)
    for name in files:
        (certs / name).write_text("")
    return sourced(f'certs="{certs}"; parse_args "$@"; check_certs', "n2", "10.0.0.2:7100", *([join] if join else []))


@pytest.mark.parametrize(("files", "join", "code", "said"), [
    ([], "10.0.0.1:7100", 2, "dpeer certs create-node n2 --host 10.0.0.2"),
    (["node-n2.pem", "ca.pem", "cluster.token"], "10.0.0.1:7100", 2, "node-n2.key missing"),
    (["node-n2.pem", "node-n2.key", "ca.pem", "cluster.token"], "10.0.0.1:7100", 0, ""),
    ([], "", 0, ""),  # the first box: it makes the CA once dpeer is installed
    (["ca.key", "ca.pem"], "", 2, "cluster.token missing"),
    (["ca.key", "ca.pem", "cluster.token"], "10.0.0.1:7100", 0, ""),  # the CA's box makes its node certificate
], ids=["joining-bare", "joining-no-key", "joining-ready", "first-box", "ca-box-no-token", "ca-box"])
def test_install_checks_the_certificates_it_will_need(tmp_path: Path, files: list[str], join: str, code: int,
                                                      said: str) -> None:
    result = certs_case(tmp_path, files, join)
    assert result.returncode == code and said in result.stderr, result.stderr


def test_install_stops_at_missing_certificates_before_installing_anything(tmp_path: Path) -> None:
    """main runs the certificate check before the user, the venv and torch: a joining box without its
    certificates installs nothing; with them it goes on to install. Every step that changes the system
    is replaced by a marker, and PATH holds only dirname and basename, so nothing else can run."""
    steps = "check_prerequisites make_user install_package write_env make_certs write_config check_config start_service"
    stubs = "".join(f'{s}() {{ echo {s} >> "{tmp_path}/ran"; }}; ' for s in steps.split())
    certs, bin_dir = tmp_path / "certs", tmp_path / "bin"
    certs.mkdir()
    bin_dir.mkdir()
    for tool in ("dirname", "basename"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    run = f'{stubs} certs="{certs}"; main "$@"'
    refused = sourced(run, "n2", "10.0.0.2:7100", "10.0.0.1:7100", path=str(bin_dir))
    assert refused.returncode == 2 and "node-n2.pem is missing" in refused.stderr, refused.stderr
    assert (tmp_path / "ran").read_text().split() == ["check_prerequisites"]
    for name in ("node-n2.pem", "node-n2.key", "ca.pem", "cluster.token"):
        (certs / name).write_text("")
    (tmp_path / "ran").unlink()
    went_on = sourced(run, "n2", "10.0.0.2:7100", "10.0.0.1:7100", path=str(bin_dir))
    assert went_on.returncode == 0, went_on.stderr
    assert (tmp_path / "ran").read_text().split() == steps.split()


def test_install_from_a_bundle_takes_the_bundle_by_default(tmp_path: Path) -> None:
    """install.sh inside a bundle installs from that bundle; from a checkout, from the checkout."""
    bundle = tmp_path / "bundle"
    (bundle / "scripts").mkdir(parents=True)
    (bundle / "dpeer-0.1.0-py3-none-any.whl").write_text("")
    (bundle / "scripts" / "install.sh").write_text(INSTALL.read_text())
    assert sourced('parse_args n1 h:1; package_source', install=bundle / "scripts" / "install.sh").stdout.strip() \
        == str(bundle)
    assert sourced('parse_args n1 h:1; package_source').stdout.strip() == str(REPO)
