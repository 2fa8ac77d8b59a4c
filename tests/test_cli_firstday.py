"""A newcomer's first day on the command line (issue #34): what a person sees when a name
is taken, a task asks a question, a capability is mistyped from a script, an --app is
not found, a task is cancelled while it asks, an extra is missing, and what the listing
commands accept and show. Every test drives `meshant` (or an example) as a subprocess,
as a user types it, against a real queen and foragers on free loopback ports."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Procs, wait_for
from .test_cli import ROOT, meshant
from .test_cli_firsthour import _popen

pytestmark = pytest.mark.slow


def _lines_until(stream: Any, until: str, timeout: float = 30) -> list[str]:
    """Lines read from a process's pipe until one contains ``until`` (or the pipe ends, or
    ``timeout`` passes: the caller's assertion then says what was missing). Reads the file
    descriptor itself: a text stream's buffer may hold lines that select never sees."""
    seen = b""
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    while until.encode() not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        seen += chunk
    return seen.decode(errors="replace").splitlines(keepends=True)


def _slow_liveness_queen(procs: Procs) -> str:
    """A queen that holds a silent peer's name 10 s (1 s heartbeats, 10 missed): longer
    than the 2 s after which a missing queen would be said, and than a forager takes to
    start on a busy machine."""
    return procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                       "--json", "--hb-interval", "1", "--hb-misses", "10")[1]["router"]


# -- 1: a name in use -----------------------------------------------------------------------

def test_a_name_in_use_is_said_at_once_not_as_a_missing_queen(procs: Procs) -> None:
    ep = _slow_liveness_queen(procs)
    first, _ = procs.forager(ep, "--name", "taken")
    p, _ = procs.start("forager", "--queen", ep, "--name", "taken", ready=False)
    assert p.wait(60) == 1
    assert p.stderr is not None
    lines = p.stderr.read().splitlines()
    held = [i for i, x in enumerate(lines) if "'taken' is held by a live peer" in x
            and "Asking once more" in x and "earlier life" in x]
    final = [i for i, x in enumerate(lines) if x.startswith("Error:")]
    # The name is named first, while it waits; then the refusal; never "is it running?".
    assert held and final and held[0] < final[0], lines
    assert "held by a live peer" in lines[final[0]]
    assert not any("is it running" in x or "still waiting" in x for x in lines), lines
    # A dead earlier life: the same words, then it joins once the name is free.
    first.send_signal(signal.SIGKILL)
    first.wait(20)
    again, info = procs.forager(ep, "--name", "taken")
    assert info["name"] == "taken"
    again.send_signal(signal.SIGINT)
    assert again.wait(20) == 0
    assert again.stderr is not None
    err = again.stderr.read()
    assert "Asking once more" in err and "is it running" not in err, err


# -- 2: a question without --stream ----------------------------------------------------------

ASKER = '''\
from meshant import Forager, TaskContext

forager = Forager()


@forager.task("plan")
def plan(goal: str, ctx: TaskContext) -> str:
    branch = ctx.ask("Which branch?", data={"choices": ["a", "b"]}, timeout=600)
    return f"planned {goal} on {branch}"
'''


def _asker(procs: Procs, tmp_path: Path, ep: str, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "asker.py").write_text(ASKER)
    return procs.start("forager", "--queen", ep, "--json", "--app", "asker:forager", *extra,
                       env={"PYTHONPATH": str(tmp_path)})[0]


def test_submit_without_stream_shows_the_question_and_how_to_answer(procs: Procs,
                                                                    tmp_path: Path) -> None:
    _, ep = procs.queen()
    _asker(procs, tmp_path, ep)
    sub = _popen("submit", "--queen", ep, "plan", '"release"')
    procs.all.append(sub)
    assert sub.stderr is not None
    said = "".join(_lines_until(sub.stderr, "meshant answer"))
    assert 'asks: "Which branch?" {"choices": ["a", "b"]}' in said, said
    task_id = said.split("task ", 1)[1].split()[0]
    assert f"meshant answer {task_id} JSON" in said
    r = meshant("answer", "--queen", ep, task_id, '"b"')
    assert r.returncode == 0, r.stderr
    out, err = sub.communicate(timeout=30)
    assert sub.returncode == 0, err
    assert out == '"planned release on b"\n'  # stdout keeps the result alone


# -- 3: a mistyped capability from a script --------------------------------------------------

@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_script_is_told_at_once_that_no_forager_offers_it(procs: Procs,
                                                            json_flag: list[str]) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    sub = _popen("submit", "--queen", ep, "ecco", '"hi"', "--wait", "120", *json_flag)
    procs.all.append(sub)
    assert sub.stderr is not None  # a pipe, not a terminal: as a script runs it
    said = "".join(_lines_until(sub.stderr, "offered now"))
    assert sub.poll() is None  # said while the task waits, not when the 120 s are over
    assert "no forager offers 'ecco' yet (offered now: echo, fail, sleep, stream)" in said
    assert "up to 120 s" in said
    sub.send_signal(signal.SIGINT)
    assert sub.wait(30) == 130


# -- 4: how --app finds a module -------------------------------------------------------------

def test_app_as_a_file_path_and_errors_that_say_where_it_looked(procs: Procs,
                                                                tmp_path: Path) -> None:
    app = tmp_path / "apps" / "shouter.py"
    app.parent.mkdir()
    (app.parent / "words.py").write_text("def shout(p):\n    return str(p).upper() + '!'\n")
    app.write_text("from meshant import Forager\nfrom words import shout\n"
                   "forager = Forager()\nforager.add_handler('shout', shout)\n")
    _, ep = procs.queen()
    # A file path (any working directory), its sibling module imported as when it is run.
    procs.forager(ep, "--app", f"{app}:forager")
    r = meshant("submit", "--queen", ep, "shout", '"hi"')
    assert r.returncode == 0 and json.loads(r.stdout) == "HI!", r.stderr
    procs.forager(ep, "--app", str(app), "--name", "no-attr")  # :ATTR left out: its one
    # A module that is not there: where it looked, and what to try.
    r = meshant("forager", "--queen", ep, "--app", "shouter:forager",
                env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    assert f"in the current directory ({os.getcwd()})" in line
    assert f"on PYTHONPATH ({tmp_path})" in line
    assert "--app path/to/shouter.py:ATTR" in line
    # Found, but importing it fails: what it raised, and where, not a traceback.
    bad = tmp_path / "broken.py"
    bad.write_text("import words_that_are_not_there\n")
    r = meshant("forager", "--queen", ep, "--app", f"{bad}:forager")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (f"No module named 'words_that_are_not_there' ({bad}, line 1)") in r.stderr
    r = meshant("forager", "--queen", ep, "--app", f"{app}:nope")
    assert r.returncode == 2 and "has no attribute 'nope' (its Forager objects: forager)" \
        in r.stderr
    r = meshant("forager", "--help")
    assert "path/to/mod.py:ATTR" in " ".join(r.stdout.split())


# -- 5: cancelled while it asks --------------------------------------------------------------

def test_a_task_cancelled_in_ctx_ask_is_reported_cancelled_not_failed(procs: Procs,
                                                                     tmp_path: Path) -> None:
    _, ep = procs.queen()
    (tmp_path / "asker.py").write_text(ASKER)
    f, _ = procs.start("-v", "forager", "--queen", ep, "--json", "--app",
                       str(tmp_path / "asker.py"))
    sub = _popen("submit", "--queen", ep, "plan", '"release"', "--json")
    procs.all.append(sub)
    assert sub.stderr is not None
    said = "".join(_lines_until(sub.stderr, "meshant answer"))
    task_id = said.split("task ", 1)[1].split()[0]
    r = meshant("cancel", "--queen", ep, task_id)
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stderr
    assert sub.wait(30) == 1
    assert json.loads(sub.communicate()[0])["state"] == "cancelled"
    assert f.stderr is not None
    log = "".join(_lines_until(f.stderr, f"task {task_id} (plan, attempt 1) cancelled"))
    assert f"task {task_id} (plan, attempt 1) cancelled" in log, log
    assert "failed" not in log and "Traceback" not in log and "TaskCancelled" not in log


# -- 6: an extra that is missing --------------------------------------------------------------

# Makes `import NAME` fail (and importlib.util.find_spec(NAME) answer None) for each NAME
# in $BLOCK_MODULES, as where that extra was never installed.
BLOCKER = """\
import os
import sys

for name in os.environ.get("BLOCK_MODULES", "").split(","):
    if name:
        sys.modules[name] = None
"""

MISSING_EXTRAS = [
    # (the module kept out, the command, the package the hint installs)
    ("mcp", ["forager", "--queen", "QUEEN", "--mcp", "some-server"], "'mcp>="),
    ("a2a", ["forager", "--queen", "QUEEN", "--a2a", "http://127.0.0.1:1"], "'a2a-sdk"),
    ("mcp", ["mcp", "--queen", "QUEEN"], "'mcp>="),
    ("a2a", ["a2a", "--queen", "QUEEN"], "'a2a-sdk"),
    ("prometheus_client", ["queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                           "tcp://127.0.0.1:0", "--http", "0"], "'prometheus-client>="),
    ("psycopg", ["tasks", "--journal", "postgresql://nobody@127.0.0.1:1/db"],
     "'psycopg[binary]>="),
]


@pytest.mark.parametrize(("blocked", "args", "package"), MISSING_EXTRAS,
                         ids=[f"{a[0]} {b}" for b, a, _ in MISSING_EXTRAS])
def test_a_missing_extra_names_a_command_that_installs_it(running_queen: str, tmp_path: Path,
                                                          blocked: str, args: list[str],
                                                          package: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    r = meshant(*[running_queen if a == "QUEEN" else a for a in args],
                env={"PYTHONPATH": str(tmp_path), "BLOCK_MODULES": blocked})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    # Not `pip install 'meshant[...]'`: meshant is not on PyPI. The extra's own
    # requirements, with the pip of the interpreter meshant runs on.
    assert "meshant[" not in line
    hint = line.split("install it with: ", 1)[1]
    assert hint.startswith(f"{shlex.quote(sys.executable)} -m pip install ") and package in hint
    # ... a command pip takes as it is (here all is installed: nothing to fetch).
    ran = subprocess.run([*shlex.split(hint), "--dry-run", "--no-index", "-q"],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr


@pytest.fixture(scope="module")
def running_queen() -> Any:
    ps = Procs()
    try:
        yield ps.queen()[1]
    finally:
        ps.close()


# -- 7: the states users see -----------------------------------------------------------------

def test_tasks_state_running_as_status_says_it(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen("--journal", str(tmp_path / "q.db"))
    procs.forager(ep)
    assert meshant("submit", "--queen", ep, "echo", "1").returncode == 0
    sub = _popen("submit", "--queen", ep, "sleep", '{"seconds": 60}', "--json")
    procs.all.append(sub)

    def running() -> list[dict[str, Any]]:
        r = meshant("tasks", "--queen", ep, "--state", "running", "--json")
        assert r.returncode == 0, r.stderr
        return [json.loads(x) for x in r.stdout.splitlines()]

    (rec,) = wait_for(running, 30, "the sleep task listed as running")
    assert rec["capability"] == "sleep" and rec["state"] in ("assigned", "accepted")
    st = json.loads(meshant("status", "--queen", ep, "--json").stdout)
    assert st["running"] == 1  # the count the listing matches
    r = meshant("tasks", "--queen", ep, "--state", "Running")
    assert r.returncode == 0 and rec["id"] in r.stdout
    r = meshant("tasks", "--queen", ep, "--state", "busy")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    assert "'busy' is not one of" in line and "'running'" in line and "'queued'" in line
    assert meshant("cancel", "--queen", ep, rec["id"]).returncode == 0
    assert sub.wait(30) == 1


# -- 8: the exception's type in dead letters -------------------------------------------------

def test_dlq_list_shows_the_exception_type(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    r = meshant("submit", "--queen", ep, "fail", '{"message": "nope"}', "--json")
    task_id = json.loads(r.stdout)["id"]
    r = meshant("dlq", "list", "--queen", ep)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith(task_id)]
    assert "handler-error" in line and line.endswith("DemoError: nope"), line
    (rec,) = [json.loads(x) for x in meshant("dlq", "list", "--queen", ep, "--json")
              .stdout.splitlines()]
    assert rec["error"]["type"] == "DemoError"


# -- 9: the examples, run wrong -------------------------------------------------------------

BAD_EXAMPLE_RUNS = [
    ("embedded_forager.py", []),
    ("embedded_forager.py", ["nonsense"]),
    ("embedded_forager.py", ["tcp://127.0.0.1:5670", "extra"]),
    ("async_client.py", ["nonsense"]),
    ("async_client.py", ["a", "b"]),
    ("legacy_forager.py", ["nonsense"]),
    ("legacy_forager.py", ["a", "b", "c"]),
    ("planner_graph.py", ["tcp://127.0.0.1:5670"]),
    ("streaming_agent.py", ["tcp://127.0.0.1:5670"]),
    ("durable_agent.py", ["tcp://127.0.0.1:5670"]),
]


@pytest.mark.parametrize(("name", "args"), BAD_EXAMPLE_RUNS,
                         ids=[f"{n} {' '.join(a) or '(none)'}" for n, a in BAD_EXAMPLE_RUNS])
def test_an_example_run_wrong_says_its_usage_and_exits_2(name: str, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MESHANT_QUEEN"}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"usage: python examples/{name}" in r.stderr
    assert len(r.stderr.splitlines()) <= 2  # the usage, and what was wrong when it says


# -- 10: a failed graph's last line -----------------------------------------------------------

def test_graph_submit_wait_json_ends_naming_the_failed_node(procs: Procs,
                                                           tmp_path: Path) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    doc = {"nodes": {"ok": {"capability": "echo", "payload": 1},
                     "bad": {"capability": "fail", "payload": {"message": "no"}},
                     "after": {"capability": "echo", "payload": {"$result": "bad"}}}}
    (tmp_path / "g.json").write_text(json.dumps(doc))
    r = meshant("graph", "submit", "--queen", ep, str(tmp_path / "g.json"), "--wait",
                "--json")
    assert r.returncode == 1, r.stderr
    *nodes, end = [json.loads(x) for x in r.stdout.splitlines()]
    assert {n["node"]: n["state"] for n in nodes} == {"ok": "completed", "bad": "failed",
                                                      "after": "cancelled"}
    assert end == {"graph": nodes[0]["graph"], "state": "failed", "failed": "bad"}
    # A graph that completes names none.
    (tmp_path / "ok.json").write_text(json.dumps({"nodes": {"a": {"capability": "echo"}}}))
    r = meshant("graph", "submit", "--queen", ep, str(tmp_path / "ok.json"), "--wait",
                "--json")
    assert r.returncode == 0 and "failed" not in json.loads(r.stdout.splitlines()[-1])
