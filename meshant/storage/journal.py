"""The queen's journal: tasks and their lifecycle in SQLite, so a restarted queen loses
nothing. Standard library ``sqlite3`` in WAL mode; the queen writes once per loop turn
(one transaction), never once per message.

Each task's history is a hash chain: every event stores the SHA-256 of the previous
event's hash and its own fields, so an altered or removed entry shows in ``verify``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from meshant.protocol.message import Blob

SCHEMA_VERSION = 2
APP = "meshant-journal"
_BLOB_EXT = 2

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
    retry_cap REAL
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

# Version 1 to 2: a task's own retry policy.
_MIGRATE_2 = """
ALTER TABLE tasks ADD COLUMN retry_base REAL;
ALTER TABLE tasks ADD COLUMN retry_cap REAL;
"""

_COLS = ("id", "capability", "payload", "client_name", "priority", "timeout", "to_name",
         "labels", "max_attempts", "wait", "state", "attempt", "tries", "forager",
         "created", "updated", "final", "idem_key", "dead", "retry_base", "retry_cap")
_SELECT = f"SELECT {', '.join(_COLS)} FROM tasks"
_INSERT = (f"INSERT OR REPLACE INTO tasks ({', '.join(_COLS)}) "
           f"VALUES ({', '.join('?' * len(_COLS))})")


class JournalError(Exception):
    """The journal file cannot be used (corrupt, foreign, or a newer schema)."""


def _pack(v: Any) -> bytes:
    def default(o: Any) -> Any:
        if isinstance(o, Blob):
            return msgpack.ExtType(_BLOB_EXT, bytes(o))
        raise TypeError(f"cannot journal {type(o).__name__}")
    out: bytes = msgpack.packb(v, default=default)
    return out


def _unpack(b: bytes | None) -> Any:
    if b is None:
        return None

    def ext(code: int, data: bytes) -> Any:
        return Blob(data) if code == _BLOB_EXT else msgpack.ExtType(code, data)
    return msgpack.unpackb(b, ext_hook=ext)


def chain(prev: str, task_id: str, seq: int, ts: float, state: str, why: str) -> str:
    return hashlib.sha256(f"{prev}|{task_id}|{seq}|{ts:.6f}|{state}|{why}".encode()).hexdigest()


class Journal:
    """One SQLite file. Not thread-safe: the queen's I/O thread owns it. A thread of the
    journal's own, on its own connection, checkpoints the WAL and prunes (see ``retain``)."""

    def __init__(self, path: str | Path, *, readonly: bool = False,
                 wal_limit: int = WAL_LIMIT) -> None:
        """Open (or create) a journal. ``readonly``: for inspecting one a queen may be
        using (no lock taken, nothing written). ``wal_limit``: see ``WAL_LIMIT``."""
        self.path = str(path)
        self.wal_limit = wal_limit
        self._size_limit = min(JOURNAL_SIZE_LIMIT, wal_limit)
        self.readonly = readonly
        existed = self.path != ":memory:" and Path(self.path).exists() and (
            Path(self.path).stat().st_size > 0)
        self._lock_fd: int | None = None
        self._last: dict[str, tuple[int, str]] = {}
        self._version = SCHEMA_VERSION
        self._retain: tuple[float, int, float] | None = None
        if self.path != ":memory:" and not readonly:
            self._lock()
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                          isolation_level=None, check_same_thread=False)
            else:
                self.db = sqlite3.connect(self.path, isolation_level=None,
                                          check_same_thread=False)
                self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self.db.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: a killed process loses nothing committed; no fsync per
                # commit (only at checkpoints).
                self.db.execute("PRAGMA synchronous=NORMAL")
                # Checkpoints (and their fsync) run on a thread of their own, not in the
                # queen's loop, where they showed as multi-millisecond p99 spikes.
                self.db.execute("PRAGMA wal_autocheckpoint=0")
                self.db.execute(f"PRAGMA journal_size_limit={self._size_limit}")
            if existed or readonly:
                self._check()
            else:
                self._create()
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
        if version < 2 and not self.readonly:
            # In place, in one transaction: a journal is either version 1 or version 2.
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _MIGRATE_2.strip().split(";"):
                    if stmt.strip():
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
        inserts = []
        updates = []
        events = []
        now = time.time()
        for t in tasks:
            forager = t.current.node.name if t.current is not None else None
            final = _pack(t.final) if t.final is not None else None
            if t.logged == 0 and not t.restored:
                # First sight of the task: the whole row, payload included (only now).
                inserts.append((t.id, t.capability, _pack(t.payload), t.client_name,
                                t.priority, t.timeout, t.to, _pack(t.labels), t.max_attempts,
                                t.wait, t.state, t.attempt, t.tries, forager,
                                t.submitted + to_wall, now, final, t.key, int(t.dead),
                                t.retry_base, t.retry_cap))
            else:
                updates.append((t.state, t.attempt, t.tries, forager, now, final,
                                int(t.dead), t.id))
            seq, prev = self._last.get(t.id, (0, ""))
            if seq == 0 and t.restored and t.id not in self._last:
                seq, prev = self._tail(t.id)  # first write since the restart
            for mono, state, why in t.history[t.logged:]:
                seq += 1
                ts = round(mono + to_wall, 6)
                prev = chain(prev, t.id, seq, ts, state, why)
                events.append((t.id, seq, ts, state, why, prev))
            t.logged = max(len(t.history), 1)
            if t.final is not None:
                self._last.pop(t.id, None)
            else:
                self._last[t.id] = (seq, prev)
        if not (inserts or updates):
            return
        db = self.db
        # IMMEDIATE: the write lock now (waiting out a prune batch or a checkpoint of the
        # checkpoint thread, a few milliseconds), never a stale snapshot to upgrade.
        db.execute("BEGIN IMMEDIATE")
        try:
            if inserts:
                db.executemany(_INSERT, inserts)
            if updates:
                db.executemany("UPDATE tasks SET state=?, attempt=?, tries=?, forager=?, "
                               "updated=?, final=?, dead=? WHERE id=?", updates)
            db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?)", events)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _tail(self, task_id: str) -> tuple[int, str]:
        row = self.db.execute("SELECT seq, hash FROM events WHERE task_id=? ORDER BY seq DESC "
                              "LIMIT 1", (task_id,)).fetchone()
        return (row[0], row[1]) if row else (0, "")

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
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            gone += len(ids)
        return gone

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop.set()
            self._wake.set()
            self._checkpointer.join(5)
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.db.close()
        self._unlock()

    # -- reading ------------------------------------------------------------------------

    _COLS = _COLS

    @property
    def _select(self) -> str:
        if self._version >= 2:
            return _SELECT
        # A version-1 journal opened read-only (not migrated): no retry policy columns.
        return _SELECT.replace("retry_base, retry_cap", "NULL, NULL")

    def _row(self, r: tuple[Any, ...]) -> dict[str, Any]:
        d = dict(zip(self._COLS, r, strict=True))
        for k in ("payload", "labels", "final"):
            d[k] = _unpack(d[k])
        return d

    def unfinished(self) -> list[dict[str, Any]]:
        """What a restarted queen must hold in memory, oldest first: the unfinished
        tasks, and the dead letters (final, failed, in the dead-letter queue). Other
        final tasks stay on disk: ``find`` and ``find_key`` look them up on demand."""
        rows = self.db.execute(self._select + " WHERE final IS NULL OR dead != 0 "
                               "ORDER BY created").fetchall()
        return [self._row(r) for r in rows]

    def find(self, task_id: str, *, events: bool = False) -> dict[str, Any] | None:
        """One task's row (``final`` included), or None; with ``events``, its history
        too (as ``task`` gives it)."""
        r = self.db.execute(self._select + " WHERE id=?", (task_id,)).fetchone()
        if r is None:
            return None
        d = self._row(r)
        if events:
            d["events"] = self._events(task_id)
        return d

    def find_key(self, key: str) -> dict[str, Any] | None:
        """The newest task submitted with idempotency key ``key``, or None."""
        r = self.db.execute(self._select + " WHERE idem_key=? ORDER BY created DESC LIMIT 1",
                            (key,)).fetchone()
        return self._row(r) if r is not None else None

    def has(self, task_id: str) -> bool:
        """Whether the journal holds a task with this id (cheap: the primary key)."""
        return self.db.execute("SELECT 1 FROM tasks WHERE id=?",
                               (task_id,)).fetchone() is not None

    def _events(self, task_id: str) -> list[dict[str, Any]]:
        return [dict(zip(("seq", "ts", "state", "why", "hash"), e, strict=True))
                for e in self.db.execute("SELECT seq, ts, state, why, hash FROM events "
                                         "WHERE task_id=? ORDER BY seq", (task_id,))]

    def tasks(self, state: str | None = None, capability: str | None = None,
              limit: int = 1000) -> list[dict[str, Any]]:
        q = self._select + " WHERE 1=1"
        args: list[Any] = []
        if state:
            q += " AND state=?"
            args.append(state)
        if capability:
            q += " AND capability=?"
            args.append(capability)
        q += " ORDER BY created DESC LIMIT ?"
        args.append(limit)
        return [self._row(r) for r in self.db.execute(q, args).fetchall()]

    def task(self, task_id: str) -> dict[str, Any] | None:
        return self.find(task_id, events=True)

    def verify(self, task_id: str | None = None) -> list[str]:
        """Problems found in the hash chains (an empty list: intact)."""
        q = "SELECT task_id, seq, ts, state, why, hash FROM events"
        args: tuple[Any, ...] = ()
        if task_id is not None:
            q += " WHERE task_id=?"
            args = (task_id,)
        q += " ORDER BY task_id, seq"
        problems = []
        cur_task, prev, expect = None, "", 1
        for tid, seq, ts, state, why, h in self.db.execute(q, args):
            if tid != cur_task:
                cur_task, prev, expect = tid, "", 1
            if seq != expect:
                problems.append(f"task {tid}: entry {expect} is missing (next is {seq})")
            good = chain(prev, tid, seq, ts, state, why)
            if h != good:
                problems.append(f"task {tid}: entry {seq} ({state}) was altered")
            prev, expect = h, seq + 1
        return problems
