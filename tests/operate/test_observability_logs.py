"""The daemon's logs: `log_level` and `log_format` (json or text) from the config, the environment
or flags, refused with one sentence when wrong; a text record is one readable line; a worker's
exception reaches the log with its whole traceback (every frame's file and line), once, as one
record, and the worker's other stderr lines as records of the log's format."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from dpeer.daemon import config as cfg
from dpeer.daemon import logs
from dpeer.daemon.worker.job_log import JobLog
from dpeer.daemon.worker.output import StderrLines, StderrRecord, follow, spawn
from tests.operate import jobs
from tests.support.daemons import WAIT, Daemons, formed, wait_status, wait_until

REPO = Path(__file__).resolve().parents[2]
Setup = Callable[[logs.LogLevel, logs.LogFormat], io.StringIO]
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) dpeer[\w.]*: \S.*")


# -- config --------------------------------------------------------------------------------------

def test_log_keys_default_to_json_at_info_and_take_any_case() -> None:
    assert (cfg.load(environ={}).log_level, cfg.load(environ={}).log_format) == ("info", "json")
    loaded = cfg.load(environ={"DPEER_LOG_LEVEL": "WARNING", "DPEER_LOG_FORMAT": "Text"})
    assert (loaded.log_level, loaded.log_format) == ("warning", "text")
    assert cfg.load(flags={"log_level": "debug"}, environ={"DPEER_LOG_LEVEL": "error"}).log_level == "debug"


@pytest.mark.parametrize("where, value, expected", [
    ("file", {"log_level": "verbose"}, "config key log_level: Input should be 'debug', 'info', 'warning' or 'error'"),
    ("file", {"log_format": "xml"}, "config key log_format: Input should be 'json' or 'text'"),
    ("env", {"DPEER_LOG_LEVEL": "trace"}, "environment variable DPEER_LOG_LEVEL (config key log_level): Input "
     "should be 'debug', 'info', 'warning' or 'error'"),
    ("flags", {"log_format": "yaml"}, "flag --log-format (config key log_format): Input should be 'json' or 'text'"),
])
def test_a_bad_log_key_is_refused_naming_where_it_came_from(tmp_path: Path, where: str, value: dict[str, str],
                                                             expected: str) -> None:
    path = tmp_path / "dpeer.yaml"
    path.write_text(yaml.safe_dump(value if where == "file" else {}))
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(path, flags=value if where == "flags" else None, environ=value if where == "env" else {})
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


# -- formatters ----------------------------------------------------------------------------------

@pytest.fixture
def captured() -> Iterator[Callable[[logs.LogLevel, logs.LogFormat], io.StringIO]]:
    """Sets the dpeer logger up as the daemon does, writing into a buffer; restored afterwards."""
    root = logging.getLogger("dpeer")
    saved = (root.handlers[:], root.level, root.propagate)
    out = io.StringIO()

    def setup(level: logs.LogLevel, fmt: logs.LogFormat) -> io.StringIO:
        logs.setup(context, level, fmt)
        root.handlers[0].setStream(out)  # type: ignore[attr-defined]
        return out

    try:
        yield setup
    finally:
        root.handlers[:], root.level, root.propagate = saved


def context() -> dict[str, object]:
    return {"node": "n1", "term": 3, "generation": 2}


def test_text_format_is_one_readable_line_with_the_context_and_fields(captured: Setup) -> None:
    out = captured("info", "text")
    log = logging.getLogger("dpeer.daemon")
    log.info("joined as %s", "voter", extra=logs.fields(addr="127.0.0.1:7100", why="a reason with spaces"))
    log.warning("two\nlines")
    log.debug("not written at info")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert lines[0].split(" ", 1)[1] == ('INFO dpeer.daemon: joined as voter  node=n1 term=3 generation=2 '
                                         'addr=127.0.0.1:7100 why="a reason with spaces"')
    assert lines[1].endswith("WARNING dpeer.daemon: two\\nlines  node=n1 term=3 generation=2"), lines[1]


def raise_here() -> None:
    raise ValueError("the last line")


def test_an_exception_is_logged_whole_in_both_formats(captured: Setup) -> None:
    """It kept only the traceback's last line (`error`); the frames, file and line, were lost."""
    for fmt in ("json", "text"):
        out = captured("info", fmt)
        try:
            raise_here()
        except ValueError:
            logging.getLogger("dpeer.daemon").exception("it failed")
    json_line, text = out.getvalue().split("\n", 1)
    doc = json.loads(json_line)
    assert doc["error"] == "ValueError: the last line" and doc["msg"] == "it failed" and doc["term"] == 3
    assert doc["traceback"].startswith("Traceback (most recent call last):"), doc
    assert f'test_observability_logs.py", line {raise_here.__code__.co_firstlineno + 1}, in raise_here' \
        in doc["traceback"]
    head, *frames = text.rstrip("\n").splitlines()
    assert TEXT_LINE.match(head) and "it failed" in head and "error=" in head, head
    assert frames[0] == "    Traceback (most recent call last):" and frames[-1] == "    ValueError: the last line"
    assert any("in raise_here" in frame for frame in frames), frames


def test_the_level_filters_records(captured: Setup) -> None:
    out = captured("warning", "json")
    log = logging.getLogger("dpeer.worker")
    log.info("hidden")
    log.warning("shown")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["shown"]


# -- a worker's stderr ---------------------------------------------------------------------------

CHAINED = """Traceback (most recent call last):
  File "/srv/job.py", line 3, in f
    raise KeyError("a")
KeyError: 'a'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/job.py", line 8, in step
    raise ValueError("boom") from e
ValueError: boom"""

GROUP = """  + Exception Group Traceback (most recent call last):
  |   File "/srv/job.py", line 12, in h
  |     raise ExceptionGroup("eg", [ValueError(1), TypeError(2)])
  | ExceptionGroup: eg (2 sub-exceptions)
  +-+---------------- 1 ----------------
    | ValueError: 1
    +---------------- 2 ----------------
    | TypeError: 2
    +------------------------------------"""


def grouped(text: str, end: bool = True) -> list[StderrRecord]:
    lines = StderrLines()
    out = [record for line in text.split("\n") for record in lines.feed(line)]
    return out + lines.flush() if end else out


@pytest.mark.parametrize("text, expected", [
    ("plain\n\nanother", [StderrRecord("plain"), StderrRecord("another")]),
    (f"before\n{CHAINED}\nafter", [StderrRecord("before"), StderrRecord("ValueError: boom", CHAINED),
                                   StderrRecord("after")]),
    (f"{GROUP}\nafter", [StderrRecord("ExceptionGroup: eg (2 sub-exceptions)", GROUP), StderrRecord("after")]),
    (f"{CHAINED}\n{CHAINED}", [StderrRecord("ValueError: boom", CHAINED)] * 2),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>",  # cut short (killed)
     [StderrRecord('File "x.py", line 1, in <module>',
                   "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>")]),
    ("50%|#####     | 5/10\r100%|##########| 10/10", [StderrRecord("100%|##########| 10/10")]),
])
def test_stderr_lines_group_a_traceback_into_one_record(text: str, expected: list[StderrRecord]) -> None:
    assert grouped(text) == expected


def test_a_traceback_is_held_until_what_follows_shows_it_complete() -> None:
    """A chained exception's second traceback must join the first: the record waits for the next
    line, or for flush() (the reader calls it after a short silence, and at the end)."""
    lines = StderrLines()
    first, _, _ = CHAINED.partition("\n\nThe above")
    assert [r for line in first.split("\n") for r in lines.feed(line)] == [] and lines.holding
    assert lines.flush() == [StderrRecord("KeyError: 'a'", first)] and not lines.holding


class Records(logging.Handler):
    """Keeps the records it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def kept(name: str) -> Iterator[list[logging.LogRecord]]:
    handler, log = Records(), logging.getLogger(name)
    log.addHandler(handler)
    saved = log.level
    log.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        log.removeHandler(handler)
        log.setLevel(saved)


@pytest.fixture
def worker_records() -> Iterator[list[logging.LogRecord]]:
    yield from kept("dpeer.worker.stderr")


@pytest.fixture
def stdout_records() -> Iterator[list[logging.LogRecord]]:
    yield from kept("dpeer.job.stdout")


CRASH = """
import sys, time
print("building", file=sys.stderr, flush=True)
def step():
    raise RuntimeError("the job's own bug")
try:
    step()
except RuntimeError:
    import traceback; traceback.print_exc()
time.sleep(30)  # silent after the traceback, as a worker waiting for its next view
"""


def test_a_worker_traceback_is_logged_whole_once_even_while_the_worker_stays_silent(
        worker_records: list[logging.LogRecord]) -> None:
    proc = spawn([sys.executable, "-c", CRASH], {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: len(worker_records) >= 2, 30, "the worker's line and its traceback in the log")
    finally:
        proc.kill()
        proc.wait(timeout=10)
    line, trace = worker_records[:2]
    assert (line.levelno, line.getMessage(), line.fields) == (logging.INFO, "building", {"pid": proc.pid})
    assert trace.levelno == logging.ERROR
    assert trace.getMessage() == f"worker pid {proc.pid} traceback: RuntimeError: the job's own bug"
    text = trace.fields["traceback"]
    assert text.startswith("Traceback (most recent call last):") and text.endswith("RuntimeError: the job's own bug")
    assert 'File "<string>", line 7, in <module>' in text and 'File "<string>", line 5, in step' in text
    wait_until(lambda: proc.stderr is None or proc.stderr.closed, 10, "the reader to end at the pipe's end")
    assert len(worker_records) == 2, [r.getMessage() for r in worker_records]


def test_what_a_worker_writes_without_a_final_line_break_is_logged_at_its_end(
        worker_records: list[logging.LogRecord]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('no line break')"],
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    follow(proc.stderr, proc.pid)  # returns at the end of the stream
    proc.wait(timeout=10)
    assert [r.getMessage() for r in worker_records] == ["no line break"]


# -- a worker's stdout, and the job log ----------------------------------------------------------

PRINTS = r"""
import sys
print("epoch 1 loss 0.3127")
print()
sys.stdout.write("50%\r100%\n")
print("a warning of the job's", file=sys.stderr)
sys.stdout.write("no line break")
"""
JOB_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z pid=(\d+) (stdout|stderr|dpeer): (.*)$")


def job_lines(path: Path) -> list[tuple[int, str, str]]:
    """The job log's lines as (pid, stream, text), each checked against its format."""
    out = []
    for line in path.read_text().splitlines():
        match = JOB_LINE.match(line)
        assert match, line
        out.append((int(match[1]), match[2], match[3]))
    return out


def test_a_worker_stdout_becomes_records_and_job_log_lines_never_raw_on_the_daemons_stdout(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], stdout_records: list[logging.LogRecord],
        worker_records: list[logging.LogRecord]) -> None:
    """The worker's stdout was the daemon's: a job's print() landed raw amid the JSON log."""
    job_log = JobLog(tmp_path / "job.log")
    proc = spawn([sys.executable, "-c", PRINTS], {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}, job_log)
    proc.wait(timeout=30)
    wait_until(lambda: proc.stdout is not None and proc.stdout.closed and proc.stderr is not None
               and proc.stderr.closed, 10, "the readers to end at the pipes' end")
    assert [(r.levelno, r.getMessage(), r.fields) for r in stdout_records] == [
        (logging.INFO, text, {"pid": proc.pid}) for text in ("epoch 1 loss 0.3127", "100%", "no line break")]
    assert [r.getMessage() for r in worker_records] == ["a warning of the job's"]
    lines = job_lines(tmp_path / "job.log")
    assert {pid for pid, _, _ in lines} == {proc.pid}
    assert [text for _, stream, text in lines if stream == "stdout"] == ["epoch 1 loss 0.3127", "", "100%",
                                                                          "no line break"]
    assert [text for _, stream, text in lines if stream == "stderr"] == ["a warning of the job's"]
    assert (tmp_path / "job.log").stat().st_mode & 0o777 == 0o600
    assert capfd.readouterr().out == "", "the worker wrote to the daemon's own stdout"


def test_the_job_log_is_rotated_past_its_bound_keeping_one_older_file(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    job_log = JobLog(path, rotate_bytes=1000)
    for i in range(100):
        job_log.line(42, "stdout", f"line {i:03d} " + "x" * 40, when=0.0)
    job_log.close()
    older, line = path.with_name("job.log.1"), len("1970-01-01T00:00:00.000Z pid=42 stdout: line 000 \n") + 40
    assert path.stat().st_size <= 1000 and 1000 < older.stat().st_size <= 1000 + line
    assert not list(tmp_path.glob("job.log.2*"))
    texts = [text for p in (older, path) for _, _, text in job_lines(p)]
    assert len(texts) > 1000 // line and texts == [f"line {i:03d} " + "x" * 40 for i in range(100 - len(texts), 100)]
    JobLog(path, rotate_bytes=1000).line(42, "stdout", "after a restart", when=0.0)
    assert job_lines(path)[-1] == (42, "stdout", "after a restart") and len(job_lines(path)) > 1


def test_an_unwritable_job_log_is_warned_of_once_and_never_stops_the_readers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job_log = JobLog(tmp_path / "missing" / "job.log")
    for _ in range(3):
        job_log.line(42, "stdout", "lost")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"cannot write the job's output to {tmp_path / 'missing' / 'job.log'} (No such file or directory); "
        "it still reaches the daemon's log"]


# -- real daemons --------------------------------------------------------------------------------

def test_text_logs_and_the_level_from_config_and_environment(daemons: Daemons, tmp_path: Path) -> None:
    conf = tmp_path / "text.yaml"
    conf.write_text(yaml.safe_dump({"log_format": "text"}))
    n1 = daemons.start("n1", config=conf)
    n2 = daemons.start("n2", join=[n1.addr], env={"DPEER_LOG_LEVEL": "warning"})
    formed(n1.addr, {"n1", "n2"})
    wait_status(n2.addr, lambda d: d["leader"] == "n1" and "n2" in d["voters"] + d["learners"], "n2 joined")
    lines = wait_until(lambda: [ln for ln in n1.tail(400).splitlines() if ln.strip()] if "term=" in n1.tail(400)
                       else None, WAIT, "n1's text log to carry its term")
    assert all(TEXT_LINE.match(line) and "node=n1" in line for line in lines), lines
    assert any(" INFO dpeer" in line and "listening on" in line for line in lines), lines
    quiet = n2.log_lines()
    assert all(doc["level"] in ("warning", "error") for doc in quiet), quiet
    assert len(quiet) == len([ln for ln in n2.tail(400).splitlines() if ln.strip()]), "every line of n2 is JSON"


def test_a_job_raising_in_a_step_logs_its_traceback_with_file_and_line_once_per_failure(
        daemons: Daemons, tmp_path: Path) -> None:
    """It logged only "ValueError: boom ..." (the worker dropped the traceback), so the job's
    author saw no file or line; a build's traceback came as raw lines amid the JSON."""
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "tests.operate.jobs:fails_at_step",
                                    "training": {"steps": 60, "checkpoint_every": 0, "failure_repeats": 2}}))
    node = daemons.start("n1", config=conf, env={"PYTHONPATH": str(REPO)})
    wait_status(node.addr, lambda d: (d.get("job") or {}).get("state") == "failed", "the job halted",
                timeout=2 * WAIT)
    raw = [line for line in node.tail(10_000).splitlines() if line.strip()]
    docs = node.log_lines()
    assert len(docs) == len(raw), [line for line in raw if not line.startswith("{")]
    raise_line = next(i for i, text in enumerate(Path(jobs.__file__).read_text().splitlines(), 1)
                      if 'raise ValueError("boom' in text)
    traces = [d for d in docs if "traceback" in d]
    failures = [d for d in docs if d["msg"].startswith("the job failed at step 3")]
    assert len(traces) == len(failures) == 2, ([d["msg"] for d in traces], [d["msg"] for d in failures])
    for doc in traces:
        assert doc["level"] == "error" and doc["msg"].endswith("ValueError: boom: the loss has no value for step 3")
        assert f'jobs.py", line {raise_line}, in failing_loss' in doc["traceback"], doc["traceback"]
        assert doc["traceback"].count("Traceback (most recent call last):") == 1
    assert not [d for d in docs if 'File "' in d["msg"]], "a frame logged as a record of its own"


def test_a_printing_job_logs_its_stdout_as_records_and_in_its_job_log_and_its_traceback_once(
        daemons: Daemons, tmp_path: Path) -> None:
    """A job's print() went raw to the daemon's stdout, amid the JSON lines of its log (the journal
    under systemd, the one log file here); a user had nowhere to `tail -f` their script's output."""
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "tests.operate.jobs:prints_and_fails_at_step",
                                    "training": {"steps": 60, "checkpoint_every": 0, "failure_repeats": 2}}))
    node = daemons.start("n1", config=conf, env={"PYTHONPATH": str(REPO)})
    doc = wait_status(node.addr, lambda d: (d.get("job") or {}).get("state") == "failed", "the job halted",
                      timeout=2 * WAIT)
    path = node.data_dir / "worker" / "job.log"
    assert doc["worker"]["job_log"] == str(path)
    raw = [line for line in node.tail(10_000).splitlines() if line.strip()]
    docs = node.log_lines()
    assert len(docs) == len(raw), [line for line in raw if not line.startswith("{")]
    printed = [d for d in docs if d["logger"] == "dpeer.job.stdout"]
    assert printed and all(d["level"] == "info" and d["node"] == "n1" and type(d["pid"]) is int for d in printed)
    assert sum(d["msg"] == "building the printing job on n1" for d in printed) == 1, [d["msg"] for d in printed]
    assert any(d["msg"] == "taking the loss of step 3" for d in printed)
    assert not [d for d in printed if not d["msg"].strip()]
    traces = [d for d in docs if "traceback" in d]
    assert len(traces) == 2 and all(d["traceback"].count("Traceback (most recent call last):") == 1 for d in traces)
    lines = job_lines(path)
    assert {pid for pid, _, _ in lines} == {d["pid"] for d in printed}
    stdout = [text for _, stream, text in lines if stream == "stdout"]
    assert stdout.count("building the printing job on n1") == 1 and "" in stdout and "taking the loss of step 3" in stdout
    stderr = [text for _, stream, text in lines if stream == "stderr"]
    assert stderr.count("Traceback (most recent call last):") == 2
    assert any('jobs.py", line' in text and "in failing_loss" in text for text in stderr)
    marks = [text for _, stream, text in lines if stream == "dpeer"]  # the halt stopped the worker
    assert len(marks) == 2 and marks[0] == "worker started for job tests.operate.jobs:prints_and_fails_at_step"
    assert marks[1].startswith("worker stopped by the daemon (exit code "), marks
