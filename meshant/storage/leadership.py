"""Who leads a colony whose queens share a PostgreSQL journal: a lease in the database.

The ``lease`` row holds the term, the holder and when the lease ends — on the database's
clock (``clock_timestamp()``), never a queen's. A standby takes the lease once it has
lapsed, bumping the term; the leader renews it every quarter of its length. The leader
counts itself leader only until ``lease`` seconds after it *sent* its last successful
renewal (minus a margin), on its own monotonic clock: the database's end of the lease is
later than that, so a leader always knows it is deposed before a standby can take over.
Its journal writes are fenced by the term besides (:mod:`meshant.storage.pg`).

One thread with a connection of its own; the queen's loop reads ``role``/``term`` and is
woken by ``on_change``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshant.core.journal.lease import LEADER, LeaseHold
from meshant.storage.pg import PgJournal, connect

log = logging.getLogger("meshant.queen")


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The leader as the lease row names it (for a standby's ``not-leader`` hint)."""

    term: int
    name: str
    endpoint: str
    pub: str
    live: bool


class Leadership:
    """The lease, held or wanted, from a thread of its own."""

    def __init__(self, journal: PgJournal, *, lease: float, holder: str, name: str,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.journal = journal
        self.lease = lease
        self.holder = holder
        self.name = name
        self.endpoint = ""
        self.pub = ""
        self.on_change = on_change
        self.hold = LeaseHold(lease)  # the rules: core/journal/lease.py
        self.leader: LeaderInfo | None = None
        self.error = ""  # the database's last complaint, while it is away
        self._stop = threading.Event()
        self._conn: Any = None
        self._thread: threading.Thread | None = None

    # -- the queen's side ---------------------------------------------------------------

    def start(self, endpoint: str, pub: str) -> None:
        """Go for the lease once now (so a standby knows the leader before it answers
        anyone), then keep at it from the thread."""
        self.endpoint, self.pub = endpoint, pub
        self._round()
        self._thread = threading.Thread(target=self._run, name="meshant-lease", daemon=True)
        self._thread.start()

    @property
    def role(self) -> str:
        return self.hold.role

    @property
    def term(self) -> int:
        return self.hold.term

    def valid(self) -> bool:
        """Whether this queen may act as leader now (its lease surely still holds)."""
        return self.hold.valid(time.monotonic())

    def stop(self, release: bool = True) -> None:
        """Stop; a leader hands the lease back, so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if release and self.role == LEADER and self._conn is not None:
            try:
                self._conn.execute("UPDATE lease SET expires='-infinity' WHERE id=1 AND "
                                   "term=%s AND holder=%s", (self.term, self.holder))
                log.warning("queen %s hands the lease back (term %d): a standby queen, if "
                            "one runs, leads next", self.name, self.term)
            except Exception:  # the database is away: the lease lapses on its own
                pass
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass

    def step_down(self, why: str, term: int | None = None) -> None:
        """(Any thread) This queen is no leader any more (deposed, lapsed, or its journal
        refused a write). With ``term``: only if that is still the term held (a failure
        of an older term must not end a newer one)."""
        if self.hold.lost(term):
            self.leader = None  # who leads now: the next round reads it
            log.warning("queen %s steps down (term %d): %s", self.name, self.term,
                        " ".join(why.split()))  # (libpq's messages span lines)
            self.on_change()

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        every = max(0.05, self.lease / 4)
        while not self._stop.wait(every):
            self._round()

    def _round(self) -> None:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.journal.url, self.lease)
            if self.role == LEADER:
                self._renew()
            else:
                self._try_acquire()
            self.error = ""
        except Exception as e:  # the database is away: try again next round
            self.error = str(e).strip() or type(e).__name__
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:
                    pass
                self._conn = None
        if self.role == LEADER and not self.valid():
            self.step_down("its lease could not be renewed in time "
                           f"({self.error or 'no answer'})")

    def _try_acquire(self) -> None:
        # Once the lease lapsed; or at once if this queen still holds it (it stepped down
        # on its own, a write failing): the new term fences whatever it had in flight.
        # A lapsed leader frozen (or cut off) in the middle of a pipelined write still
        # holds the lease row FOR SHARE, and no server timeout ends that (the statement
        # waits for the client): end its session, or the takeover would wait with it.
        try:
            self._conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.relation = "
                "'lease'::regclass AND l.granted AND l.pid <> pg_backend_pid() AND "
                "(SELECT expires < clock_timestamp() FROM lease WHERE id = 1)")
        except Exception as e:  # not allowed (another role): the takeover may wait
            log.warning("queen %s cannot end the lapsed leader's session: %s", self.name,
                        " ".join(str(e).split()))
        sent = time.monotonic()
        row = self._conn.execute(
            "UPDATE lease SET term=term+1, holder=%s, name=%s, endpoint=%s, pub=%s, "
            "expires=clock_timestamp() + make_interval(secs => %s) "
            "WHERE id=1 AND (expires < clock_timestamp() OR holder=%s) RETURNING term",
            (self.holder, self.name, self.endpoint, self.pub, self.lease,
             self.holder)).fetchone()
        if row is not None:
            self.hold.won(int(row[0]), sent)
            self.leader = LeaderInfo(self.term, self.name, self.endpoint, self.pub, True)
            log.warning("queen %s leads the colony (term %d)", self.name, self.term)
            self.on_change()
            return
        r = self._conn.execute("SELECT term, name, endpoint, pub, expires > clock_timestamp() "
                               "FROM lease WHERE id=1").fetchone()
        if r is not None:
            self.leader = LeaderInfo(int(r[0]), r[1] or "", r[2] or "", r[3] or "", bool(r[4]))

    def _renew(self) -> None:
        sent = time.monotonic()
        row = self._conn.execute(
            "UPDATE lease SET expires=clock_timestamp() + make_interval(secs => %s) "
            "WHERE id=1 AND term=%s AND holder=%s RETURNING term",
            (self.lease, self.term, self.holder)).fetchone()
        if row is None:
            self.step_down("another queen took the lease")
            return
        self.hold.renewed(sent)
