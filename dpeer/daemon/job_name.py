"""What a `job` names, and whether it can run from here.

A job is the bundled `demo`, `MODULE:FUNCTION` (a build function returning a TrainSpec, which
the worker imports) or `PATH.py` (the user's own training script, which the worker runs as
`__main__`). The config's `job` key, `dpeer start --job`, `dpeer config check` and `dpeer demo
--job` all check it here, so each accepts and refuses the same names in the same words.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

FORMS = "'demo', MODULE:FUNCTION or the path of a Python script ending in .py"
_MODULE_FUNCTION = re.compile(r"^[\w.]+:\w+$")


def is_script(job: str) -> bool:
    """True for a script path: it ends in .py, which no MODULE:FUNCTION does (a function's name
    has no dot)."""
    return job.endswith(".py")


def resolve(job: str) -> str:
    """The job as the worker gets it: `demo` and MODULE:FUNCTION unchanged, a script as its
    absolute path (a relative one against the working directory, as data_dir and the security
    files are), so the daemon's worker finds it wherever it runs. ValueError, in one sentence,
    for a name of no form or a script that cannot be read."""
    if job == "demo" or _MODULE_FUNCTION.match(job):
        return job
    if not is_script(job):
        raise ValueError(f"job is {FORMS}, not {job!r}")
    path = Path(job).absolute()
    problem = script_problem(path)
    if problem is not None:
        raise ValueError(problem)
    return str(path)


def script_problem(path: Path) -> str | None:
    """Why the worker could not run this script, or None: it must be a regular file this user can read."""
    if not path.exists():
        return f"job script {path} does not exist"
    if not path.is_file():
        return f"job script {path} is not a regular file"
    if not os.access(path, os.R_OK):
        return f"job script {path} is not readable by this user"
    return None


def module_found(module: str) -> bool:
    """Whether `module` imports from here as the worker would see it: the working directory,
    PYTHONPATH and this Python's packages."""
    old, sys.path[:] = list(sys.path), [os.getcwd(), *sys.path]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = old


def job_refusal(job: str | None) -> str | None:
    """Why the job cannot start from here, or None: a script that is gone or unreadable, or a
    MODULE:FUNCTION whose module is not on this Python's path (the function is checked at build)."""
    if job is None or job == "demo":
        return None
    if is_script(job):
        return script_problem(Path(job).absolute())
    module = job.partition(":")[0]
    if module_found(module):
        return None
    return (f"job {job}: no module {module!r} on this Python's path (the working directory, PYTHONPATH, the "
            "venv's packages): install it into dpeer's venv or put its folder on PYTHONPATH (the service reads "
            "/etc/dpeer/dpeer.env), outside /home, which the unit hides")
