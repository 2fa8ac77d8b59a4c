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
from meshant.core.tasks.model import Task
from meshant.storage import is_postgres, open_journal
from meshant.storage.journal import Journal
from meshant.storage.records import SELECT

from .conftest import Colony, Procs, wait_for
from .test_cli import meshant

HB = ("--hb-interval", "0.2", "--hb-misses", "5")


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A journal to run a test on: an SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "q.db")
    return str(request.getfixturevalue("pg_url"))


def sql(spec: str, statement: str, args: tuple[object, ...] = ()) -> None:
    """Run a statement on a journal behind meshant's back (tampering, for the tests)."""
    if is_postgres(spec):
        import psycopg

        with psycopg.connect(spec, autocommit=True) as conn:
            conn.execute("SET search_path TO meshant")
            conn.execute(statement.replace("?", "%s"), args)
        return
    db = sqlite3.connect(spec)
    db.execute(statement, args)
    db.commit()
    db.close()


class Restartable:
    """A CLI queen on ipc endpoints and a journal (in tmp_path, or the one given),
    restartable in place."""

    def __init__(self, procs: Procs, tmp_path: Path, *extra: str,
                 journal: str | None = None) -> None:
        self.procs = procs
        self.router = f"ipc://{tmp_path}/r"
        self.journal = journal or str(tmp_path / "q.db")
        # On PostgreSQL a restarted queen leads once the killed one's lease lapses.
        lease = ("--lease", "1") if is_postgres(self.journal) else ()
        self.args = ("queen", "--bind", self.router, "--pub", f"ipc://{tmp_path}/p",
                     "--json", "--journal", self.journal, *HB, *lease, *extra)
        self.proc = self.start()

    def start(self) -> subprocess.Popen[str]:
        self.proc, _ = self.procs.start(*self.args)
        return self.proc

    def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.start()


def test_the_restore_says_when_the_newest_event_is(backend: str) -> None:
    # What a taking-over queen's rate limits refill from (core/tasks/rates.py, resume):
    # the newest event's own time, whichever task it belongs to — not the newest row.
    j = open_journal(backend)
    try:
        assert j.restored().last_event is None  # (nothing journaled yet)
    finally:
        j.close()
    for task, seq, ts in (("a", 1, 1000.5), ("b", 1, 1002.25), ("a", 2, 1001.0)):
        sql(backend, "INSERT INTO events VALUES (?, ?, ?, 'queued', '', '')", (task, seq, ts))
    j = open_journal(backend)
    try:
        assert j.restored().last_event == 1002.25
    finally:
        j.close()


@pytest.mark.slow
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


@pytest.mark.slow
def test_queen_killed_with_tasks_in_flight_restarts_losing_nothing(
        procs: Procs, tmp_path: Path, backend: str) -> None:
    q = Restartable(procs, tmp_path, journal=backend)
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


@pytest.mark.slow
def test_task_timeline_and_tamper_evidence(procs: Procs, tmp_path: Path,
                                           backend: str) -> None:
    journal = backend
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
    sql(journal, "UPDATE events SET why='nothing to see' WHERE task_id=? AND seq=2",
        (fut.task_id,))
    r = meshant("task", fut.task_id, "--journal", journal, "--verify")
    assert r.returncode == 1 and "TAMPERED" in r.stdout and "entry 2" in r.stdout
    r = meshant("journal", "verify", "--journal", journal)
    assert r.returncode == 1 and "altered" in r.stdout
    sql(journal, "DELETE FROM events WHERE task_id=? AND seq=3", (fut.task_id,))
    r = meshant("journal", "verify", "--journal", journal)
    assert "missing" in r.stdout
    # Its last entry removed: the chain alone cannot tell, the task row (completed) can.
    sql(journal, "DELETE FROM events WHERE task_id=? AND state='completed'", (fut.task_id,))
    r = meshant("task", fut.task_id, "--journal", journal, "--verify")
    assert r.returncode == 1 and "last entries are missing" in r.stdout, r.stdout




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


@pytest.mark.slow
def test_idempotency_key_runs_once_even_across_a_restart(
        procs: Procs, tmp_path: Path, backend: str) -> None:
    q = Restartable(procs, tmp_path, journal=backend)
    router = q.router
    procs.forager(router, "--name", "f")
    with Client(router, queen_wait=60) as a, Client(router, queen_wait=60) as b:
        first = a.submit("sleep", {"seconds": 0.5, "who": "a"}, key="order-42")
        a.status()  # a round trip: the queen holds a's submission before b's is sent
        again = b.submit("sleep", {"seconds": 0.5, "who": "b"}, key="order-42")
        assert first.result(10) == again.result(10) == {"seconds": 0.5, "who": "a"}
        assert a.status()["counters"]["completed"] == 1
        q.kill_and_restart()
        wait_for(lambda: _alive(b), what="the queen back")
        late = b.submit("sleep", {"seconds": 0.5, "who": "late"}, key="order-42")
        assert late.result(10) == {"seconds": 0.5, "who": "a"}  # the recorded result
        assert b.status()["counters"]["submitted"] == 0  # nothing new ran
        assert b.status()["counters"]["idempotent_hits"] == 1



@pytest.mark.slow
def test_a_killed_queen_loses_no_submission_whose_write_was_deferred(
        procs: Procs, tmp_path: Path, backend: str) -> None:
    # A long --journal-defer, so that the kill surely falls inside it: the young tasks are
    # not in the journal when the queen dies, and the client's re-sending is what keeps them.
    q = Restartable(procs, tmp_path, "--journal-defer", "5", journal=backend)
    router, journal = q.router, q.journal
    with Client(router, queen_wait=60) as c:
        futs = [c.submit("echo", i) for i in range(50)]  # no forager yet: they wait, queued
        acked = c.submit("echo", "acked", ack=True)
        wait_for(lambda: acked.acknowledged, what="the acknowledgement")
        assert c.status()["queued"] == 51
        r = meshant("tasks", "--journal", journal, "--json")
        # Only the acknowledged submission is durable yet.
        assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == [acked.task_id]
        q.kill_and_restart()
        procs.forager(router, "--name", "late")
        assert [f.result(30) for f in futs] == list(range(50))
        assert acked.result(30) == "acked"
        assert c.status()["counters"]["completed"] == 51
    r = meshant("tasks", "--journal", journal, "--json", "--limit", "100")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 51 and {x["state"] for x in rows} == {"completed"}
    assert meshant("journal", "verify", "--journal", journal).returncode == 0

def _alive(c: Client) -> bool:
    try:
        c.status(timeout=1)
        return True
    except MeshantError:
        return False


@pytest.mark.slow
def test_dead_letters_cli_end_to_end(procs: Procs, tmp_path: Path, backend: str) -> None:
    q = Restartable(procs, tmp_path, "--retry-base", "0.05", journal=backend)
    router = q.router
    procs.forager(router, "--name", "f")
    r = meshant("submit", "--queen", router, "fail", '{"message": "always"}',
                "--max-attempts", "2", "--retry-on", "*", "--json")
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


@pytest.mark.slow
def test_crash_between_accept_and_result_adopts_the_running_task(
        procs: Procs, tmp_path: Path, backend: str) -> None:
    q = Restartable(procs, tmp_path, journal=backend)
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


@pytest.mark.slow
def test_crash_after_the_result_delivers_it_once(
        procs: Procs, tmp_path: Path, backend: str) -> None:
    q = Restartable(procs, tmp_path, journal=backend)
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


# -- a bounded journal, restarts that stay light, schema 2 ---------------------------------

def _finished(i: int, *, key: str | None = None, client: str = "alice",
              dead: bool = False, **kw: object) -> Task:
    """A scheduler Task as the queen would journal it once final."""
    now = time.monotonic()
    t = Task(id=f"t{i}", capability="echo", payload={"n": i, "pad": "x" * 200},
             client_name=client, key=key, **kw)  # type: ignore[arg-type]
    t.submitted = now
    t.attempt = 1
    t.state = "failed" if dead else "completed"
    t.history = [(now, "queued", "submitted"), (now, "assigned", "f1"),
                 (now, "accepted", "f1"), (now, t.state, "")]
    body: dict[str, object] = ({"error": {"code": "handler-error", "message": "no"}} if dead
                               else {"result": {"n": i}})
    t.final = {**body, "task": t.id, "state": t.state, "attempt": 1, "seq": 1}
    t.dead = dead
    return t


def _write(path: Path | str, tasks: list[Task], batch: int = 500) -> None:
    j = open_journal(str(path))
    try:
        for k in range(0, len(tasks), batch):
            j.record(tasks[k:k + batch], time.time() - time.monotonic())
    finally:
        j.close()


def _wal_size(path: Path) -> int:
    try:
        return Path(f"{path}-wal").stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_wal_stays_bounded_while_many_records_are_written(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    limit = 1 << 20
    j = Journal(path, wal_limit=limit)
    try:
        n = 0
        for _ in range(8):  # each round writes past the limit: 8 times over in all
            deadline = time.monotonic() + 30
            before = j.truncations
            # Until the file is well over, or the checkpoint thread has already seen it
            # over and rewound the log (it may do so while we write).
            while _wal_size(path) < 2 * limit and j.truncations == before:
                assert time.monotonic() < deadline, "the WAL never grew"
                j.record([_finished(i) for i in range(n, n + 100)],
                         time.time() - time.monotonic())
                n += 100
            # The checkpoint thread brings it back under the bound, the writer never waits
            # for it.
            wait_for(lambda: _wal_size(path) <= limit and j.truncations > before,  # noqa: B023
                     what="the WAL back under its bound")
        assert j.truncations >= 8
        assert j.db.execute("SELECT count(*) FROM tasks").fetchone()[0] == n
    finally:
        j.close()
    assert _wal_size(path) == 0
    j = Journal(path, readonly=True)
    assert len(j.tasks(limit=n + 1)) == n and j.verify() == []
    j.close()


def test_pruning_runs_on_the_journal_thread_not_the_queens_loop(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _write(path, [_finished(i) for i in range(40)] + [_finished(99, dead=True)])
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=str(path),
              retention_count=10)
    assert q.journal is not None
    try:
        # Not started: no loop runs, and the journal's own thread prunes all the same.
        wait_for(lambda: q.journal.pruned == 30, what="the prune")  # type: ignore[union-attr]
        rows = q.journal.tasks(limit=100)
        assert len(rows) == 11 and "t99" in {r["id"] for r in rows}  # a dead letter stays
        assert not hasattr(q, "_next_prune")
    finally:
        q.journal.close()


def test_restart_keeps_finished_tasks_on_disk_and_answers_from_there(
        tmp_path: Path, colony: Colony, backend: str) -> None:
    path = backend
    tasks = [_finished(i, key=f"order-{i}") for i in range(3000)]
    queued = Task(id="waiting", capability="echo", payload={"w": 1}, client_name="alice")
    queued.submitted = time.monotonic()
    queued.history = [(queued.submitted, "queued", "submitted")]
    _write(path, [*tasks, queued])
    q = colony.start_queen(journal=str(path))
    wait_for(lambda: q.role == "leader", what="the queen to lead")
    assert len(q.scheduler.done) == 0 and not q.scheduler.by_key  # nothing final in memory
    assert q.restored == 1 and "waiting" in q.scheduler.tasks
    c = colony.client(name="alice", queen_wait=10)
    # An idempotency key whose task finished before the restart: the original result,
    # from the journal, and nothing runs (no forager is even there to run it).
    again = c.submit("echo", {"n": "new"}, key="order-1234")
    assert again.result(10) == {"n": 1234}
    st = c.status()["counters"]
    assert st["submitted"] == 0 and st["idempotent_hits"] == 1
    # A finished task's status, with its result for its submitter (catch-up).
    ts = c.task_status("t42")
    assert ts["state"] == "completed" and ts["final"]["result"] == {"n": 42}
    assert [h[1] for h in ts["history"]] == ["queued", "assigned", "accepted", "completed"]
    assert len(q.scheduler.done) == 0  # looked up, not loaded
    # A finished task's id is still taken (the archive index says the journal holds it).
    assert q.core.tasks.taken("t7") and not q.core.tasks.taken("t7-never")
    # The unfinished one still runs.
    colony.forager({"echo": lambda x: x}, name="f")
    wait_for(lambda: c.task_status("waiting")["state"] == "completed", what="the queued task")


def test_a_version_1_journal_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA_V1)
    db.executemany("INSERT INTO meta VALUES (?, ?)", [
        ("app", "meshant-journal"), ("schema_version", "1"), ("created", "0")])
    db.execute("INSERT INTO tasks VALUES ('old', 'echo', NULL, 'alice', 50, NULL, NULL, NULL, "
               "3, 30.0, 'queued', 0, 0, NULL, 1.0, 1.0, NULL, 'k', 0)")
    db.commit()
    db.close()
    ro = Journal(path, readonly=True)  # read as it is, not changed
    (row,) = ro.tasks()
    assert row["id"] == "old" and row["retry_base"] is None and row["retry_cap"] is None
    ro.close()
    assert _meta(path)["schema_version"] == "1"
    j = Journal(path)
    try:
        assert _meta(path)["schema_version"] == "3"
        assert j.memory() == []  # version 3's table, empty
        (row,) = j.unfinished()
        assert row["id"] == "old" and row["idem_key"] == "k" and row["retry_base"] is None
        j.record([_finished(1, retry_base=0.25, retry_cap=2.0)], 0.0)
        # Version 4: partial indexes, which a task written finished never enters, still
        # serve a restart and a key lookup.
        plan = str(j.db.execute("EXPLAIN QUERY PLAN " + SELECT + " WHERE final IS NULL OR "
                                "dead != 0 ORDER BY created").fetchall())
        assert "tasks_open" in plan
        assert "tasks_key" in str(j.db.execute("EXPLAIN QUERY PLAN " + SELECT +
                                               " WHERE idem_key=?", ("k",)).fetchall())
        assert j.find_key("k") is not None and j.has("old") and not j.has("nope")
        r = j.find("t1")
        assert r is not None and (r["retry_base"], r["retry_cap"]) == (0.25, 2.0)
    finally:
        j.close()
    Journal(path).close()  # opening a current journal again changes nothing
    assert _meta(path)["schema_version"] == "3"


def _meta(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()


def test_retry_policy_survives_a_restart_and_dlq_retry(tmp_path: Path, backend: str) -> None:
    path = backend
    queued = Task(id="q", capability="echo", client_name="alice", retry_base=0.25,
                  retry_cap=1.5)
    queued.submitted = time.monotonic()
    queued.history = [(queued.submitted, "queued", "submitted")]
    _write(path, [queued, _finished(1, dead=True, key="once", retry_base=0.3, retry_cap=4.0,
                                    priority=7, max_attempts=5)])
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=str(path))
    if q.leadership is not None:
        q.start()  # a PostgreSQL queen restores once it leads
        wait_for(lambda: q.role == "leader", what="the queen to lead")
        q.stop()
    j = q.journal if q.leadership is None else open_journal(str(path))
    try:
        s = q.scheduler
        s.archive = j  # (the stopped queen closed its own)
        t = s.tasks["q"]
        assert (t.retry_base, t.retry_cap) == (0.25, 1.5)
        dead = s.dlq["t1"]
        assert (dead.retry_base, dead.retry_cap) == (0.3, 4.0)
        new = s.dlq_retry("t1", b"c", "bob", time.monotonic())
        assert new.id == "t1.r1" and new.key is None  # not the key: that stays the original's
        assert (new.retry_base, new.retry_cap, new.priority, new.max_attempts) == (
            0.3, 4.0, 7, 5)
        assert new.payload == {"n": 1, "pad": "x" * 200}
        j.record(s.changed.values(), time.time() - time.monotonic())
        r = j.find("t1.r1")
        assert r is not None and (r["retry_base"], r["retry_cap"]) == (0.3, 4.0)
        assert j.find("t1")["dead"] == 0  # type: ignore[index]
        assert j.verify() == []
    finally:
        j.close()


_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    capability TEXT NOT NULL,
    payload BLOB,
    client_name TEXT NOT NULL,
    priority INTEGER NOT NULL,
    timeout REAL,
    to_name TEXT,
    labels BLOB,
    max_attempts INTEGER NOT NULL,
    wait REAL NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    tries INTEGER NOT NULL,
    forager TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    final BLOB,
    idem_key TEXT,
    dead INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tasks_key ON tasks (idem_key);
CREATE INDEX tasks_state ON tasks (state);
CREATE TABLE events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    state TEXT NOT NULL,
    why TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
"""


def test_the_id_filter_never_says_no_to_an_id_it_was_given() -> None:
    from meshant.core.journal.idfilter import IdFilter

    f = IdFilter(capacity=2000)
    ids = [f"task-{i}" for i in range(2000)]
    f.update(ids)
    assert all(i in f for i in ids) and not f.full
    false_pos = sum(f"other-{i}" in f for i in range(20_000))
    assert false_pos < 20_000 * 0.03  # ~1 % at capacity
    assert f.size < 4 * 1024  # bytes: ~1.6 bytes an id
    f.add("one-more")
    assert f.full  # past its capacity: its owner rebuilds a larger one
    assert IdFilter(10).bits >= 8 * 1024


def test_a_journal_url_typo_is_refused_not_made_a_file(tmp_path: Path) -> None:
    for typo in ("postgresql:meshant@127.0.0.1:5432", "postgresq://u@h:1/db",
                 "PostgreSQL://u@h:1/db", "mysql://u@h/db"):
        r = meshant("queen", "--bind", f"ipc://{tmp_path}/r", "--pub", f"ipc://{tmp_path}/p",
                    "--journal", typo)
        assert r.returncode == 1 and "looks like a database URL" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # no file made of it


def test_durability_power_fsyncs_every_commit(tmp_path: Path) -> None:
    for mode, expect in (("process", 1), ("power", 2)):  # synchronous NORMAL, FULL
        q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", durability=mode,
                  journal=str(tmp_path / f"{mode}.db"))
        try:
            assert q.journal.db.execute("PRAGMA synchronous").fetchone()[0] == expect
        finally:
            q.journal.close()
    with pytest.raises(MeshantError, match="durability 'disk'"):
        Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", durability="disk")
    r = meshant("queen", "--durability", "disk")
    assert r.returncode == 2 and "'process'" in r.stderr


def test_verify_takes_a_running_tasks_last_note_for_no_missing_entry(tmp_path: Path) -> None:
    # Found by the simulator's weather (#33): a task whose history ends at a note (its
    # progress, a question) while it runs was reported "its last entries are missing"
    # — notes are in the chain, but the task row holds the last *state*.
    from meshant.core.nodes.registry import Node, Registry
    from meshant.core.queen.outbox import Record
    from meshant.core.tasks.scheduler import Scheduler
    from meshant.storage.commit import commit_all

    reg = Registry()
    reg.add(Node(name="f", identity=b"f", role="forager", codec="iacp2", slots=1,
                 tools=frozenset({"echo"})), 0.0)
    s = Scheduler(reg)
    s.track_changes = True
    s.submit(Task(id="t1", capability="echo"), 0.0)
    s.dispatch(0.0)
    att = s.attempts["t1.1"]
    s.progress(att, {"fraction": 0.5, "n": 1}, 0.1)
    j = Journal(str(tmp_path / "j.db"))
    commit_all(j, [Record(list(s.changed.values()))], 1e9)
    rows = j.find("t1", events=True)
    assert rows is not None and rows["events"][-1]["state"] == "progress"
    assert j.verify() == []
    j.close()


def test_plain_and_full_task_rows_read_back_alike(tmp_path: Path, backend: str) -> None:
    # A task whose optional columns are all empty is written by a shorter statement (the
    # sqlite3 module binds None slowly): each row shape must read back as it was, and
    # an upsert of a row already there (a batch written again) must leave it whole.
    from meshant.storage.records import TaskLog

    j = open_journal(backend)
    try:
        plain = Task(id="plain", capability="echo", payload={"x": 1}, client_name="c")
        full = Task(id="full", capability="echo", payload=[2], client_name="c",
                    timeout=5.0, to="f1", key="k-1", retry_base=0.5, retry_cap=4.0,
                    retry_on=("ValueError",), cost=3.0, concurrency=("tenant", 2))
        for t in (plain, full):
            t.history = [(1.0, "queued", "submitted")]
        batch = TaskLog(lambda _id: (0, "")).prepare([plain, full], 1e9, 1e9 + 1)
        assert [r[0] for r in batch.plain] == ["plain"]
        assert [r[0] for r in batch.inserts] == ["full"]
        j.write(batch)
        j.write(batch)  # (the same rows again: its first commit's answer was lost)
        p_row, f_row = j.find("plain"), j.find("full")
        assert p_row is not None and f_row is not None
        assert p_row["payload"] == {"x": 1} and p_row["timeout"] is None
        assert p_row["idem_key"] is None and p_row["cost"] is None
        assert (f_row["timeout"], f_row["to_name"], f_row["idem_key"], f_row["cost"]) == (
            5.0, "f1", "k-1", 3.0)
        assert f_row["retry_on"] == ["ValueError"] and f_row["concurrency"] == ["tenant", 2]
        assert j.verify() == []
    finally:
        j.close()
