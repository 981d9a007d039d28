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
from dpeer.daemon.worker_stderr import StderrLines, StderrRecord, follow, spawn
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


@pytest.fixture
def worker_records() -> Iterator[list[logging.LogRecord]]:
    handler, log = Records(), logging.getLogger("dpeer.worker.stderr")
    log.addHandler(handler)
    saved = log.level
    log.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        log.removeHandler(handler)
        log.setLevel(saved)


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
