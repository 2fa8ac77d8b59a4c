"""The queen's journal: tasks and their lifecycle in SQLite, so a restarted queen loses
nothing. Standard library ``sqlite3`` in WAL mode; the queen writes once per loop turn
(one transaction), never once per message.

Each task's history is a hash chain: every event stores the SHA-256 of the previous
event's hash and its own fields, so an altered or removed entry shows in ``verify``.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshant.errors import JournalError
from meshant.storage import conversation, graphs, schedules
from meshant.storage.reading import JournalReader
from meshant.storage.records import (
    ADDED,
    COLS,
    SELECT,
    Batch,
    TaskLog,
    memory_batch,
)
from meshant.storage.records import chain as chain  # re-exported: tests and tools use it

SCHEMA_VERSION = 3
APP = "meshant-journal"

# The WAL's bound. The checkpoint thread copies the WAL into the database every second
# (PASSIVE: it never blocks the queen). Under steady writes a PASSIVE checkpoint never
# quite catches up, so the log never rewinds and the -wal file would grow without end
# (942 MiB after 300k tasks). So the thread also looks at the file every WAL_POLL
# seconds, and once it is over WAL_LIMIT, checkpoints it all and rewinds the log
# (``Journal._bound_wal``), and the queen's next commit cuts the file back to
# JOURNAL_SIZE_LIMIT. The -wal file stays under about
#     WAL_LIMIT + what the queen writes in the time of one checkpoint (~1 s)
# (measured: at most 86 MiB while writing 300k tasks at 5-14k a second), unless a
# reader holds an old snapshot for long (``meshant tasks`` on a huge journal): the next
# poll tries again. The queen's writer waits for the checkpoint thread only while it
# rewinds the log: a few milliseconds, at most TRUNCATE_WAIT_MS + that.
WAL_LIMIT = 64 * 1024 * 1024
WAL_POLL = 0.2
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
CHECKPOINT_EVERY = 1.0
# How long either side waits for the other's lock. The queen's transactions and the
# checkpoint thread's (one prune batch, one TRUNCATE) are each a few milliseconds.
BUSY_TIMEOUT_MS = 5000
TRUNCATE_WAIT_MS = 100
TRUNCATE_RESIDUE = 256  # WAL frames (pages) left to copy under the writer lock
PRUNE_BATCH = 500

_SCHEMA = """
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
    dead INTEGER NOT NULL DEFAULT 0,
    retry_base REAL,
    retry_cap REAL,
    retry_on BLOB
);
CREATE INDEX tasks_key ON tasks (idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX tasks_open ON tasks (created) WHERE final IS NULL OR dead != 0;
CREATE TABLE events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    state TEXT NOT NULL,
    why TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
CREATE TABLE memory (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    expires REAL,
    seq INTEGER NOT NULL
);
"""

# Each version's steps, applied in order to an older journal (in one transaction).
_MIGRATIONS = {
    # A task's own retry policy.
    2: ("ALTER TABLE tasks ADD COLUMN retry_base REAL",
        "ALTER TABLE tasks ADD COLUMN retry_cap REAL"),
    # The colony memory survives a restart.
    3: ("CREATE TABLE memory (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL, "
        "seq INTEGER NOT NULL)",),
}

class Journal(JournalReader):
    """One SQLite file. Not thread-safe: the queen's I/O thread owns it. A thread of the
    journal's own, on its own connection, checkpoints the WAL and prunes (see ``retain``)."""

    def __init__(self, path: str | Path, *, readonly: bool = False,
                 wal_limit: int = WAL_LIMIT, durability: str = "process",
                 connection: sqlite3.Connection | None = None) -> None:
        """Open (or create) a journal. ``readonly``: for inspecting one a queen may be
        using (no lock taken, nothing written). ``wal_limit``: see ``WAL_LIMIT``.
        ``durability``: ``process`` (WAL, ``synchronous=NORMAL``: a killed queen loses
        nothing committed; a power cut may lose the last commits) or ``power``
        (``synchronous=FULL``: the WAL is fsynced at every commit, one a loop turn).
        ``connection``: an open in-memory database to use (``path`` ``:memory:``), kept
        open on ``close``: the simulator's disk, which outlives a killed queen."""
        self.path = str(path)
        self.wal_limit = wal_limit
        self._size_limit = min(JOURNAL_SIZE_LIMIT, wal_limit)
        self.readonly = readonly
        existed = self.path != ":memory:" and Path(self.path).exists() and (
            Path(self.path).stat().st_size > 0)
        self._lock_fd: int | None = None
        self._log = TaskLog(self._tail)
        self._version = SCHEMA_VERSION
        self._retain: tuple[float, int, float] | None = None
        if self.path != ":memory:" and not readonly:
            self._lock()
        self._own_db = connection is None
        if connection is not None:
            # The tables may be there already: a journal opened again on the same disk.
            existed = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone() is not None
        try:
            if connection is not None:
                self.db = connection
            elif readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                          isolation_level=None, check_same_thread=False)
            else:
                self.db = sqlite3.connect(self.path, isolation_level=None,
                                          check_same_thread=False)
                self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self.db.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: a killed process loses nothing committed; no fsync per
                # commit (only at checkpoints). FULL: an fsync per commit.
                self.db.execute("PRAGMA synchronous=" + (
                    "FULL" if durability == "power" else "NORMAL"))
                # Checkpoints (and their fsync) run on a thread of their own, not in the
                # queen's loop, where they showed as multi-millisecond p99 spikes.
                self.db.execute("PRAGMA wal_autocheckpoint=0")
                self.db.execute(f"PRAGMA journal_size_limit={self._size_limit}")
            if existed or readonly:
                self._check()
            else:
                self._create()
            if not readonly:
                self._partial_indexes()
                self._added_columns()
            if not readonly:  # conversations' tables (storage.conversation), if missing
                conversation.create(self.db.execute)
            if not readonly:
                for stmt in (*graphs.TABLES, *schedules.TABLES):  # additive, idempotent
                    self.db.execute(stmt)
        except sqlite3.DatabaseError as e:
            self._unlock()
            raise JournalError(f"{self.path} is not a usable meshant journal ({e}); it was "
                               "left as it is: move it away or give another --journal") from None
        except JournalError:
            self.db.close()
            self._unlock()
            raise
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.rounds = 0  # checkpoint-thread rounds, truncations and pruned tasks, for tests
        self.truncations = 0
        self.pruned = 0
        self._rewound = False
        self._checkpointer: threading.Thread | None = None
        if not readonly and self.path != ":memory:":
            self._checkpointer = threading.Thread(target=self._checkpoints, daemon=True,
                                                  name="meshant-journal-checkpoint")
            self._checkpointer.start()

    def retain(self, seconds: float, count: int, every: float = 60.0) -> None:
        """Prune (see ``prune``) every ``every`` seconds on the checkpoint thread, off the
        queen's loop: final tasks older than ``seconds`` or beyond the newest ``count``."""
        self._retain = (seconds, count, every)
        self._wake.set()

    def _checkpoints(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        wal = self.path + "-wal"
        next_passive = time.monotonic() + CHECKPOINT_EVERY
        next_prune = 0.0
        try:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA journal_size_limit={self._size_limit}")
            while not self._stop.is_set():
                self._wake.wait(WAL_POLL)
                self._wake.clear()
                if self._stop.is_set():
                    break
                now = time.monotonic()
                try:
                    size = os.stat(wal).st_size
                except OSError:
                    size = 0
                try:
                    if size > self.wal_limit:
                        self._bound_wal(db)
                        next_passive = now + CHECKPOINT_EVERY
                    else:
                        self._rewound = False
                        if now >= next_passive:
                            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                            next_passive = now + CHECKPOINT_EVERY
                except sqlite3.Error:
                    pass  # busy now: the next round will do
                if self._retain is not None and now >= next_prune:
                    seconds, count, every = self._retain
                    next_prune = now + every
                    try:
                        self.pruned += self._prune(db, time.time() - seconds, count)
                    except sqlite3.Error:
                        next_prune = now + 1.0  # busy: try again soon
                self.rounds += 1
        finally:
            db.close()

    def _bound_wal(self, db: sqlite3.Connection) -> None:
        """The -wal file is over the limit: checkpoint it all and start it over.

        PASSIVE checkpoints do the copying without blocking the queen, again while the
        queen keeps appending; the database is fsynced from here; only then RESTART takes
        the writer lock, to copy the last few pages and rewind the log (measured: a few
        milliseconds). It waits at most TRUNCATE_WAIT_MS for a reader on an old snapshot,
        else gives up until the next poll. The queen's next commit then cuts the file
        to JOURNAL_SIZE_LIMIT (``PRAGMA journal_size_limit``); if none comes (an idle
        queen), the next poll truncates the empty log."""
        prev = -1
        for _ in range(4):
            _, log, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if 0 <= log - prev <= TRUNCATE_RESIDUE or self._stop.is_set():
                break
            prev = log
        # Rewound last time and still over: no commit came since to cut the file.
        mode = "TRUNCATE" if self._rewound else "RESTART"
        if mode == "RESTART":
            self._flush_to_disk()
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        db.execute(f"PRAGMA busy_timeout={TRUNCATE_WAIT_MS}")
        try:
            busy = db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()[0]
        finally:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.truncations += not busy
        self._rewound = not busy and mode == "RESTART"

    def _flush_to_disk(self) -> None:
        # fsync the database from here, so the fsync the RESTART checkpoint does while it
        # holds the writer lock finds (almost) nothing left to write. Through the fd that
        # holds the flock, open as long as the journal: opening and closing another fd
        # on the file would drop SQLite's POSIX locks on it.
        if self._lock_fd is not None:
            try:
                os.fsync(self._lock_fd)
            except OSError:
                pass

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _lock(self) -> None:
        # One queen per journal: a second one would reissue the first one's tasks.
        # flock is separate from the POSIX locks SQLite itself takes on the file.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise JournalError(f"{self.path} is in use by another queen (one queen per "
                               "journal)") from None
        self._lock_fd = fd

    def _added_columns(self) -> None:
        """Columns added since a journal was made (``records.ADDED``): in place, nullable,
        with no schema version of their own, so an older meshant still opens it."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(tasks)")}
        for col, kind in ADDED.items():
            if col not in have:
                self.db.execute(f"ALTER TABLE tasks ADD COLUMN {col} {kind}")

    def _partial_indexes(self) -> None:
        """Indexes a task finished in its first write never enters, so each commit writes
        fewer pages (docs/performance.md): ``tasks_open`` is what a restart reads
        (``unfinished``), ``tasks_key`` holds keyed rows only (``idem_key = ?`` uses it).
        Replaces a journal's older full indexes once, in place; no schema version of its
        own, so an older meshant still opens the journal (its queries only scan more)."""
        sql = dict(self.db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='index' AND tbl_name='tasks'"))
        if "tasks_state" in sql or "WHERE" not in (sql.get("tasks_key") or ""):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("DROP INDEX IF EXISTS tasks_state")
                self.db.execute("DROP INDEX IF EXISTS tasks_key")
                self.db.execute("CREATE INDEX tasks_key ON tasks (idem_key) "
                                "WHERE idem_key IS NOT NULL")
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        self.db.execute("CREATE INDEX IF NOT EXISTS tasks_open ON tasks (created) "
                        "WHERE final IS NULL OR dead != 0")

    def _create(self) -> None:
        self.db.executescript(_SCHEMA)
        self.db.executemany("INSERT INTO meta VALUES (?, ?)", [
            ("app", APP), ("schema_version", str(SCHEMA_VERSION)),
            ("created", f"{time.time():.3f}")])

    def _check(self) -> None:
        try:
            meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError:
            raise JournalError(f"{self.path} is an SQLite file but not a meshant journal; it "
                               "was left as it is") from None
        if meta.get("app") != APP:
            raise JournalError(f"{self.path} is not a meshant journal; it was left as it is")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise JournalError(f"{self.path} has journal schema {version}; this meshant "
                               f"reads up to {SCHEMA_VERSION}: upgrade meshant")
        self._version = version
        if version < SCHEMA_VERSION and not self.readonly:
            # In place, in one transaction: a journal is at one version or the next.
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    for stmt in _MIGRATIONS[v]:
                        self.db.execute(stmt)
                self.db.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                                (str(SCHEMA_VERSION),))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self._version = SCHEMA_VERSION

    # -- writing ------------------------------------------------------------------------

    def record(self, tasks: Iterable[Any], to_wall: float) -> None:
        """Write what changed in ``tasks`` (scheduler Task objects) in one transaction.

        ``to_wall`` converts the scheduler's monotonic times to wall-clock times.
        """
        self.write(self.task_batch(tasks, to_wall))

    def task_batch(self, tasks: Iterable[Any], to_wall: float) -> Batch:
        """The rows ``record`` writes, to write with others in one transaction."""
        return self._noted(self._log.prepare(tasks, to_wall, time.time()))

    def record_memory(self, changes: Iterable[tuple[str, Any, float | None, int]]) -> None:
        """Write colony memory changes: ``(key, value, expires_wall, seq)``, a value of
        ``records.DELETED`` for a deletion."""
        self.write(memory_batch(changes))

    def write(self, batch: Batch) -> None:
        """One batch in one transaction."""
        if not batch:
            return
        db = self.db
        # IMMEDIATE: the write lock now (waiting out a prune batch or a checkpoint of the
        # checkpoint thread, a few milliseconds), never a stale snapshot to upgrade.
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in batch.statements():
                db.executemany(sql, rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def prune(self, before: float, keep: int) -> int:
        """Forget final tasks updated before ``before`` (wall), and beyond the newest
        ``keep`` final ones. Returns how many went. (A queen does it on the checkpoint
        thread: see ``retain``.)"""
        return self._prune(self.db, before, keep)

    def _prune(self, db: sqlite3.Connection, before: float, keep: int) -> int:
        # The query only reads (WAL: it blocks nobody); the deletes go in small
        # transactions so the queen's writer never waits for more than one of them.
        old = [r[0] for r in db.execute(
            "SELECT id FROM tasks WHERE final IS NOT NULL AND dead = 0 AND (updated < ? OR id "
            "NOT IN (SELECT id FROM tasks WHERE final IS NOT NULL ORDER BY updated DESC "
            "LIMIT ?))",
            (before, keep))]
        gone = 0
        for i in range(0, len(old), PRUNE_BATCH):
            if self._stop.is_set():
                break
            ids = old[i:i + PRUNE_BATCH]
            db.execute("BEGIN IMMEDIATE")
            try:
                # Still final and not a dead letter, now that this transaction has the lock.
                db.executemany("DELETE FROM events WHERE task_id=? AND EXISTS (SELECT 1 FROM "
                               "tasks WHERE id=? AND final IS NOT NULL AND dead = 0)",
                               [(x, x) for x in ids])
                db.executemany("DELETE FROM tasks WHERE id=? AND final IS NOT NULL AND "
                               "dead = 0", [(x,) for x in ids])
                for sql, rows in conversation.prune_rows(ids):  # what belonged to them
                    db.executemany(sql, rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            gone += len(ids)
        db.execute("BEGIN IMMEDIATE")  # ended task graphs go by the same rule
        try:
            for stmt in graphs.PRUNE:
                db.execute(stmt, (before, keep))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return gone

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop.set()
            self._wake.set()
            self._checkpointer.join(5)
        if not self._own_db:
            return  # the connection is its owner's (the simulator's disk)
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.db.close()
        self._unlock()

    # -- reading (the queries are JournalReader's) -----------------------------------------

    def _all(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self.db.execute(sql, args).fetchone()
        return row

    @property
    def _select(self) -> str:
        if not self.readonly and self._version >= 2:
            return SELECT
        # An older journal opened read-only (not migrated): what it lacks is read as NULL
        # (a version-1 journal has no retry policy columns).
        have = {r[1] for r in self.db.execute("PRAGMA table_info(tasks)")}
        return "SELECT " + ", ".join(c if c in have else "NULL" for c in COLS) + " FROM tasks"

    def memory(self) -> list[tuple[str, Any, float | None, int]]:
        if self._version < 3:
            return []  # an older journal opened read-only: no memory table
        return super().memory()
