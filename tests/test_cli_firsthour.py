"""A new user's first hour on the command line (issue #24): cancel, Ctrl-C, a mistyped
capability, the journal commands from anywhere, and what the commands say. Every test
drives `meshant` as a subprocess, as a user types it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Procs, wait_for
from .test_cli import meshant

pytestmark = pytest.mark.slow


def _tasks(ep: str, state: str | None = None) -> list[dict[str, Any]]:
    args = ["tasks", "--queen", ep, "--json"] + (["--state", state] if state else [])
    r = meshant(*args)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def _popen(*args: str, stderr: Any = subprocess.PIPE,
           env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "meshant", *args], stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env={**os.environ, **(env or {})})


def _journaled_queen(procs: Procs, tmp_path: Path) -> str:
    return procs.queen("--journal", str(tmp_path / "q.db"))[1]


# -- 6: cancel from the command line --------------------------------------------------------

def test_cancel_tasks_and_graphs(procs: Procs, tmp_path: Path) -> None:
    ep = _journaled_queen(procs, tmp_path)
    procs.forager(ep)
    sub = _popen("submit", "--queen", ep, "sleep", '{"seconds": 60}', "--json")
    procs.all.append(sub)
    (rec,) = wait_for(lambda: _tasks(ep, "accepted"), 20, "the task running")
    r = meshant("cancel", "--queen", ep, rec["id"])
    assert r.returncode == 0, r.stderr
    assert f"task {rec['id']}: cancelled" in r.stdout
    assert sub.wait(20) == 1
    assert json.loads(sub.communicate()[0])["state"] == "cancelled"
    r = meshant("cancel", "--queen", ep, rec["id"], "--json")  # cancelled already: fine
    assert r.returncode == 0 and json.loads(r.stdout)["note"] == "already ended"
    failed = json.loads(meshant("submit", "--queen", ep, "fail", '{"message": "x"}',
                                "--json").stdout)
    r = meshant("cancel", "--queen", ep, failed["id"])  # failed already: said, not an error
    assert r.returncode == 0 and "failed (already ended)" in r.stdout, r.stdout + r.stderr
    # A graph whose node waits on a long one: cancelled as a whole by its id.
    doc = {"nodes": {"a": {"capability": "sleep", "payload": {"seconds": 60}},
                     "b": {"capability": "echo", "payload": {"$result": "a"}}}}
    (tmp_path / "g.json").write_text(json.dumps(doc))
    r = meshant("graph", "submit", "--queen", ep, str(tmp_path / "g.json"))
    gid = r.stdout.strip()
    assert r.returncode == 0 and gid, r.stderr
    wait_for(lambda: _tasks(ep, "accepted"), 20, "the graph's first node running")
    r = meshant("cancel", "--queen", ep, gid, "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["kind"] == "graph" and out["state"] == "cancelled"
    r = meshant("cancel", "--queen", ep, "no-such-id")
    assert r.returncode == 1 and "no such task or graph" in r.stderr
    assert "Traceback" not in r.stderr


def test_ctrl_c_on_submit_cancels_what_it_submitted(procs: Procs, tmp_path: Path) -> None:
    ep = _journaled_queen(procs, tmp_path)
    procs.forager(ep)
    sub = _popen("submit", "--queen", ep, "sleep", '{"seconds": 60}', "--count", "2")
    procs.all.append(sub)
    wait_for(lambda: len(_tasks(ep)) == 2 and _tasks(ep, "accepted"), 20, "both submitted")
    sub.send_signal(signal.SIGINT)
    assert sub.wait(20) == 130
    err = sub.communicate()[1]
    assert "cancelled 2 unfinished task(s)" in err and "Traceback" not in err
    assert {t["state"] for t in _tasks(ep)} == {"cancelled"}
    # SIGTERM (a supervisor, `timeout`) cancels as Ctrl-C does.
    sub = _popen("submit", "--queen", ep, "sleep", '{"seconds": 60}')
    procs.all.append(sub)
    wait_for(lambda: len(_tasks(ep, "accepted")) == 1, 20, "the third task running")
    sub.send_signal(signal.SIGTERM)
    assert sub.wait(20) == 130
    assert "cancelled 1 unfinished task(s)" in sub.communicate()[1]
    assert {t["state"] for t in _tasks(ep)} == {"cancelled"}
    # --keep-running: they go on, and it says how to follow them.
    sub = _popen("submit", "--queen", ep, "sleep", '{"seconds": 60}', "--keep-running")
    procs.all.append(sub)
    (rec,) = wait_for(lambda: _tasks(ep, "accepted"), 20, "the task running")
    sub.send_signal(signal.SIGINT)
    assert sub.wait(20) == 130
    assert "keep running" in sub.communicate()[1]
    assert [t["id"] for t in _tasks(ep, "accepted")] == [rec["id"]]
    assert meshant("cancel", "--queen", ep, rec["id"]).returncode == 0


# -- 7: a mistyped capability ----------------------------------------------------------------

def _on_a_terminal(procs: Procs, args: list[str], until: str,
                   timeout: float = 60) -> tuple[str, Any]:
    """Run meshant with stderr on a pseudo-terminal; what it wrote there until ``until``
    showed (the process may still run), and the process (stopped in teardown)."""
    master, slave = pty.openpty()
    p = _popen(*args, stderr=slave)
    procs.all.append(p)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while until.encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break  # the process closed the terminal
        return seen.decode(errors="replace"), p
    finally:
        os.close(master)


def test_no_forager_said_at_once_with_what_is_offered(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    text, p = _on_a_terminal(procs, ["submit", "--queen", ep, "ecco", '"hi"', "--wait", "30"],
                             "offered now")
    try:
        # Said while the task still waits for a forager, not after the 30 s.
        assert p.poll() is None
        assert "no forager offers 'ecco' yet" in text
        assert "echo, fail, sleep, stream" in text
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(20)
        assert p.stdout is not None
        p.stdout.close()
    # The final error lists them too (no terminal needed).
    r = meshant("submit", "--queen", ep, "ecco", '"hi"', "--wait", "0.3")
    assert r.returncode == 1
    assert "[no-forager]" in r.stderr and "offered now: echo, fail, sleep, stream" in r.stderr
    r = meshant("submit", "--queen", ep, "ecco", '"hi"', "--wait", "0.3", "--json")
    assert json.loads(r.stdout)["error"]["offered"] == ["echo", "fail", "sleep", "stream"]


def test_count_on_a_terminal_shows_results(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    text, p = _on_a_terminal(procs, ["submit", "--queen", ep, "echo", '{"n": 1}', "--count", "3"],
                             "3 completed")
    assert "3 completed, 0 failed" in text
    out, _ = p.communicate(timeout=20)
    assert out.splitlines() == ['{"n": 1}'] * 3


# -- 9: the journal commands ask the running queen ------------------------------------------

def test_journal_commands_from_any_directory(procs: Procs, tmp_path: Path) -> None:
    ep = _journaled_queen(procs, tmp_path)
    procs.forager(ep)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = meshant("submit", "--queen", ep, "stream", '{"text": "a b c", "delay": 0}')
    assert r.returncode == 0, r.stderr

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshant", *args], capture_output=True,
                              text=True, timeout=60, cwd=elsewhere,
                              env={**os.environ, "MESHANT_QUEEN": ep,
                                   "PYTHONPATH": os.pathsep.join(sys.path)})

    r = run("tasks", "--json")
    (t,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0 and t["capability"] == "stream" and t["state"] == "completed"
    r = run("task", t["id"])
    assert r.returncode == 0 and "completed" in r.stdout, r.stderr
    # A progress report reads as a percentage, not 0.3333333333333333.
    assert re.search(r"progress\s+33%", r.stdout), r.stdout
    assert "0.333" not in r.stdout
    r = run("journal", "verify", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {
        "journal": str(tmp_path / "q.db"), "ok": True, "problems": []}
    r = run("tasks", "--state", "input-required")
    assert r.returncode == 0 and r.stdout == ""
    assert not (elsewhere / "meshant-queen.db").exists()
    # No queen answers and no journal here: one line saying what to do.
    r = run("tasks", "--queen", "tcp://127.0.0.1:1", "--connect-timeout", "0.3")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no queen answered" in r.stderr and "--journal PATH" in r.stderr
    # ... and a journal given is read without asking anyone.
    r = run("tasks", "--queen", "tcp://127.0.0.1:1", "--journal", str(tmp_path / "q.db"))
    assert r.returncode == 0 and t["id"] in r.stdout
    # A volatile queen says it keeps none.
    _, volatile = procs.queen("--journal", ":memory:")
    r = run("tasks", "--queen", volatile)
    assert r.returncode == 1 and "keeps no journal" in r.stderr


def test_queen_that_fails_to_bind_leaves_no_journal(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen()
    r = meshant("queen", "--bind", ep, "--pub", "tcp://127.0.0.1:0", "--journal",
                str(tmp_path / "new.db"))
    assert r.returncode == 1 and "cannot bind" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []
    r = meshant("queen", "--journal", str(tmp_path / "missing" / "q.db"), "--bind",
                "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: No such file or directory")


# -- 8: bad input, every command: exit non-zero, one clear line -----------------------------

BAD_INPUT: list[tuple[str, list[str], str]] = [
    # (command, its arguments (QUEEN: a running queen), what the error line says)
    ("queen", ["--bind", "nonsense"], "not a ZeroMQ endpoint"),
    ("forager", ["--queen", "QUEEN", "--app", "no_such_module:forager"], "cannot import"),
    ("a2a", ["--queen", "QUEEN", "--listen", "nope"], "--listen"),
    ("mcp", ["--queen", "QUEEN", "--listen", "127.0.0.1:0", "--token", "short"],
     "at least 16 characters"),
    ("submit", ["--queen", "QUEEN", "echo", "hello"], "'\"hello\"'"),
    ("submit", ["--queen", "QUEEN", "echo", "1", "--retry-on", " "], "--retry-on"),
    ("status", ["--queen", "tcp://x"], "not a ZeroMQ endpoint"),
    ("cancel", ["--queen", "QUEEN", "no-such-task"], "no such task or graph"),
    ("answer", ["--queen", "QUEEN", "no-such-task", "1"], "no task"),
    ("watch", ["--queen", "QUEEN", "no-such-task"], "no task"),
    ("inbox", ["--queen", "QUEEN", "a", "b", "c"], "give NAME"),
    ("graph submit", ["--queen", "QUEEN", "/no/such/graph.json"], "cannot read"),
    ("graph submit", ["--queen", "QUEEN", "-"], "node 0 must be a map"),  # (stdin: [1])
    ("graph status", ["--queen", "QUEEN", "no-such-graph"], "unknown-graph"),
    ("graph cancel", ["--queen", "QUEEN", "no-such-graph"], "unknown-graph"),
    ("broadcast", ["--queen", "QUEEN", "bad topic!"], "TOPIC"),
    ("drain", ["--queen", "QUEEN", "nobody"], "no live forager"),
    ("halt", ["--queen", "QUEEN", "nobody"], "no live forager"),
    ("memory get", ["--queen", "QUEEN", "no-such-key"], "no key"),
    ("memory set", ["--queen", "QUEEN", "k", "{bad"], "not JSON"),
    ("memory delete", ["--queen", "nonsense", "k"], "not a ZeroMQ endpoint"),
    ("dlq list", ["--queen", "tcp://127.0.0.1:1", "--connect-timeout", "0.2"], "no answer"),
    ("dlq show", ["--queen", "QUEEN", "no-such-task"], "no dead letter"),
    ("dlq retry", ["--queen", "QUEEN"], "TASK_ID or --all"),
    ("dlq purge", ["--queen", "QUEEN", "no-such-task"], "no dead letter"),
    ("tasks", ["--queen", "QUEEN", "--state", "nonsense"], "--state"),
    ("task", ["--queen", "QUEEN", "--journal", "/no/such.db", "x"], "no journal"),
    ("replay", ["--queen", "QUEEN", "--app", "tests.durable_app:nothing", "x"],
     "no attribute 'nothing'"),
    ("journal verify", ["--journal", "/no/such.db"], "no journal"),
    ("keys generate", ["/proc/no/such", "--name", "k"], "cannot write the keys"),
    ("discover", ["--timeout", "-1"], "--timeout"),
    ("demo", ["--foragers", "1"], "--foragers"),
    ("bench", ["--scenario", "nosuch"], "unknown scenario"),
    ("conformance forager", ["--", "/no/such/command"], "cannot start"),
    ("conformance queen", ["--queen", "nonsense"], "not a ZeroMQ endpoint"),
    ("top", ["--once", "--queen", "tcp://127.0.0.1:1", "--connect-timeout", "0.2"],
     "no answer"),
    ("schedule add", ["--queen", "QUEEN", "x", "nonsense", "echo"], "not a cron expression"),
    ("schedule add", ["--queen", "QUEEN", "x", "* * * * *", "echo", "{bad"], "not JSON"),
    ("schedule list", ["--queen", "tcp://127.0.0.1:1", "--connect-timeout", "0.2"],
     "no answer"),
    ("schedule show", ["--queen", "QUEEN", "no-such-schedule"], "no schedule named"),
    ("schedule pause", ["--queen", "QUEEN", "no-such-schedule"], "no schedule named"),
    ("schedule resume", ["--queen", "QUEEN", "no-such-schedule"], "no schedule named"),
    ("schedule remove", ["--queen", "QUEEN", "no-such-schedule"], "no schedule named"),
    ("schedule trigger", ["--queen", "QUEEN", "no-such-schedule"], "no schedule named"),
]


@pytest.fixture(scope="module")
def running_queen() -> Any:
    ps = Procs()
    try:
        yield ps.queen()[1]
    finally:
        ps.close()


def test_bad_input_covers_every_command() -> None:
    from .test_cli import _leaf_commands

    assert {c for c, _, _ in BAD_INPUT} == set(_leaf_commands())


@pytest.mark.parametrize(("command", "args", "says"), BAD_INPUT,
                         ids=[f"{c} {i}" for i, (c, _, _) in enumerate(BAD_INPUT)])
def test_bad_input_is_one_clear_line(running_queen: str, command: str, args: list[str],
                                     says: str) -> None:
    r = meshant(*command.split(), *[running_queen if a == "QUEEN" else a for a in args],
                timeout=60, input='{"nodes": [1]}' if "-" in args else None)
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    assert len(errors) == 1 and says in errors[0], r.stderr


def test_watch_timeout_exits_2(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    from meshant import Client

    with Client(ep) as c:
        fut = c.submit("sleep", {"seconds": 60})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="running")
        t0 = time.monotonic()
        r = meshant("watch", "--queen", ep, fut.task_id, "-t", "1")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert time.monotonic() - t0 < 15
        assert "did not end within 1 s" in r.stderr and "--after" in r.stderr
        c.cancel(fut.task_id)


# -- 13: the smaller ones ---------------------------------------------------------------------

def test_queen_help_lists_the_documented_environment() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    queen_part = doc.split("## Foragers and clients")[0]  # the queen's section comes first
    names = set(re.findall(r"MESHANT_[A-Z_]+", queen_part))
    assert {"MESHANT_BIND", "MESHANT_JOURNAL", "MESHANT_COLONY"} <= names
    r = meshant("queen", "--help")
    missing = {n for n in names if n not in r.stdout}
    assert not missing


def test_status_memory_and_forager_words(procs: Procs) -> None:
    _, ep = procs.queen()
    f, _ = procs.forager(ep, "--name", "worker")
    r = meshant("submit", "--queen", ep, "echo", "1")
    assert r.returncode == 0
    r = meshant("status", "--queen", ep)
    # Neither itself nor the submit that came before are clients of this colony's own.
    assert "1 foragers, 0 clients" in r.stdout and "client-" not in r.stdout, r.stdout
    counters = r.stdout.split("counters: ")[1]
    assert "=0" not in counters and "submitted=1" in counters
    assert meshant("memory", "set", "--queen", ep, "rate", "5").returncode == 0
    r = meshant("memory", "get", "--queen", ep, "rate", "--json")
    assert json.loads(r.stdout) == {"key": "rate", "found": True, "value": 5}
    r = meshant("memory", "get", "--queen", ep, "nope", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["found"] is False
    f.send_signal(signal.SIGINT)
    assert f.wait(20) == 0
    assert "meshant forager 'worker' stopped" in f.communicate()[1]


def test_a_queen_that_stops_is_not_said_to_restart(procs: Procs) -> None:
    q, ep = procs.queen()
    f, _ = procs.forager(ep, "--name", "listener")
    q.send_signal(signal.SIGTERM)
    assert q.wait(20) == 0
    # The forager says so once it hears the queen's goodbye (or misses its heartbeats):
    # wait for that line before stopping it, not for a fixed time.
    assert f.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 20
    while not any("the queen stopped" in x for x in seen) and time.monotonic() < deadline:
        if select.select([f.stderr], [], [], max(0.0, deadline - time.monotonic()))[0]:
            line = f.stderr.readline()
            if not line:
                break
            seen.append(line)
    f.send_signal(signal.SIGINT)
    assert f.wait(20) == 0
    err = "".join(seen) + f.communicate()[1]
    assert "the queen stopped" in err and "restarted" not in err, err


def test_cancel_follows_rights_with_curve(procs: Procs, tmp_path: Path) -> None:
    # With CURVE, another client's task or graph is cancelled by an admin key only; each
    # CLI peer takes a name its key may register (NAME-HOST-PID-…) without --name.
    from meshant.adapters.security import generate

    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    authorized.mkdir()
    queen_pub, queen_sec = generate(keys, "queen")
    secrets: dict[str, str] = {}
    for name, role in (("alice", "client"), ("bob", "client"), ("ops", "admin"),
                       ("worker", "forager")):
        pub, sec = generate(keys, name, (role,))
        (authorized / pub.name).write_bytes(pub.read_bytes())
        secrets[name] = str(sec)
    _, ep = procs.queen("--curve-secret", str(queen_sec), "--authorized", str(authorized),
                        "--journal", str(tmp_path / "q.db"))
    env = {"MESHANT_QUEEN": ep, "MESHANT_QUEEN_KEY": str(queen_pub)}
    procs.start("forager", "--json", env={**env, "MESHANT_CURVE_SECRET": secrets["worker"]})

    def as_(who: str, *args: str) -> subprocess.CompletedProcess[str]:
        return meshant(*args, env={**env, "MESHANT_CURVE_SECRET": secrets[who]})

    sub = _popen("submit", "sleep", '{"seconds": 60}',
                 env={**env, "MESHANT_CURVE_SECRET": secrets["alice"]})
    procs.all.append(sub)

    def running() -> list[dict[str, Any]]:
        r = as_("ops", "tasks", "--state", "accepted", "--json")
        return [json.loads(x) for x in r.stdout.splitlines()]

    (rec,) = wait_for(running, 20, "alice's task running")
    r = as_("bob", "cancel", rec["id"])
    assert r.returncode == 1 and "forbidden" in r.stderr, r.stderr
    assert running() == [rec]
    r = as_("ops", "cancel", rec["id"])
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stderr
    assert sub.wait(20) == 1
    # A graph: the same rule.
    (tmp_path / "g.json").write_text(json.dumps(
        {"nodes": {"a": {"capability": "sleep", "payload": {"seconds": 60}}}}))
    r = as_("alice", "graph", "submit", str(tmp_path / "g.json"))
    gid = r.stdout.strip()
    assert r.returncode == 0 and gid, r.stderr
    r = as_("bob", "graph", "cancel", gid)
    assert r.returncode == 1 and "forbidden" in r.stderr, r.stderr
    # Ownership is the submitter's registered name: another process of alice's is not it.
    r = as_("alice", "cancel", gid)
    assert r.returncode == 1 and "admin key or the submitter" in r.stderr, r.stderr
    r = as_("ops", "cancel", gid, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "cancelled", r.stderr
