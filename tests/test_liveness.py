"""Death and recovery with real processes: killed and hung foragers, a killed queen."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from meshant import Client, MeshantError, QueenUnreachable

from .conftest import Procs
from .test_cli import meshant, wait_for

pytestmark = pytest.mark.slow  # every test here starts subprocesses

HB = ("--hb-interval", "0.2", "--hb-misses", "5")  # offline after 1 s of silence


def test_killed_forager_detected_by_heartbeats(procs: Procs) -> None:
    _, ep = procs.queen(*HB)  # assign_timeout stays 300 s: only liveness can save the task
    victim, _ = procs.forager(ep, "--name", "victim")
    with Client(ep) as c:
        # Long enough that the victim is still at it once the rescuer has started (a
        # second was not, on a loaded machine).
        fut = c.submit("sleep", {"seconds": 2.5})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        procs.forager(ep, "--name", "rescuer")
        t0 = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        assert fut.result(15) == {"seconds": 2.5}
        took = time.monotonic() - t0
        assert took < 1.0 + 2.5 + 3.0  # hb_interval x misses + task time + slack
        ts = c.task_status(fut.task_id)
        assert ts["attempt"] == 2 and any("went silent" in h[2] for h in ts["history"])
        assert c.status()["counters"]["completed"] == 1


def test_sigstop_offline_then_sigcont_rejoins_and_stale_result_dropped(procs: Procs) -> None:
    _, ep = procs.queen(*HB)
    hung, _ = procs.forager(ep, "--name", "hung")
    with Client(ep) as c:
        fut = c.submit("sleep", {"seconds": 0.5})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            procs.forager(ep, "--name", "healthy")
            wait_for(lambda: "hung" not in {f["name"] for f in c.status()["foragers"]},
                     what="hung declared offline")
            assert fut.result(15) == {"seconds": 0.5}
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        # It notices it lost the queen, reconnects, says hello again under its name ...
        wait_for(lambda: "hung" in {f["name"] for f in c.status()["foragers"]}, timeout=15,
                 what="hung to re-register")
        # ... and its result for the abandoned attempt is dropped, not delivered: it either
        # reaches the queen (counted as a duplicate) or dies with the old connection.
        hung_rec = next(f for f in c.status()["foragers"] if f["name"] == "hung")
        assert hung_rec["pid"] == hung.pid
        # A round trip through hung: its messages reach the queen in order, so once this
        # probe's result is back, its stale result (sent or re-sent before) was handled.
        assert c.run("echo", {"probe": 1}, to="hung", result_timeout=10) == {"probe": 1}
        st = c.status()
        # Completed: the task once, and the probe; the stale result was not counted.
        assert st["counters"]["completed"] == 2 and st["counters"]["reissued"] == 1
        assert c.task_status(fut.task_id)["attempt"] == 2  # the delivered result: attempt 2
        assert fut.task_id not in c._tasks


def test_queen_killed_and_restarted_foragers_rejoin(procs: Procs, tmp_path: Path) -> None:
    router, pub = f"ipc://{tmp_path}/router", f"ipc://{tmp_path}/pub"
    qargs = ("queen", "--bind", router, "--pub", pub, "--json", *HB)
    queen, _ = procs.start(*qargs)
    foragers = [procs.forager(router, "--name", f"f{i}")[0] for i in range(3)]
    with Client(router, queen_wait=60) as c:
        assert c.run("echo", 1, result_timeout=10) == 1
        queen.send_signal(signal.SIGKILL)
        queen.wait(10)
        procs.start(*qargs)
        t0 = time.monotonic()
        wait_for(lambda: _names(c) == {"f0", "f1", "f2"}, timeout=15,
                 what="every forager to re-register")
        assert time.monotonic() - t0 < 10
        assert all(f.poll() is None for f in foragers)  # the same processes
        assert c.run("echo", 2, result_timeout=10) == 2  # the client re-attached too


def _names(c: Client) -> set[str]:
    try:
        return {f["name"] for f in c.status(timeout=1)["foragers"]}
    except MeshantError:
        return set()


def test_client_fails_pending_tasks_when_the_queen_stays_dead(procs: Procs) -> None:
    queen, ep = procs.queen(*HB)
    with Client(ep, queen_wait=1.0) as c:
        fut = c.submit("nobody-serves-this", wait=60, ack=True)
        wait_for(lambda: fut.acknowledged, what="the queen to hold the task")
        queen.send_signal(signal.SIGKILL)
        with pytest.raises(QueenUnreachable, match="unreachable"):
            fut.result(15)


def test_client_resubmits_to_a_queen_restarted_without_a_journal(procs: Procs,
                                                                  tmp_path: Path) -> None:
    # A volatile queen forgets everything when killed: the client still holds what was
    # submitted and sends it again, with the same id, to the queen that comes back.
    router, pub = f"ipc://{tmp_path}/r", f"ipc://{tmp_path}/p"
    qargs = ("queen", "--bind", router, "--pub", pub, "--json", "--journal", ":memory:", *HB)
    queen, _ = procs.start(*qargs)
    with Client(router, queen_wait=60) as c:
        fut = c.submit("echo", {"n": 1}, wait=60, ack=True)
        wait_for(lambda: fut.acknowledged, 10)
        queen.send_signal(signal.SIGKILL)
        queen.wait(10)
        procs.start(*qargs)
        procs.forager(router)
        assert fut.result(20) == {"n": 1}
        assert c.status()["counters"]["submitted"] == 1


def test_cli_broadcast_subscribe_drain_and_memory(procs: Procs) -> None:
    _, ep = procs.queen(*HB)
    listener, _ = procs.forager(ep, "--name", "listener", "--subscribe", "alerts.")
    deadline = time.monotonic() + 10
    line = ""
    assert listener.stdout is not None
    os.set_blocking(listener.stdout.fileno(), False)
    while time.monotonic() < deadline and not line:
        r = meshant("broadcast", "--queen", ep, "alerts.fire", '{"level": 3}')
        assert r.returncode == 0, r.stderr
        time.sleep(0.2)
        line = listener.stdout.readline()
    event = json.loads(line)
    assert event["event"] == "broadcast" and event["topic"] == "alerts.fire"
    assert event["data"] == {"level": 3}
    r = meshant("memory", "set", "--queen", ep, "config", '{"rate": 5}')
    assert r.returncode == 0, r.stderr
    r = meshant("memory", "get", "--queen", ep, "config")
    assert json.loads(r.stdout) == {"rate": 5}
    r = meshant("memory", "get", "--queen", ep, "missing")
    assert r.returncode == 1 and "no key" in r.stderr
    r = meshant("drain", "--queen", ep, "nobody")
    assert r.returncode == 1 and "no live forager" in r.stderr
    r = meshant("drain", "--queen", ep, "listener")
    assert r.returncode == 0, r.stderr
    assert listener.wait(15) == 0  # drained (idle) and left cleanly


def test_sigterm_drains_a_busy_forager(procs: Procs) -> None:
    _, ep = procs.queen(*HB)
    busy, _ = procs.forager(ep, "--name", "busy")
    with Client(ep) as c:
        fut = c.submit("sleep", {"seconds": 1.0})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        busy.send_signal(signal.SIGTERM)
        assert fut.result(15) == {"seconds": 1.0}  # finished, not handed back
        assert busy.wait(15) == 0
        ts: dict[str, Any] = c.task_status(fut.task_id)
        assert ts["attempt"] == 1 and c.status()["counters"]["reissued"] == 0


def test_forager_restarted_under_its_name_rejoins(procs: Procs) -> None:
    _, ep = procs.queen(*HB)
    first, _ = procs.forager(ep, "--name", "phoenix")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # Restarted at once: its old self is not yet declared offline, so the new process
    # waits for that instead of giving up on a "name taken" refusal.
    again, info = procs.forager(ep, "--name", "phoenix")
    assert info["name"] == "phoenix" and again.poll() is None
    with Client(ep) as c:
        (rec,) = c.status()["foragers"]
        assert rec["pid"] == again.pid
        assert c.run("echo", "risen", result_timeout=10) == "risen"
