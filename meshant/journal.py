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

from .protocol.message import Blob

SCHEMA_VERSION = 1
APP = "meshant-journal"
_BLOB_EXT = 2

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


class JournalError(Exception):
    """The journal file cannot be used (corrupt, foreign, or a newer schema)."""


def _pack(v: Any) -> bytes:
    def default(o: Any) -> Any:
        if isinstance(o, Blob):
            return msgpack.ExtType(_BLOB_EXT, bytes(o))
        raise TypeError(f"cannot journal {type(o).__name__}")
    return msgpack.packb(v, default=default)


def _unpack(b: bytes | None) -> Any:
    if b is None:
        return None

    def ext(code: int, data: bytes) -> Any:
        return Blob(data) if code == _BLOB_EXT else msgpack.ExtType(code, data)
    return msgpack.unpackb(b, ext_hook=ext)


def chain(prev: str, task_id: str, seq: int, ts: float, state: str, why: str) -> str:
    return hashlib.sha256(f"{prev}|{task_id}|{seq}|{ts:.6f}|{state}|{why}".encode()).hexdigest()


class Journal:
    """One SQLite file. Not thread-safe: the queen's I/O thread owns it."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        """Open (or create) a journal. ``readonly``: for inspecting one a queen may be
        using (no lock taken, nothing written)."""
        self.path = str(path)
        existed = self.path != ":memory:" and Path(self.path).exists() and (
            Path(self.path).stat().st_size > 0)
        self._lock_fd: int | None = None
        self._last: dict[str, tuple[int, str]] = {}
        if self.path != ":memory:" and not readonly:
            self._lock()
        try:
            if readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                          isolation_level=None, check_same_thread=False)
            else:
                self.db = sqlite3.connect(self.path, isolation_level=None,
                                          check_same_thread=False)
                self.db.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: a killed process loses nothing committed; no fsync per
                # commit (only at checkpoints).
                self.db.execute("PRAGMA synchronous=NORMAL")
                # Checkpoints (and their fsync) run on a thread of their own, not in the
                # queen's loop, where they showed as multi-millisecond p99 spikes.
                self.db.execute("PRAGMA wal_autocheckpoint=0")
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
        self._checkpointer: threading.Thread | None = None
        if not readonly and self.path != ":memory:":
            self._checkpointer = threading.Thread(target=self._checkpoints, daemon=True,
                                                  name="meshant-journal-checkpoint")
            self._checkpointer.start()

    def _checkpoints(self, every: float = 1.0) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(every):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass  # busy now: the next round will do
        finally:
            db.close()

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
                                t.submitted + to_wall, now, final, t.key, int(t.dead)))
            else:
                updates.append((t.state, t.attempt, t.tries, forager, now, final,
                                int(t.dead), t.id))
            seq, prev = self._last.get(t.id, (0, ""))
            if seq == 0 and t.logged == 0 and t.restored:
                seq, prev = self._tail(t.id)
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
        db.execute("BEGIN")
        try:
            if inserts:
                db.executemany("INSERT OR REPLACE INTO tasks VALUES "
                               "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", inserts)
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
        ``keep`` final ones. Returns how many went."""
        db = self.db
        old = [r[0] for r in db.execute(
            "SELECT id FROM tasks WHERE final IS NOT NULL AND dead = 0 AND (updated < ? OR id "
            "NOT IN (SELECT id FROM tasks WHERE final IS NOT NULL ORDER BY updated DESC "
            "LIMIT ?))",
            (before, keep))]
        if old:
            db.execute("BEGIN")
            db.executemany("DELETE FROM events WHERE task_id=?", [(i,) for i in old])
            db.executemany("DELETE FROM tasks WHERE id=?", [(i,) for i in old])
            db.execute("COMMIT")
        return len(old)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._stop.set()
            self._checkpointer.join(5)
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.db.close()
        self._unlock()

    # -- reading ------------------------------------------------------------------------

    _COLS = ("id", "capability", "payload", "client_name", "priority", "timeout", "to_name",
             "labels", "max_attempts", "wait", "state", "attempt", "tries", "forager",
             "created", "updated", "final", "idem_key", "dead")

    def _row(self, r: tuple[Any, ...]) -> dict[str, Any]:
        d = dict(zip(self._COLS, r, strict=True))
        for k in ("payload", "labels", "final"):
            d[k] = _unpack(d[k])
        return d

    def unfinished(self) -> list[dict[str, Any]]:
        """Tasks a restarted queen must take back, oldest first; plus the final ones
        (their results may not have reached the client)."""
        rows = self.db.execute("SELECT * FROM tasks ORDER BY created").fetchall()
        return [self._row(r) for r in rows]

    def tasks(self, state: str | None = None, capability: str | None = None,
              limit: int = 1000) -> list[dict[str, Any]]:
        q = "SELECT * FROM tasks WHERE 1=1"
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
        r = self.db.execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
        if r is None:
            return None
        d = self._row(r)
        d["events"] = [dict(zip(("seq", "ts", "state", "why", "hash"), e, strict=True))
                       for e in self.db.execute("SELECT seq, ts, state, why, hash FROM events "
                                                "WHERE task_id=? ORDER BY seq", (task_id,))]
        return d

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
