"""A handler that raises (issue #24, item 2): the task fails at once with the exception's
type, message and traceback, which the submitter, ``meshant task`` and the forager's log
all show; retrying on exceptions is opt-in, per handler and per submission."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from meshant import Forager
from meshant.actors.handlers import TRACEBACK_FRAMES, Handler, error_body, frames
from meshant.errors import ConfigError, TaskFailed, from_error_body

from .conftest import Procs
from .test_cli import meshant

APP = '''
import os
from meshant import Forager

forager = Forager(os.environ["APP_QUEEN"], name="tb")


def _count(what):
    with open(os.environ["APP_OUT"], "a") as f:
        f.write(what + "\\n")
    with open(os.environ["APP_OUT"]) as f:
        return sum(1 for line in f if line.strip() == what)


class Flaky(Exception):
    pass


@forager.task("lookup")
def lookup(p):
    _count("lookup")
    return p["a"]["b"]


@forager.task("flaky", retry_on=(Flaky,))
def flaky(p):
    n = _count("flaky")
    if n < 2:
        raise Flaky(f"try {n}")
    return n
'''


def _deep(n: int) -> None:
    if n == 0:
        raise KeyError("b")
    _deep(n - 1)


def test_the_failed_result_carries_a_bounded_traceback() -> None:
    try:
        _deep(100)
    except KeyError as e:
        body = error_body(e)
        tb = frames(e)
    err = body["error"]
    assert body["status"] == "error" and err["type"] == "KeyError" and err["message"] == "'b'"
    assert "retry" not in err  # nobody asked for a retry
    assert len(tb) == TRACEBACK_FRAMES and err["traceback"] == tb  # the last frames only
    assert tb[-1]["function"] == "_deep" and tb[-1]["file"] == __file__
    assert tb[-1]["source"] == 'raise KeyError("b")'
    # The submitter's exception shows where it failed when printed (a PEP 678 note).
    failed = from_error_body({"code": "handler-error", **err, "forager": "f1"})
    assert isinstance(failed, TaskFailed) and str(failed) == "KeyError: 'b'"
    assert failed.remote_traceback.splitlines()[-1] == '    raise KeyError("b")'
    assert failed.__notes__[0].startswith("The handler's traceback on f1 (most recent call")


def test_a_handler_retries_only_the_exceptions_it_names() -> None:
    h = Handler.of(lambda p: p, None, False, (ConnectionError,))
    assert h.failed(ConnectionResetError("reset"))["error"]["retry"] is True  # a subclass
    assert "retry" not in h.failed(KeyError("b"))["error"]
    f = Forager("tcp://127.0.0.1:1", name="x")
    with pytest.raises(ConfigError, match="retry_on takes exception classes"):
        f.add_handler("c", lambda p: p, retry_on=("KeyError",))  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_raising_handler_runs_once_and_everyone_sees_where(procs: Procs,
                                                           tmp_path: Path) -> None:
    _, ep = procs.queen("--journal", str(tmp_path / "q.db"), "--retry-base", "0.05")
    (tmp_path / "tbapp.py").write_text(APP)
    out = tmp_path / "calls.txt"
    fp, _ = procs.start("forager", "--app", "tbapp:forager", "--json",
                        env={"APP_QUEEN": ep, "APP_OUT": str(out),
                             "PYTHONPATH": str(tmp_path)})

    def calls(what: str) -> int:
        return out.read_text().split().count(what) if out.exists() else 0

    # Fails at once: one run, the exception's type, message and the handler's line.
    r = meshant("submit", "--queen", ep, "lookup", '{"a": {}}', "--json")
    assert r.returncode == 1, r.stderr
    rec: dict[str, Any] = json.loads(r.stdout)
    err = rec["error"]
    assert (err["code"], err["type"], err["message"]) == ("handler-error", "KeyError", "'b'")
    last = err["traceback"][-1]
    assert last["file"].endswith("tbapp.py") and last["function"] == "lookup"
    assert last["source"] == 'return p["a"]["b"]' and last["line"] == APP.count(
        "\n", 0, APP.index('return p["a"]["b"]')) + 1
    assert calls("lookup") == 1
    # The person at the terminal sees it as Python prints a traceback.
    r = meshant("submit", "--queen", ep, "lookup", '{"a": {}}')
    assert r.returncode == 1 and "[handler-error] KeyError: 'b'" in r.stderr
    assert "Traceback on tb (most recent call last):" in r.stderr
    assert 'tbapp.py", line' in r.stderr and 'return p["a"]["b"]' in r.stderr
    assert calls("lookup") == 2
    # `meshant task ID` shows one attempt and the traceback.
    r = meshant("task", "--queen", ep, rec["id"])
    assert r.returncode == 0, r.stderr
    assert "retry in" not in r.stdout and "KeyError: 'b'" in r.stdout
    assert 'tbapp.py", line' in r.stdout and "in lookup" in r.stdout

    # The handler opted in for Flaky: tried again, and the second run succeeds.
    r = meshant("submit", "--queen", ep, "flaky", "{}", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["result"] == 2, r.stdout + r.stderr
    # The submission opts in for KeyError: every attempt runs, then it fails.
    r = meshant("submit", "--queen", ep, "lookup", '{"a": {}}', "--retry-on", "KeyError",
                "--max-attempts", "3", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["attempts"] == 3
    assert calls("lookup") == 5
    # A name the handler's exception is not: no retry.
    r = meshant("submit", "--queen", ep, "lookup", '{"a": {}}', "--retry-on",
                "TimeoutError", "--max-attempts", "3", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["attempts"] == 1
    assert calls("lookup") == 6

    # The forager logged each failure at warning, with the whole traceback.
    fp.send_signal(signal.SIGINT)
    _, log = fp.communicate(timeout=15)
    assert "WARNING" in log and "(lookup, attempt 1) failed" in log, log
    assert "Traceback (most recent call last)" in log and "KeyError: 'b'" in log
    assert "(flaky, attempt 1) failed (its retry_on: the queen runs it again" in log
    assert os.path.exists(out)
