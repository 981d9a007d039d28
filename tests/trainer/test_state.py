import os
import random

import pytest
import torch

from dpeer.trainer import state as st


def _make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    return model, opt, sched, scaler


def _train(model, opt, sched, n):
    for _ in range(n):
        x = torch.randn(16, 4)
        loss = model(x).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_round_trip_restores_everything_and_continues_identically():
    model, opt, sched, scaler = _make(0)
    _train(model, opt, sched, 3)
    random.seed(5)
    blob = st.capture(model, opt, sched, scaler, step=3, cursor=48)
    data = blob.to_bytes()
    digest = st.params_digest(model)
    _train(model, opt, sched, 2)
    expected = st.params_digest(model)
    after = random.random()

    model2, opt2, sched2, scaler2 = _make(1)
    assert st.params_digest(model2) != digest
    torch.manual_seed(99)
    step, cursor = st.restore(st.StateBlob.from_bytes(data), model2, opt2, sched2, scaler2)
    assert (step, cursor) == (3, 48)
    assert st.params_digest(model2) == digest
    assert sched2.last_epoch == 3
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9)
    assert scaler2.get_scale() == 128.0
    _train(model2, opt2, sched2, 2)
    assert st.params_digest(model2) == expected
    assert random.random() == after


def test_numpy_rng_travels_with_the_state_when_the_job_loaded_numpy():
    """dpeer never imports numpy itself; a job that uses it gets its RNG state restored."""
    np = pytest.importorskip("numpy", reason="numpy is not a dpeer dependency; this venv lacks it")
    model, opt, sched, scaler = _make(0)
    np.random.seed(6)
    data = st.capture(model, opt, sched, scaler, step=1).to_bytes()
    after = float(np.random.rand())
    np.random.seed(7)
    st.restore(st.StateBlob.from_bytes(data), model, opt, sched, scaler)
    assert float(np.random.rand()) == after


def test_the_state_round_trips_without_numpy_loaded():
    """In a process where numpy was never imported (a venv without it), capture and restore work
    and the digest is computed from the raw bytes."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from dpeer.trainer import state as st\n"
        "sys.modules['numpy'] = None\n"  # any import of numpy now fails, as in a venv without it
        "m = torch.nn.Linear(3, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "b = st.StateBlob.from_bytes(st.capture(m, o, step=2).to_bytes())\n"
        "d = st.params_digest(m); st.restore(b, m, o)\n"
        "assert st.params_digest(m) == d and b.step == 2\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_restore_into_fresh_optimizer_without_state():
    model, opt, sched, _ = _make(0)
    _train(model, opt, sched, 1)
    blob = st.capture(model, opt, step=1)
    model2, opt2, _, _ = _make(3)
    st.restore(st.StateBlob.from_parts(blob.header_bytes(), blob.payload.clone()), model2, opt2)
    assert st.params_digest(model2) == st.params_digest(model)
    assert len(opt2.state) == len(opt.state)


def test_corrupt_payload_detected():
    model, opt, _, _ = _make(0)
    data = bytearray(st.capture(model, opt).to_bytes())
    data[-1] ^= 0xFF
    with pytest.raises(st.StateError):
        st.StateBlob.from_bytes(bytes(data))
    with pytest.raises(st.StateError):
        st.StateBlob.from_bytes(b"XXXX" + bytes(data[4:]))


def test_params_digest_is_sensitive_to_values():
    model, _, _, _ = _make(0)
    d = st.params_digest(model)
    assert d == st.params_digest(model) and len(d) == 64
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-6
    assert st.params_digest(model) != d


def test_checkpoint_atomic_write_and_verify(tmp_path):
    d = str(tmp_path)
    path, digest = st.write_checkpoint(d, 5, b"hello state")
    assert st.read_checkpoint(path, digest) == b"hello state"
    st.write_checkpoint(d, 9, b"newer")
    with open(os.path.join(d, ".ckpt-000000000012.bin.123.tmp"), "wb") as f:
        f.write(b"DPCK torn")
    assert st.load_latest_checkpoint(d) == (9, b"newer")
    assert [s for s, _ in st.list_checkpoints(d)] == [9, 5]
    with pytest.raises(st.StateError):
        st.read_checkpoint(path, "0" * 64)


def test_corrupt_newest_checkpoint_falls_back(tmp_path):
    d = str(tmp_path)
    st.write_checkpoint(d, 1, b"one")
    path, _ = st.write_checkpoint(d, 2, b"two")
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"X")
    with pytest.raises(st.StateError):
        st.read_checkpoint(path)
    assert st.load_latest_checkpoint(d) == (1, b"one")
    st.prune_checkpoints(d, keep=1)
    assert [s for s, _ in st.list_checkpoints(d)] == [2]
    assert st.load_latest_checkpoint(str(tmp_path / "missing")) is None


def test_amp_scaler_state_round_trips():
    model, opt, sched, scaler = _make(0)
    scaler.scale(model(torch.randn(8, 4)).pow(2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    blob = st.capture(model, opt, sched, scaler, step=1)
    _, opt2, sched2, _ = _make(1)
    scaler2 = torch.amp.GradScaler("cpu")
    st.restore(st.StateBlob.from_bytes(blob.to_bytes()), model, opt2, sched2, scaler2)
    assert scaler2.get_scale() == 128.0
    assert scaler2.state_dict() == scaler.state_dict()


def test_pruning_keeps_the_committed_checkpoint(tmp_path):
    d = str(tmp_path)
    for step in (10, 20, 30, 40, 50):
        st.write_checkpoint(d, step, b"state %d" % step)
    st.prune_checkpoints(d, 2, protect=20)
    assert [s for s, _ in st.list_checkpoints(d)] == [50, 40, 20]
    st.prune_checkpoints(d, 2)
    assert [s for s, _ in st.list_checkpoints(d)] == [50, 40]


def test_pruning_removes_the_temp_files_of_writers_that_died_mid_write(tmp_path):
    """A worker killed while it wrote a checkpoint leaves a temp file as big as one; a live writer's stays."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    d = str(tmp_path)
    st.write_checkpoint(d, 10, b"state")
    (tmp_path / f".ckpt-000000000020.bin.{dead.pid}.tmp").write_bytes(b"torn")
    (tmp_path / f".ckpt-000000000030.bin.{os.getpid()}.tmp").write_bytes(b"being written")
    st.prune_checkpoints(d, 2)
    assert sorted(os.listdir(d)) == [f".ckpt-000000000030.bin.{os.getpid()}.tmp", "ckpt-000000000010.bin"]
