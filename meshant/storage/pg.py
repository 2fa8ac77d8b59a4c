"""The journal on PostgreSQL (``--journal postgresql://…``): the same tables, the same
hash chains and the same queries as the SQLite journal, in a schema ``meshant`` of the
database, shared by every queen of a colony (one leads: see
:mod:`meshant.storage.leadership`).

Every write of a leader is fenced by its term: its transaction first takes the lease row
``FOR SHARE`` and finds its own term there, or writes nothing and raises
:class:`~meshant.storage.records.Deposed`. A takeover (which bumps the term) waits for a
write in progress and fences every later one. psycopg 3 is an optional dependency
(the ``postgres`` extra).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from meshant.errors import Deposed, JournalError
from meshant.storage import conversation, graphs, schedules
from meshant.storage.reading import JournalReader
from meshant.storage.records import (
    ADDED,
    SELECT,
    Batch,
    TaskLog,
    memory_batch,
)

SCHEMA = "meshant"
SCHEMA_VERSION = 3
APP = "meshant-journal"
CONNECT_TIMEOUT = 2  # seconds: a database that does not answer is retried, not waited for
RETRY_EVERY = 0.25  # seconds between attempts while the database is away
PRUNE_BATCH = 500
LOCK_KEY = 0x6D657368  # pg_advisory_xact_lock key: one queen creates the schema

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    capability TEXT NOT NULL,
    payload BYTEA,
    client_name TEXT NOT NULL,
    priority INTEGER NOT NULL,
    timeout DOUBLE PRECISION,
    to_name TEXT,
    labels BYTEA,
    max_attempts INTEGER NOT NULL,
    wait DOUBLE PRECISION NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    tries INTEGER NOT NULL,
    forager TEXT,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    final BYTEA,
    idem_key TEXT,
    dead INTEGER NOT NULL DEFAULT 0,
    retry_base DOUBLE PRECISION,
    retry_cap DOUBLE PRECISION,
    retry_on BYTEA
);
CREATE INDEX IF NOT EXISTS tasks_key ON tasks (idem_key);
CREATE INDEX IF NOT EXISTS tasks_state ON tasks (state);
CREATE INDEX IF NOT EXISTS tasks_unfinished ON tasks (created) WHERE final IS NULL OR dead != 0;
CREATE TABLE IF NOT EXISTS events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    state TEXT NOT NULL,
    why TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
);
CREATE TABLE IF NOT EXISTS memory (
    key TEXT PRIMARY KEY,
    value BYTEA NOT NULL,
    expires DOUBLE PRECISION,
    seq BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    term BIGINT NOT NULL,
    holder TEXT,
    name TEXT,
    endpoint TEXT,
    pub TEXT,
    expires TIMESTAMPTZ NOT NULL
);
INSERT INTO lease VALUES (1, 0, NULL, NULL, NULL, NULL, '-infinity') ON CONFLICT DO NOTHING;
"""

# The fence: the first statement of a leader's every write. It takes the lease row FOR
# SHARE (a takeover waits for the write; a later write sees the new term) and aborts the
# transaction unless the term is the writer's. A function, so the whole write goes in one
# pipelined round trip and the database decides, not a reply read in between.
DEPOSED = "MS001"
_FENCE = f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.fence(mine BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE now_term BIGINT;
BEGIN
    SELECT term INTO now_term FROM {SCHEMA}.lease WHERE id = 1 FOR SHARE;
    IF now_term IS DISTINCT FROM mine THEN
        RAISE EXCEPTION 'term % is over: queen term % leads now', mine, now_term
            USING ERRCODE = '{DEPOSED}';
    END IF;
END $$;
"""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        from meshant._extras import needs

        raise JournalError(needs("a PostgreSQL journal (psycopg 3)", "postgres")) from None
    return psycopg


def translate(sql: str) -> str:
    """SQLite-style SQL (``?`` placeholders, BLOB/REAL columns) as PostgreSQL reads it."""
    sql = sql.replace("?", "%s")
    sql = re.sub(r"\bBLOB\b", "BYTEA", sql)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def connect(url: str, timeout: float = 5.0, durability: str = "process") -> Any:
    """A connection in autocommit mode with the meshant schema first on its path, that
    never waits for long: ``timeout`` (the lease) bounds every statement, every lock
    wait, a transaction left idle (the server aborts it, releasing its locks: a leader
    cut off mid-write cannot hold the lease row for ever), and a silent network (TCP
    keepalives and user timeout)."""
    psycopg = _psycopg()
    ms = max(100, int(timeout * 1000))
    conn = psycopg.connect(
        url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, keepalives=1,
        keepalives_idle=1, keepalives_interval=1, keepalives_count=max(1, int(timeout)),
        tcp_user_timeout=ms,
        options=f"-c statement_timeout={ms} -c lock_timeout={ms} "
                f"-c idle_in_transaction_session_timeout={ms}"
                + (" -c synchronous_commit=on" if durability == "power" else ""))
    try:
        conn.execute(f"SET search_path TO {SCHEMA}")
    except BaseException:
        conn.close()
        raise
    return conn


class PgJournal(JournalReader):
    """The journal in a PostgreSQL database. Not thread-safe: the queen's I/O thread owns
    it (the leadership thread has a connection of its own).

    ``term``: set by a leader; every write is then fenced by it. ``patience``: called
    while the database is away; as long as it returns True, reads and writes are tried
    again (a leader waits while its lease is valid), else they raise."""

    def __init__(self, url: str, *, readonly: bool = False, timeout: float = 5.0,
                 durability: str = "process") -> None:
        """``durability`` ``power``: every commit flushed to disk by the server
        (``synchronous_commit=on``, its usual default, asked for explicitly); ``process``
        leaves the server's setting as it is."""
        self.url = url
        self.durability = durability
        self.timeout = timeout  # the lease: no statement or lock wait lasts longer
        self.path = redact(url)
        self.readonly = readonly
        self.term: int | None = None
        self.patience: Callable[[], bool] = lambda: False
        self._sql: dict[str, str] = {}
        self._log = TaskLog(self._tail)
        self._ids = None
        self._filter_ids = True  # a primary-key query is a round trip: filter first
        self.pruned = 0
        self._retain: tuple[float, int, float] | None = None
        self._closed = False
        self._pruner: threading.Thread | None = None
        psycopg = self._psycopg = _psycopg()
        self._errors = (psycopg.OperationalError, psycopg.InterfaceError)
        try:
            self.db = connect(url, timeout, durability)
        except self._errors as e:
            raise JournalError(f"cannot reach the journal database {self.path}: "
                               f"{str(e).strip()}") from None
        except psycopg.Error as e:
            raise JournalError(f"cannot use the journal database {self.path}: "
                               f"{str(e).strip()} (give --journal "
                               "postgresql://USER@HOST:PORT/DB)") from None
        try:
            self._prepare_schema()
        except BaseException:
            self.db.close()
            raise

    def _prepare_schema(self) -> None:
        db = self.db
        exists = db.execute("SELECT 1 FROM information_schema.tables WHERE table_schema=%s "
                            "AND table_name='meta'", (SCHEMA,)).fetchone() is not None
        if not exists:
            if self.readonly:
                raise JournalError(f"{self.path} holds no meshant journal (schema {SCHEMA!r}"
                                   " has no tables): start a queen with this --journal first")
            with db.transaction():
                # Two queens starting at once: one creates, the other finds it done.
                db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                db.execute(_DDL)
                db.execute(_FENCE)
                db.execute("INSERT INTO meta VALUES ('app', %s), ('schema_version', %s), "
                           "('created', %s) ON CONFLICT DO NOTHING",
                           (APP, str(SCHEMA_VERSION), f"{time.time():.3f}"))
        elif not self.readonly:
            with db.transaction():  # (a journal made by an older meshant gets it too)
                db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                db.execute(_FENCE)
        if not self.readonly:  # conversations' tables (storage.conversation), if missing
            with db.transaction():  # under the schema lock: two queens may start at once
                db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                conversation.create(lambda sql: db.execute(translate(sql)))
        # Columns added since (records.ADDED). Looked up first: ALTER TABLE takes an
        # exclusive lock on tasks even when the column is there, and a standby opening
        # the journal would stall the leader's every read and write behind it.
        have = {r[0] for r in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'tasks' "
            "AND table_schema = current_schema()").fetchall()}
        missing = [c for c in ADDED if c not in have]
        if missing and not self.readonly:
            with db.transaction():  # in place, nullable
                db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                for col in missing:
                    db.execute(translate(f"ALTER TABLE tasks ADD COLUMN IF NOT EXISTS {col} "
                                         f"{ADDED[col]}"))
            missing = []
        self._missing = missing  # read-only: NULL in their place (_select)
        if not self.readonly:
            with db.transaction():  # task graphs' tables: additive, idempotent
                db.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                for stmt in (*graphs.TABLES, *schedules.TABLES):
                    db.execute(translate(stmt))
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP:
            raise JournalError(f"{self.path} has a schema {SCHEMA!r} that is not a meshant "
                               "journal; it was left as it is")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise JournalError(f"{self.path} has journal schema {version}; this meshant "
                               f"reads up to {SCHEMA_VERSION}: upgrade meshant")

    def reset_chains(self) -> None:
        """Forget the hash chains' tails and the id filter: another queen may have written
        since (a new term). Both are read back when needed."""
        self._log = TaskLog(self._tail)
        self._ids = None

    def retain(self, seconds: float, count: int, every: float = 60.0) -> None:
        """Prune (see ``prune``) every ``every`` seconds, from a thread of its own, while
        this queen leads: final tasks older than ``seconds`` or beyond the newest ``count``."""
        self._retain = (seconds, count, every)
        if self._pruner is None and not self.readonly:
            self._pruner = threading.Thread(target=self._prunes, daemon=True,
                                            name="meshant-journal-prune")
            self._pruner.start()

    # -- the database going away --------------------------------------------------------

    def _q(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = translate(sql)
        return out

    def _retrying(self, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` on a live connection, reconnecting while the database is away and
        ``patience`` allows; then raise JournalError."""
        while True:
            if self._closed:
                raise JournalError(f"the journal {self.path} was closed")
            try:
                if self.db.closed or self.db.broken:
                    self.db = connect(self.url, self.timeout, self.durability)
                return fn()
            except self._errors as e:
                if not self.patience():
                    raise JournalError(f"the journal database {self.path} is unreachable "
                                       f"({what}): {str(e).strip()}") from None
                time.sleep(RETRY_EVERY)

    # -- writing --------------------------------------------------------------------------

    def record(self, tasks: Iterable[Any], to_wall: float) -> None:
        """Write what changed in ``tasks`` in one transaction (see ``write``)."""
        self.write(self.task_batch(tasks, to_wall))

    def task_batch(self, tasks: Iterable[Any], to_wall: float) -> Batch:
        """The rows ``record`` writes, to write with others in one transaction."""
        return self._noted(self._log.prepare(tasks, to_wall, time.time()))

    def record_memory(self, changes: Iterable[tuple[str, Any, float | None, int]]) -> None:
        """Write colony memory changes (as the SQLite journal's ``record_memory``)."""
        self.write(memory_batch(changes))

    def write(self, batch: Batch) -> None:
        """One batch in one transaction, fenced by ``term``. The same batch is written
        again after a lost connection (its rows are upserts; its events are skipped if
        they are in already), so an unanswered commit does no harm."""
        if batch:
            self._retrying(lambda: self._write(batch), "writing")

    def _write(self, batch: Batch) -> None:
        db = self.db
        try:
            # One round trip: the fence, the rows and the commit, pipelined.
            with db.pipeline(), db.transaction(), db.cursor() as cur:
                if self.term is not None:
                    cur.execute("SELECT fence(%s)", (self.term,))
                for sql, rows in batch.statements():
                    cur.executemany(self._q(sql), rows)
        except self._psycopg.Error as e:
            if getattr(e, "sqlstate", None) == DEPOSED:
                raise Deposed(str(e).strip()) from None
            raise

    def prune(self, before: float, keep: int, db: Any = None) -> int:
        """Forget final tasks (not dead letters) updated before ``before`` (wall) and
        beyond the newest ``keep`` final ones, PRUNE_BATCH to a transaction (each short:
        the leader's writes never wait long behind one). Returns how many went."""
        db = db or self.db
        old = [r[0] for r in db.execute(
            "SELECT id FROM tasks WHERE final IS NOT NULL AND dead = 0 AND (updated < %s OR "
            "id NOT IN (SELECT id FROM tasks WHERE final IS NOT NULL ORDER BY updated DESC "
            "LIMIT %s))", (before, keep)).fetchall()]
        gone = 0
        for i in range(0, len(old), PRUNE_BATCH):
            if self._closed:
                break
            ids = old[i:i + PRUNE_BATCH]
            with db.transaction():
                db.execute("DELETE FROM events WHERE task_id = ANY(%s) AND task_id IN (SELECT "
                           "id FROM tasks WHERE id = ANY(%s) AND final IS NOT NULL AND dead = 0)",
                           (ids, ids))
                cur = db.execute("DELETE FROM tasks WHERE id = ANY(%s) AND final IS NOT NULL "
                                 "AND dead = 0", (ids,))
                gone += int(cur.rowcount or 0)
                for sql, rows in conversation.prune_rows(ids):  # what belonged to them
                    db.cursor().executemany(translate(sql), rows)
        with db.transaction():  # ended task graphs go by the same rule
            for stmt in graphs.PRUNE:
                db.execute(self._q(stmt), (before, keep))
        self.pruned += gone
        return gone

    def _prunes(self) -> None:
        """(Its own thread and connection) Prune every ``every`` seconds while this queen
        leads (``patience``): never on the loop, never on the lease's renewals."""
        db = None
        next_at = 0.0
        while not self._closed:
            time.sleep(0.2)
            retain = self._retain
            if retain is None or self.term is None or not self.patience():
                continue
            seconds, count, every = retain
            now = time.monotonic()
            if now < next_at:
                continue
            next_at = now + every
            try:
                if db is None or db.closed or db.broken:
                    db = connect(self.url, self.timeout)
                self.prune(time.time() - seconds, count, db=db)
            except Exception:  # the database is away or busy: next time
                next_at = now + 1.0
        if db is not None:
            db.close()

    def close(self) -> None:
        self._closed = True
        if self._pruner is not None:
            self._pruner.join(5)
        try:
            self.db.close()
        except Exception:  # closing a broken connection
            pass

    # -- reading --------------------------------------------------------------------------

    @property
    def _select(self) -> str:
        select = SELECT
        for col in getattr(self, "_missing", ()):  # a journal not migrated, read-only
            select = select.replace(f", {col} ", ", NULL ")
        return select

    def _all(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        q = self._q(sql)
        rows: list[tuple[Any, ...]] = self._retrying(
            lambda: self.db.execute(q, args).fetchall(), "reading")
        return rows

    def _one(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> tuple[Any, ...] | None:
        q = self._q(sql)
        row: tuple[Any, ...] | None = self._retrying(
            lambda: self.db.execute(q, args).fetchone(), "reading")
        return row
