"""The journal: a queen killed at any moment and restarted on it loses nothing."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from meshant import Client, MeshantError, Queen

from .conftest import Procs, wait_for
from .test_cli import meshant

HB = ("--hb-interval", "0.2", "--hb-misses", "5")


class Restartable:
    """A CLI queen on ipc endpoints and a journal in tmp_path, restartable in place."""

    def __init__(self, procs: Procs, tmp_path: Path, *extra: str) -> None:
        self.procs = procs
        self.router = f"ipc://{tmp_path}/r"
        self.journal = str(tmp_path / "q.db")
        self.args = ("queen", "--bind", self.router, "--pub", f"ipc://{tmp_path}/p",
                     "--json", "--journal", self.journal, *HB, *extra)
        self.proc = self.start()

    def start(self) -> subprocess.Popen[str]:
        self.proc, _ = self.procs.start(*self.args)
        return self.proc

    def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.start()


def test_corrupt_or_foreign_journal_is_refused_and_left_alone(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    before = junk.read_bytes()
    with pytest.raises(MeshantError) as info:
        Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=str(junk))
    assert info.value.code == "bad-journal" and "left as it is" in str(info.value)
    assert junk.read_bytes() == before
    foreign = tmp_path / "foreign.db"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE important (x)")
    db.commit()
    db.close()
    with pytest.raises(MeshantError, match="not a meshant journal"):
        Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=str(foreign))
    r = meshant("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                "--journal", str(foreign))
    assert r.returncode == 1 and "not a meshant journal" in r.stderr
    assert "Traceback" not in r.stderr


def test_queen_killed_with_tasks_in_flight_restarts_losing_nothing(procs: Procs,
                                                                    tmp_path: Path) -> None:
    q = Restartable(procs, tmp_path)
    router, journal = q.router, q.journal
    for i in range(3):
        procs.forager(router, "--name", f"f{i}", "--slots", "4")
    n = 1500
    with Client(router, queen_wait=60) as c:
        futs = [c.submit("sleep", {"seconds": 0.002, "n": i}) for i in range(n)]
        wait_for(lambda: c.status()["counters"]["completed"] >= 100, what="work under way")
        done_before = c.status()["counters"]["completed"]
        q.kill_and_restart()  # mid-stream: queued, running and done tasks
        assert done_before < n - 100
        results = [f.result(90) for f in futs]
    assert [r["n"] for r in results] == list(range(n))  # each task's one result, in full
    r = meshant("tasks", "--journal", journal, "--limit", str(n + 10), "--json")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == n and {x["state"] for x in rows} == {"completed"}
    r = meshant("journal", "verify", "--journal", journal)
    assert r.returncode == 0, r.stdout


def test_task_timeline_and_tamper_evidence(procs: Procs, tmp_path: Path) -> None:
    journal = str(tmp_path / "q.db")
    _, ep = procs.queen("--journal", journal)
    procs.forager(ep)
    with Client(ep) as c:
        fut = c.submit("echo", {"x": 1})
        assert fut.result(10) == {"x": 1}
    time.sleep(0.3)
    r = meshant("task", fut.task_id, "--journal", journal, "--verify")
    assert r.returncode == 0, r.stderr
    for state in ("queued", "assigned", "completed"):
        assert state in r.stdout
    assert "history intact" in r.stdout
    db = sqlite3.connect(journal)
    db.execute("UPDATE events SET why='nothing to see' WHERE task_id=? AND seq=2",
               (fut.task_id,))
    db.commit()
    db.close()
    r = meshant("task", fut.task_id, "--journal", journal, "--verify")
    assert r.returncode == 1 and "TAMPERED" in r.stdout and "entry 2" in r.stdout
    r = meshant("journal", "verify", "--journal", journal)
    assert r.returncode == 1 and "altered" in r.stdout
    db = sqlite3.connect(journal)
    db.execute("DELETE FROM events WHERE task_id=? AND seq=3", (fut.task_id,))
    db.commit()
    db.close()
    r = meshant("journal", "verify", "--journal", journal)
    assert "missing" in r.stdout




def test_one_queen_per_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    first = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=path)
    try:
        with pytest.raises(MeshantError, match="in use by another queen"):
            Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=path)
    finally:
        assert first.journal is not None
        first.journal.close()
    Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=path).journal.close()  # type: ignore[union-attr]


def test_idempotency_key_runs_once_even_across_a_restart(procs: Procs, tmp_path: Path) -> None:
    q = Restartable(procs, tmp_path)
    router = q.router
    procs.forager(router, "--name", "f")
    with Client(router, queen_wait=60) as a, Client(router, queen_wait=60) as b:
        first = a.submit("sleep", {"seconds": 0.5, "who": "a"}, key="order-42")
        time.sleep(0.1)
        again = b.submit("sleep", {"seconds": 0.5, "who": "b"}, key="order-42")
        assert first.result(10) == again.result(10) == {"seconds": 0.5, "who": "a"}
        assert a.status()["counters"]["completed"] == 1
        q.kill_and_restart()
        wait_for(lambda: _alive(b), what="the queen back")
        late = b.submit("sleep", {"seconds": 0.5, "who": "late"}, key="order-42")
        assert late.result(10) == {"seconds": 0.5, "who": "a"}  # the recorded result
        assert b.status()["counters"]["submitted"] == 0  # nothing new ran
        assert b.status()["counters"]["idempotent_hits"] == 1


def _alive(c: Client) -> bool:
    try:
        c.status(timeout=1)
        return True
    except MeshantError:
        return False


def test_dead_letters_cli_end_to_end(procs: Procs, tmp_path: Path) -> None:
    q = Restartable(procs, tmp_path, "--retry-base", "0.05")
    router = q.router
    procs.forager(router, "--name", "f")
    r = meshant("submit", "--queen", router, "fail", '{"message": "always"}',
                "--max-attempts", "2", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["message"] == "always"
    task_id = json.loads(r.stdout)["id"]
    r = meshant("dlq", "list", "--queen", router, "--json")
    (item,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert item["task"] == task_id and item["error"]["cause"] == "handler-error"
    assert item["attempts"] == 2
    r = meshant("dlq", "show", "--queen", router, task_id)
    assert json.loads(r.stdout)["payload"] == {"message": "always"}
    # Dead letters are durable: still there after the queen is killed and restarted.
    q.kill_and_restart()
    r = meshant("dlq", "list", "--queen", router, "--json")
    assert [json.loads(x)["task"] for x in r.stdout.splitlines()] == [task_id]
    r = meshant("dlq", "retry", "--queen", router, task_id)
    assert r.returncode == 0 and r.stdout.strip() == f"{task_id}.r1"
    wait_for(lambda: [json.loads(x)["task"] for x in meshant(
        "dlq", "list", "--queen", router, "--json").stdout.splitlines()] == [f"{task_id}.r1"],
        timeout=20, what="the retried task to fail into the queue again")
    r = meshant("dlq", "purge", "--queen", router, "--all")
    assert r.returncode == 0
    assert meshant("dlq", "list", "--queen", router, "--json").stdout.strip() == ""
    r = meshant("dlq", "retry", "--queen", router, "nope")
    assert r.returncode == 1 and "no dead letter" in r.stderr


def test_crash_between_accept_and_result_adopts_the_running_task(procs: Procs,
                                                                  tmp_path: Path) -> None:
    q = Restartable(procs, tmp_path)
    router = q.router
    procs.forager(router, "--name", "steady")
    with Client(router, queen_wait=60) as c:
        fut = c.submit("sleep", {"seconds": 2.0})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", what="accept")
        q.kill_and_restart()  # after accept, before the result
        assert fut.result(20) == {"seconds": 2.0}
        ts = c.task_status(fut.task_id)
        # The forager told the new queen it was still running it: adopted, not rerun.
        assert ts["attempt"] == 1 and ts["state"] == "completed"
        assert c.status()["counters"]["reissued"] == 0


def test_crash_after_the_result_delivers_it_once(procs: Procs, tmp_path: Path) -> None:
    q = Restartable(procs, tmp_path)
    router, journal = q.router, q.journal
    procs.forager(router, "--name", "quick")
    with Client(router, queen_wait=60) as c:
        done = [c.submit("echo", i) for i in range(50)]
        assert [f.result(10) for f in done] == list(range(50))
        pending = c.submit("sleep", {"seconds": 0.3})
        time.sleep(0.35)  # its result is journaled and on its way when the queen dies
        q.kill_and_restart()
        assert pending.result(20) == {"seconds": 0.3}
        # Every earlier task is still exactly once in the journal, completed.
        r = meshant("tasks", "--journal", journal, "--json", "--limit", "100")
        states = [json.loads(x)["state"] for x in r.stdout.splitlines()]
        assert states.count("completed") == 51 and len(states) == 51
