"""What both journal backends write, and how: the task rows, the hash-chained events,
the colony memory rows, gathered into a :class:`Batch`.

A batch is built (``TaskLog.prepare``) before it is written, so a write that fails (the
database went away) can be tried again with the very same rows: the hash chain and the
tasks' ``logged`` marks move once, when the batch is built, never twice.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from meshant.core.memory.model import DELETED
from meshant.protocol.message import Blob

_BLOB_EXT = 2

# The task row, in column order (both backends, every query).
COLS = ("id", "capability", "payload", "client_name", "priority", "timeout", "to_name",
        "labels", "max_attempts", "wait", "state", "attempt", "tries", "forager",
        "created", "updated", "final", "idem_key", "dead", "retry_base", "retry_cap",
        "retry_on", "parent", "wake", "not_before", "concurrency", "cost")
# Columns a journal may lack (added in place since; read as NULL from one opened read-only).
ADDED = {"retry_on": "BLOB", "parent": "TEXT", "wake": "BLOB", "not_before": "REAL",
         "concurrency": "BLOB", "cost": "REAL"}
SELECT = f"SELECT {', '.join(COLS)} FROM tasks"
# An upsert both SQLite (3.24+) and PostgreSQL read the same way.
INSERT = (f"INSERT INTO tasks ({', '.join(COLS)}) VALUES ({', '.join('?' * len(COLS))}) "
          "ON CONFLICT (id) DO UPDATE SET "
          + ", ".join(f"{c}=excluded.{c}" for c in COLS[1:]))
# The columns a plain task leaves empty (NULL, their default): a task whose are all empty
# is inserted naming only the others (PLAIN_INSERT), since the sqlite3 module binds None
# slowly (0.24 µs each, its adaptation lookup; an int 0.03) — 12 of 27 on every task
# otherwise. The upsert's SET still names every column (an omitted one is NULL in
# ``excluded``). UPDATE_PLAIN likewise, for a task with no forager and no wake.
OPTIONAL = ("timeout", "to_name", "forager", "idem_key", "retry_base", "retry_cap",
            "retry_on", "parent", "wake", "not_before", "concurrency", "cost")
PLAIN_COLS = tuple(c for c in COLS if c not in OPTIONAL)
PLAIN_INSERT = (f"INSERT INTO tasks ({', '.join(PLAIN_COLS)}) "
                f"VALUES ({', '.join('?' * len(PLAIN_COLS))}) ON CONFLICT (id) DO UPDATE SET "
                + ", ".join(f"{c}=excluded.{c}" for c in COLS[1:]))
UPDATE = ("UPDATE tasks SET state=?, attempt=?, tries=?, forager=?, updated=?, final=?, "
          "dead=?, wake=? WHERE id=?")
UPDATE_PLAIN = ("UPDATE tasks SET state=?, attempt=?, tries=?, forager=NULL, updated=?, "
                "final=?, dead=?, wake=NULL WHERE id=?")
# A batch written twice (its first commit's answer was lost) must not fail on its events.
EVENT = "INSERT INTO events VALUES (?,?,?,?,?,?) ON CONFLICT (task_id, seq) DO NOTHING"
MEM_SET = ("INSERT INTO memory (key, value, expires, seq) VALUES (?,?,?,?) ON CONFLICT (key) "
           "DO UPDATE SET value=excluded.value, expires=excluded.expires, seq=excluded.seq")
MEM_DEL = "DELETE FROM memory WHERE key=?"




def _default(o: Any) -> Any:
    if isinstance(o, Blob):
        return msgpack.ExtType(_BLOB_EXT, bytes(o))
    raise TypeError(f"cannot journal {type(o).__name__}")


_local = threading.local()


def pack(v: Any) -> bytes:
    # One Packer per thread, kept: msgpack.packb makes a Packer (and its buffer) per
    # call, half the cost of packing a small value; a pack that raises leaves it empty.
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(default=_default)
    out: bytes = packer.pack(v)
    return out


def unpack(b: bytes | None) -> Any:
    if b is None:
        return None

    def ext(code: int, data: bytes) -> Any:
        return Blob(data) if code == _BLOB_EXT else msgpack.ExtType(code, data)
    return msgpack.unpackb(bytes(b), ext_hook=ext)


def chain(prev: str, task_id: str, seq: int, ts: float, state: str, why: str) -> str:
    return hashlib.sha256(f"{prev}|{task_id}|{seq}|{ts:.6f}|{state}|{why}".encode()).hexdigest()


@dataclass(slots=True)
class Batch:
    """Rows for one transaction."""

    inserts: list[tuple[Any, ...]] = field(default_factory=list)
    plain: list[tuple[Any, ...]] = field(default_factory=list)  # PLAIN_INSERT's rows
    updates: list[tuple[Any, ...]] = field(default_factory=list)
    plain_updates: list[tuple[Any, ...]] = field(default_factory=list)  # UPDATE_PLAIN's
    events: list[tuple[Any, ...]] = field(default_factory=list)
    mem_set: list[tuple[Any, ...]] = field(default_factory=list)
    mem_del: list[tuple[Any, ...]] = field(default_factory=list)
    # More statements for the same transaction, (SQL with ? placeholders, rows), in
    # order: the task graphs' rows (meshant.storage.graphs),
    # the conversations' (meshant.storage.conversation).
    extra: list[tuple[str, list[tuple[Any, ...]]]] = field(default_factory=list)

    def merge(self, other: Batch) -> None:
        """Add ``other``'s statements after this batch's (one transaction for both), in
        their own order: a memory key deleted by one and set by the next stays set."""
        extra = self.extra
        for sql, rows in ((INSERT, other.inserts), (PLAIN_INSERT, other.plain),
                          (UPDATE, other.updates), (UPDATE_PLAIN, other.plain_updates),
                          (EVENT, other.events), (MEM_SET, other.mem_set),
                          (MEM_DEL, other.mem_del), *other.extra):
            if not rows:
                continue
            if extra and extra[-1][0] == sql:
                # The same statement right after: one executemany (a turn's step records,
                # its updates), in the same order.
                extra[-1][1].extend(rows)
            else:
                extra.append((sql, list(rows)))

    def __bool__(self) -> bool:
        return bool(self.inserts or self.plain or self.updates or self.plain_updates
                    or self.mem_set or self.mem_del or self.extra)

    def statements(self) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """Its statements in order, (SQL with ? placeholders, rows), those with rows:
        the task rows before their events."""
        return [(sql, rows) for sql, rows in (
            (INSERT, self.inserts), (PLAIN_INSERT, self.plain), (UPDATE, self.updates),
            (UPDATE_PLAIN, self.plain_updates), (EVENT, self.events),
            (MEM_SET, self.mem_set), (MEM_DEL, self.mem_del),
            *self.extra) if rows]

    def new_ids(self) -> list[str]:
        """The ids of the tasks it inserts."""
        return [r[0] for r in self.inserts] + [r[0] for r in self.plain]


class TaskLog:
    """The hash chains' tails, per unfinished task, and the building of batches."""

    def __init__(self, tail: Callable[[str], tuple[int, str]]) -> None:
        self._tail = tail  # (seq, hash) of a task's last stored event
        self._last: dict[str, tuple[int, str]] = {}

    def prepare(self, tasks: Iterable[Any], to_wall: float, now: float) -> Batch:
        """The rows for what changed in ``tasks`` (scheduler Task objects); ``to_wall``
        converts their monotonic times to wall-clock ones, ``now`` is the wall time."""
        b = Batch()
        last = self._last
        # States are StrEnum members: the sqlite3 module binds only an exact str directly
        # (a subclass goes through its adaptation lookups, 0.3 µs a value), so each is
        # passed as its plain str.
        for t in tasks:
            forager = t.current.node.name if t.current is not None else None
            final = pack(t.final) if t.final is not None else None
            if t.logged == 0 and not t.restored:
                # First sight of the task: the whole row, payload included (only now).
                if (forager is None and t.timeout is None and t.to is None and t.key is None
                        and t.retry_base is None and t.retry_cap is None and not t.retry_on
                        and t.parent is None and t.wake is None and t.not_before is None
                        and not t.concurrency and t.cost is None):
                    b.plain.append((t.id, t.capability, pack(t.payload), t.client_name,
                                    t.priority, pack(t.labels), t.max_attempts, t.wait,
                                    str(t.state), t.attempt, t.tries, t.submitted + to_wall,
                                    now, final, int(t.dead)))
                else:
                    b.inserts.append((t.id, t.capability, pack(t.payload), t.client_name,
                                      t.priority, t.timeout, t.to, pack(t.labels), t.max_attempts,
                                      t.wait, str(t.state), t.attempt, t.tries, forager,
                                      t.submitted + to_wall, now, final, t.key, int(t.dead),
                                      t.retry_base, t.retry_cap,
                                      pack(list(t.retry_on)) if t.retry_on else None,
                                      t.parent, pack(t.wake) if t.wake is not None else None,
                                      t.not_before,
                                      pack(list(t.concurrency)) if t.concurrency else None,
                                      t.cost))
                if t.final is not None and not t.dead:
                    t.payload = None  # journaled now: memory need not keep it (as _finish)
            elif forager is None and t.wake is None:
                b.plain_updates.append((str(t.state), t.attempt, t.tries, now, final,
                                        int(t.dead), t.id))
            else:
                b.updates.append((str(t.state), t.attempt, t.tries, forager, now, final,
                                  int(t.dead), pack(t.wake) if t.wake is not None else None,
                                  t.id))
            seq, prev = last.get(t.id, (0, ""))
            if seq == 0 and t.restored and t.id not in last:
                seq, prev = self._tail(t.id)  # first write since the restart
            for mono, what, why in t.history[t.logged:]:
                state = str(what)
                seq += 1
                # (Not rounded: the chain hashes it to 6 decimals and a verify reads back
                # this very float, so both format it alike; round() cost 0.4 µs an event.)
                ts = mono + to_wall
                prev = chain(prev, t.id, seq, ts, state, why)
                b.events.append((t.id, seq, ts, state, why, prev))
            # (At least 1: "never written" for a new task. A task taken back from the
            # journal is there already: written with no history yet — a re-sent
            # submission's ack — its first entry must not be skipped later.)
            t.logged = len(t.history) if t.restored else max(len(t.history), 1)
            if t.final is not None:
                last.pop(t.id, None)
            else:
                last[t.id] = (seq, prev)
        return b


def memory_batch(changes: Iterable[tuple[str, Any, float | None, int]]) -> Batch:
    """Rows for colony memory changes: ``(key, value, expires_wall, seq)``; a value of
    ``DELETED`` deletes the key."""
    b = Batch()
    for key, value, expires, seq in changes:
        if value is DELETED:
            b.mem_del.append((key,))
        else:
            b.mem_set.append((key, pack(value), expires, seq))
    return b
