"""The container image (deploy/container, built by scripts/container with no registry): a Debian rootfs
from Debian's packages and a bundle become an image whose configuration is a service's; the 200-step
demo trains inside it; `dpeer start` under its entrypoint passes its health check, and a SIGTERM to
tini (PID 1, what `podman stop` signals) reaches the daemon, which commits its leave and exits 0.
Images live in a storage of the test's own, removed at the end. `buildah run --isolation chroot`
plays the runtime (podman cannot start containers on every test box); it shares the host's network
and process ids, so the test finds tini's pid and the node's port from outside. Skips, saying why,
where the image cannot be built: no buildah or mmdebstrap, not root, or no Debian mirror."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.daemons import cli
from tests.support.trainer_cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]
MIRROR = "http://deb.debian.org/debian/dists/bookworm/InRelease"
TAG = "localhost/dpeer-test:cpu"
UID = 10001
# The first test that builds the image pays for it (2 to 5 minutes on a busy 2-core box).
pytestmark = pytest.mark.timeout(1800)


def unbuildable() -> str | None:
    """Why the image cannot be built on this machine, or None."""
    for tool, package in (("buildah", "buildah"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install -y {package})"
    if os.geteuid() != 0:
        return "building the image needs root (buildah's storage, mmdebstrap's chroot)"
    try:
        urllib.request.urlopen(urllib.request.Request(MIRROR, method="HEAD"), timeout=15).close()
    except OSError as exc:
        return f"the Debian mirror is unreachable ({MIRROR}: {exc}); mmdebstrap needs it for the rootfs"
    return None


class Buildah:
    """buildah on a storage of its own (CONTAINERS_STORAGE_CONF), so nothing touches the box's images."""

    def __init__(self, top: Path) -> None:
        conf = top / "storage.conf"
        conf.write_text(f'[storage]\ngraphroot = "{top / "graph"}"\nrunroot = "{top / "run"}"\n')
        # This machine's pip reaches only its configured indexes: no retries against the unreachable
        # extra index scripts/bundle names for torch's CPU build (the wheel comes from the local one).
        self.env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "BUILDAH_ISOLATION": "chroot",
                    "PIP_RETRIES": "0"}

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["buildah", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.env, start_new_session=True)


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Buildah]:
    reason = unbuildable()
    if reason is not None:
        pytest.skip(reason)
    top = tmp_path_factory.mktemp("containers")
    made = Buildah(top)
    yield made
    made("rm", "--all")
    made("rmi", "--all", "--force")
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def image(buildah: Buildah) -> dict[str, Any]:
    """scripts/container builds the cpu image (rootfs, bundle, image); its Docker config is returned."""
    started = time.monotonic()
    built = subprocess.run([str(ROOT / "scripts" / "container"), "--tag", TAG], capture_output=True, text=True,
                           timeout=1500, env=buildah.env)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    print(f"scripts/container built {TAG} in {time.monotonic() - started:.0f}s")
    inspected = buildah("inspect", "--type", "image", TAG)
    assert inspected.returncode == 0, inspected.stderr
    config: dict[str, Any] = json.loads(inspected.stdout)["Docker"]["config"]
    return config


@pytest.fixture
def container(buildah: Buildah, image: dict[str, Any]) -> Iterator[str]:
    made = buildah("from", "--quiet", TAG)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    yield name
    buildah("rm", name)


def run_in(buildah: Buildah, name: str, command: list[str], env: dict[str, str] | None = None,
           volumes: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`buildah run` of command in the container, with env and volumes (HOST:CONTAINER[:OPTIONS])."""
    return buildah("run", *flags(env or {}, volumes), name, "--", *command, timeout=timeout)


def flags(env: dict[str, str], volumes: tuple[str, ...]) -> list[str]:
    """`buildah run`'s options for env and volumes, with the chroot isolation the test box allows."""
    return ["--isolation", "chroot", *(f"--env={k}={v}" for k, v in env.items()), *(f"--volume={v}" for v in volumes)]


def test_the_image_runs_dpeer_start_under_tini_as_dpeer_with_a_volume_and_a_health_check(
        buildah: Buildah, image: dict[str, Any], container: str) -> None:
    assert image["Entrypoint"] == ["/usr/bin/tini", "--", "dpeer-entrypoint"] and image["Cmd"] == ["start"]
    assert image["User"] == "dpeer" and image["StopSignal"] == "SIGTERM"
    assert list(image["Volumes"]) == ["/var/lib/dpeer"]
    assert image["Healthcheck"]["Test"] == ["CMD", "dpeer-entrypoint", "health"]
    assert image["Labels"]["io.dpeer.torch"] == "cpu"
    seen = run_in(buildah, container, ["sh", "-c", "id -u; stat -c '%u %a' /var/lib/dpeer; dpeer version; "
                                       "python -c 'import torch; print(torch.__version__)'"])
    assert seen.returncode == 0, seen.stdout + seen.stderr
    uid, data_dir, version, torch = seen.stdout.splitlines()
    assert (uid, data_dir) == (str(UID), f"{UID} 700") and version.startswith("dpeer ") and torch.endswith("+cpu")


def test_the_demo_trains_200_steps_inside_the_image(buildah: Buildah, image: dict[str, Any], container: str) -> None:
    started = time.monotonic()
    demo = run_in(buildah, container, [*image["Entrypoint"], "demo", "--steps", "200"], timeout=900)
    print(f"the demo ran {time.monotonic() - started:.0f}s in the image")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "training finished: every replica holds step 200 with digest" in demo.stdout


def processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (its parent's pid, its command line), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            found[int(entry.name)] = (parent, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except (ValueError, OSError):
            continue
    return found


def under(pid: int, table: dict[int, tuple[int, str]]) -> dict[int, tuple[int, str]]:
    """The processes descended from pid."""
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, line) in table.items():
            if ppid == parent:
                found[child] = (ppid, line)
                todo.append(child)
    return found


@pytest.fixture
def node_certs(tmp_path: Path) -> Path:
    """A CA, token and node certificate for c1, owned by the image's dpeer user (keys 0600)."""
    pki = tmp_path / "certs"
    for args in (["create-ca"], ["create-node", "c1", "--host", "127.0.0.1"]):
        made = cli("certs", *args, "--dir", str(pki))
        assert made.returncode == 0, made.stderr
    for path in (pki, *pki.iterdir()):
        os.chown(path, UID, UID)
    return pki


def test_start_is_healthy_and_sigterm_to_tini_is_a_graceful_leave(buildah: Buildah, image: dict[str, Any],
                                                                 container: str, node_certs: Path) -> None:
    """The image's own command (`start`), with mutual TLS from a mounted certs directory, on a loopback
    port: the health check (the node's own certificate as a client) passes once the node answers;
    SIGTERM to tini reaches `dpeer start`, tini's child, which commits its leave and exits 0, and so
    does tini; then the health check fails."""
    port = free_ports(1)[0]
    certs = "/etc/dpeer/certs"
    env = {"DPEER_NODE_ID": "c1", "DPEER_LISTEN": f"127.0.0.1:{port}", "DPEER_SECURITY__TLS_CA": f"{certs}/ca.pem",
           "DPEER_SECURITY__TLS_CERT": f"{certs}/node-c1.pem", "DPEER_SECURITY__TLS_KEY": f"{certs}/node-c1.key",
           "DPEER_SECURITY__CLUSTER_TOKEN_FILE": f"{certs}/cluster.token"}
    volumes = (f"{node_certs}:{certs}:ro",)
    health = image["Healthcheck"]["Test"][1:]
    node = buildah.popen("run", *flags(env, volumes), container, "--", *image["Entrypoint"], *image["Cmd"])
    try:
        deadline, checked = time.monotonic() + 180, run_in(buildah, container, health, env, volumes)
        while checked.returncode != 0 and node.poll() is None and time.monotonic() < deadline:
            checked = run_in(buildah, container, health, env, volumes)  # each check takes a second or two
        assert checked.returncode == 0, checked.stdout + checked.stderr
        tree = under(node.pid, processes())
        tini = [pid for pid, (_, line) in tree.items() if line == "/usr/bin/tini -- dpeer-entrypoint start"]
        assert len(tini) == 1, tree
        assert [line for _, (ppid, line) in tree.items() if ppid == tini[0]] == \
            ["/opt/dpeer/venv/bin/python /opt/dpeer/venv/bin/dpeer start --config /etc/dpeer/dpeer.yaml"]
        os.kill(tini[0], signal.SIGTERM)
        out, _ = node.communicate(timeout=60)
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
    assert node.returncode == 0, out[-3000:]
    assert "security mtls+token" in out, out[-3000:]
    assert "received SIGTERM: leaving the cluster" in out and "stopped; store closed" in out, out[-3000:]
    assert "could not commit the leave" not in out, out[-3000:]
    assert run_in(buildah, container, health, env, volumes).returncode == 3, "the node is gone"


# --- what needs no buildah: the health check's address, the bundle check, scripts/container's usage --

def health(config: Path) -> subprocess.CompletedProcess[str]:
    """The entrypoint's health check on this box, with this venv's dpeer and the config file given."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DPEER_CONFIG": str(config)}
    return subprocess.run([str(ROOT / "deploy" / "container" / "entrypoint"), "health"], capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in env.items() if not k.startswith("DPEER_")
                                                      or k == "DPEER_CONFIG"})


def test_the_health_check_dials_the_listen_address_a_wildcard_as_loopback(tmp_path: Path) -> None:
    """A node listening on every interface is checked on loopback (nothing listens here: exit 3, naming
    the address dialled); a config that cannot load fails the check with its own error, exit 2."""
    port = free_ports(1)[0]
    config = tmp_path / "dpeer.yaml"
    for listen, dialled in ((f"0.0.0.0:{port}", f"127.0.0.1:{port}"), (f"[::]:{port}", f"[::1]:{port}"),
                            (f"127.0.0.2:{port}", f"127.0.0.2:{port}")):
        config.write_text(f"listen: '{listen}'\nadvertise: 10.0.0.1:{port}\n")
        checked = health(config)
        assert checked.returncode == 3 and dialled in checked.stderr, (listen, checked.stderr)
    config.write_text("listen: nowhere\n")
    checked = health(config)
    assert checked.returncode == 2 and "listen" in checked.stderr, checked.stderr

WHEELS = {"dpeer": "dpeer-0.1.0-py3-none-any.whl", "cpu": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
          "cuda": "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"}


@pytest.mark.parametrize(("held", "torch", "code", "said"), [
    (["dpeer", "cpu"], "cpu", 0, ""),
    (["dpeer", "cuda"], "cuda", 0, ""),
    (["dpeer", "cpu"], "cuda", 1, "is torch's cpu build, not cuda: make one with scripts/bundle --torch cuda"),
    (["dpeer", "cuda"], "cpu", 1, "is torch's cuda build, not cpu: make one with scripts/bundle --torch cpu"),
    (["dpeer"], "cpu", 1, "holds no torch wheel"),
    (["dpeer", "cpu", "cuda"], "cpu", 1, "holds more than one torch wheel"),
    (["cpu"], "cpu", 1, "holds no dpeer-*.whl, so it is no bundle"),
    (["dpeer", "cpu"], "rocm", 1, "TORCH is cpu or cuda, not 'rocm'"),
], ids=["cpu", "cuda", "cpu-bundle-for-cuda", "cuda-bundle-for-cpu", "no-torch", "two-torches", "no-dpeer", "rocm"])
def test_the_bundle_must_hold_the_variants_torch(tmp_path: Path, held: list[str], torch: str, code: int,
                                                 said: str) -> None:
    """deploy/container/install --check (scripts/container runs it before building, the image's build
    again): one sentence saying what to make instead."""
    for key in held:
        (tmp_path / WHEELS[key]).write_text("")
    checked = subprocess.run([str(ROOT / "deploy" / "container" / "install"), "--check", str(tmp_path), torch],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == code and said in checked.stderr and len(checked.stderr.splitlines()) <= 1, \
        checked.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--torch", "rocm"], "--torch takes cpu or cuda, not 'rocm'"),
    (["--bundle", "/nonexistent/bundle"], "--bundle /nonexistent/bundle is not a directory"),
    (["--save", "dpeer.tar"], "unknown argument --save"),
    (["--tag"], "--tag needs a value"),
])
def test_container_refuses_bad_usage_in_one_sentence_and_its_usage(args: list[str], said: str) -> None:
    result = subprocess.run([str(ROOT / "scripts" / "container"), *args], capture_output=True, text=True, timeout=30)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and said in lines[0] and lines[1].startswith("usage:"), result.stderr
