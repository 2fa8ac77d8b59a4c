"""The CLI end to end: queen and foragers as subprocesses, started as a user starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshant import Client

from .conftest import Procs, wait_for

pytestmark = pytest.mark.slow  # every test here starts subprocesses

ROOT = Path(__file__).resolve().parent.parent


def meshant(*args: str, input: str | None = None, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshant", *args], capture_output=True,
                          text=True, input=input, timeout=timeout,
                          env={**os.environ, **(env or {})})



def test_help_and_version() -> None:
    r = meshant("--help")
    assert r.returncode == 0 and "queen" in r.stdout and "forager" in r.stdout
    assert "demo" in r.stdout and "submit" in r.stdout
    r = meshant("--version")
    assert r.returncode == 0 and "meshant" in r.stdout
    r = meshant("queen", "--help")
    assert "--assign-timeout" in r.stdout and "MESHANT_BIND" in r.stdout


def test_submit_status_and_json(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep, "--name", "cli-f1", "--slots", "2")
    r = meshant("submit", "--queen", ep, "echo", '{"hello": "world"}')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"hello": "world"}
    r = meshant("submit", "echo", '[1, 2]', "--json", "--count", "3",
                env={"MESHANT_QUEEN": ep})
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0 and len(lines) == 3
    assert all(x["state"] == "completed" and x["result"] == [1, 2] and x["id"] for x in lines)
    r = meshant("submit", "--queen", ep, "fail", '{"message": "nope"}', "--json")
    assert r.returncode == 1
    rec = json.loads(r.stdout)
    assert rec["state"] == "failed" and rec["error"]["type"] == "DemoError"
    assert rec["error"]["message"] == "nope"
    r = meshant("submit", "--queen", ep, "echo", "-", "--json",
                input='{"n": 1}\n{"n": 2}\n')
    assert [json.loads(x)["result"] for x in r.stdout.splitlines()] == [{"n": 1}, {"n": 2}]
    r = meshant("status", "--queen", ep, "--json")
    st = json.loads(r.stdout)
    (f,) = st["foragers"]
    assert f["name"] == "cli-f1" and f["state"] == "active" and f["slots"] == 2
    assert f["in_flight"] == 0 and "echo" in f["tools"]
    assert "queues" in st
    r = meshant("status", "--queen", ep)
    assert "cli-f1" in r.stdout and r.returncode == 0


def test_stream_flag_prints_partials(procs: Procs) -> None:
    _, ep = procs.queen()
    procs.forager(ep)
    r = meshant("submit", "--queen", ep, "stream", '{"text": "a b c", "delay": 0}',
                "--stream", "--json")
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["value"] for x in recs if x.get("update") == "partial"] == ["a", "b", "c"]
    assert recs[-1]["state"] == "completed"


def test_clear_errors(procs: Procs) -> None:
    r = meshant("submit", "--queen", "tcp://127.0.0.1:1", "--connect-timeout", "0.5", "echo")
    assert r.returncode == 1 and "no answer from the queen" in r.stderr
    r = meshant("submit", "echo", "{bad json")
    assert r.returncode == 2 and "not JSON" in r.stderr
    _, ep = procs.queen()
    r = meshant("submit", "--queen", ep, "nobody", "--wait", "0.2", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == "no-forager"
    procs.forager(ep, "--name", "taken")
    p, _ = procs.start("forager", "--queen", ep, "--name", "taken", "--json", ready=False)
    assert p.wait(20) == 1
    assert p.stderr is not None and "held by a live peer" in p.stderr.read()


def test_forager_app_option(procs: Procs, tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(
        "from meshant import Forager\n"
        "forager = Forager()\n"
        "@forager.task('shout')\n"
        "def shout(p):\n"
        "    return str(p).upper() + '!'\n")
    _, ep = procs.queen()
    procs.start("forager", "--queen", ep, "--app", "myapp:forager", "--json",
                env={"PYTHONPATH": str(tmp_path)})
    r = meshant("submit", "--queen", ep, "shout", '"hi"')
    assert json.loads(r.stdout) == "HI!"


def test_killed_forager_task_completes_elsewhere_once(procs: Procs) -> None:
    # Liveness detection is made slow here so the assign_timeout lease is what reissues.
    _, ep = procs.queen("--assign-timeout", "1.5", "--hb-misses", "1000")
    fa, _ = procs.forager(ep, "--name", "victim")
    with Client(ep) as c:
        fut = c.submit("sleep", {"seconds": 0.5}, to=None)
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        assert c.task_status(fut.task_id)["forager"] == "victim"
        fa.send_signal(signal.SIGKILL)
        fa.wait(10)
        procs.forager(ep, "--name", "rescuer")
        assert fut.result(20) == {"seconds": 0.5}
        ts = c.task_status(fut.task_id)
        assert ts["attempt"] == 2 and ts["state"] == "completed"
        assert any("assign timeout on victim" in h[2] for h in ts["history"])


def test_hung_forager_late_result_is_dropped(procs: Procs) -> None:
    _, ep = procs.queen("--assign-timeout", "1.0", "--hb-misses", "1000")
    fa, _ = procs.forager(ep, "--name", "hung")
    with Client(ep) as c:
        fut = c.submit("sleep", {"seconds": 0.6})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        os.kill(fa.pid, signal.SIGSTOP)
        try:
            procs.forager(ep, "--name", "healthy")
            assert fut.result(20) == {"seconds": 0.6}
            assert c.task_status(fut.task_id)["attempt"] == 2
        finally:
            os.kill(fa.pid, signal.SIGCONT)
        # The resumed forager finishes its abandoned attempt; the queen drops that result.
        wait_for(lambda: c.status()["counters"]["duplicates"] == 1, what="duplicate dropped")
        st = c.status()
        assert st["counters"]["completed"] == 1 and st["counters"]["reissued"] == 1
        assert fut.task_id not in c._tasks  # the client got its one final result


def test_sigterm_stops_cleanly(procs: Procs) -> None:
    q, ep = procs.queen()
    f, _ = procs.forager(ep)
    for p in (f, q):
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0


def test_legacy_iacp11_forager_example(procs: Procs) -> None:
    _, ep = procs.queen()
    p = subprocess.Popen([sys.executable, str(ROOT / "examples" / "legacy_forager.py"), ep,
                          "old-timer"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    procs.all.append(p)
    with Client(ep) as c:
        wait_for(lambda: any(f["name"] == "old-timer" for f in c.status()["foragers"]),
                 what="legacy forager registered")
        (rec,) = c.status()["foragers"]
        assert rec["codec"] == "iacp1.1" and rec["tools"] == ["echo", "upper"]
        assert c.run("upper", "hello", result_timeout=10) == "HELLO"
        assert [f.result(10) for f in c.map("echo", range(20))] == list(range(20))


def test_embedded_forager_example(procs: Procs) -> None:
    _, ep = procs.queen()
    p = subprocess.Popen([sys.executable, str(ROOT / "examples" / "embedded_forager.py"), ep],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "SECONDS_TO_RUN": "30"})
    procs.all.append(p)
    from meshant.apps import _procs
    _procs.read_json_line(p, 20)
    with Client(ep) as c:
        assert c.run("word_count", "a b c", result_timeout=10) == {"words": 3}


@pytest.mark.parametrize("name", ["streaming_agent.py", "async_client.py", "planner_graph.py",
                                  "durable_agent.py"])
def test_self_contained_examples(name: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_demo() -> None:
    r = meshant("demo", "--json", "--tasks", "100", timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout.splitlines()[-1])
    assert rep["ok"] and all(rep["checks"].values())
    assert rep["counters"]["reissued"] >= 1
    assert rep["echo_latency_ms"]["p50"] > 0


# -- one set of connection options for every client command --------------------------------

CONNECTION_OPTS = ["--queen", "--discover", "--colony", "--curve-secret", "--queen-key",
                   "--connect-timeout"]
NOT_CLIENT_COMMANDS = {"queen", "forager", "keys generate", "discover", "demo", "bench",
                       "conformance forager", "conformance queen"}


def _leaf_commands() -> dict[str, Any]:
    import click

    from meshant.cli import main

    out: dict[str, Any] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{prefix}{name} ")
            else:
                out[f"{prefix}{name}"] = cmd

    walk(main, "")
    return out


def test_every_client_command_takes_the_same_connection_options() -> None:
    from click.testing import CliRunner

    from meshant.cli import main

    commands = _leaf_commands()
    assert set(commands) >= NOT_CLIENT_COMMANDS
    clients = sorted(set(commands) - NOT_CLIENT_COMMANDS)
    assert {"submit", "status", "broadcast", "drain", "halt", "dlq list", "dlq show",
            "dlq retry", "dlq purge", "memory get", "memory set", "memory delete"} <= set(clients)

    def described(cmd: Any) -> list[tuple[Any, ...]]:  # the options as --help shows them
        params = {o: p for p in cmd.params for o in p.opts}
        return [(params[o].opts, params[o].envvar, params[o].help, params[o].metavar)
                for o in CONNECTION_OPTS]

    reference = described(commands["status"])
    for name in clients:
        assert described(commands[name]) == reference, name
        r = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=200)
        assert r.exit_code == 0, (name, r.output)
        for opt in CONNECTION_OPTS:
            assert opt in r.output, (name, opt)
        for env in ("MESHANT_QUEEN", "MESHANT_COLONY", "MESHANT_CURVE_SECRET",
                    "MESHANT_QUEEN_KEY", "MESHANT_CONNECT_TIMEOUT"):
            assert env in r.output, (name, env)
    # The forager finds and secures its queen with the same options (it has no timeout).
    forager = [o for p in commands["forager"].params for o in p.opts]
    assert set(CONNECTION_OPTS) - set(forager) == {"--connect-timeout"}


def test_memory_commands_speak_curve(procs: Procs, tmp_path: Path) -> None:
    from meshant.adapters.security import generate

    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    authorized.mkdir()
    queen_pub, queen_sec = generate(keys, "queen")
    client_pub, client_sec = generate(keys, "client")  # may register client-*: the default
    (authorized / client_pub.name).write_bytes(client_pub.read_bytes())
    _, ep = procs.queen("--curve-secret", str(queen_sec), "--authorized", str(authorized))
    curve = ["--queen", ep, "--curve-secret", str(client_sec), "--queen-key", str(queen_pub)]
    r = meshant("memory", "set", *curve, "config", '{"rate": 5}')
    assert r.returncode == 0, r.stderr
    r = meshant("memory", "get", "config", env={"MESHANT_QUEEN": ep,
                                                "MESHANT_CURVE_SECRET": str(client_sec),
                                                "MESHANT_QUEEN_KEY": str(queen_pub)})
    assert r.returncode == 0 and json.loads(r.stdout) == {"rate": 5}, r.stderr
    r = meshant("broadcast", *curve, "alerts.fire", "1")
    assert r.returncode == 0, r.stderr
    # Without keys the CURVE queen never answers: one line, exit 1, no traceback.
    r = meshant("memory", "get", "--queen", ep, "--connect-timeout", "0.5", "config")
    assert r.returncode == 1 and "no answer from the queen" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_forager_app_joins_the_queen_its_forager_names(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen()
    (tmp_path / "hereapp.py").write_text(
        "from meshant import Forager\n"
        f"forager = Forager({ep!r}, name='here')\n"
        "@forager.task('hi')\n"
        "def hi(p):\n"
        "    return 'hi'\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env_no_queen = {k: v for k, v in os.environ.items() if k != "MESHANT_QUEEN"}
    _, info = procs.start("forager", "--app", "hereapp:forager", "--json",
                          env={**env_no_queen, **env})
    assert info["queen"] == ep  # not the default endpoint: the app's Forager named it
    r = meshant("submit", "--queen", ep, "hi", "{}")
    assert r.returncode == 0 and "hi" in r.stdout
