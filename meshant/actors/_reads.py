"""The queen driver's journal reads (the core's :class:`~meshant.core.queen.outbox.Read`
effects), answered off the loop when the journal is a network database.

An SQLite journal is read in the queen's own process in microseconds: its reads are
answered at once, in the loop, on the loop's connection. A PostgreSQL journal is a
network round trip away: its reads go to a thread with a connection of its own, and their
answers come back through ``answers`` (the thread wakes the loop). Either way the core is
given each answer at the start of a loop turn, never in the middle of one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from meshant.core.queen.outbox import Read

log = logging.getLogger("meshant.queen")

# (token, answer, error): ``error`` is why the read failed (then ``answer`` is None).
Answer = tuple[int, Any, str | None]


def answer(journal: Any, read: Read) -> Any:
    """What ``read`` asks of ``journal`` (an :class:`~meshant.core.journal.archive.Archive`)."""
    match read.what:
        case "task":
            return journal.find(read.key, events=True)
        case "key":
            return journal.find_key(read.key)
        case "graph":
            return journal.find_graph(read.key)
        case "updates":
            return journal.updates(read.key)
        case "names":
            return journal.names()
    raise ValueError(f"unknown read {read.what!r}")


class Reads:
    """Where a queen's journal reads are done. ``opener``: a function that opens a
    journal connection for a reading thread (None: read inline, on ``journal``)."""

    def __init__(self, journal: Any, opener: Callable[[], Any] | None,
                 wake: Callable[[], None]) -> None:
        self.journal = journal
        self.answers: deque[Answer] = deque()
        self._wake = wake
        self._opener = opener
        self._todo: queue.SimpleQueue[Read | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def ask(self, read: Read) -> None:
        if self._opener is None:
            self.answers.append(self._do(self.journal, read))
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="meshant-journal-reads",
                                            daemon=True)
            self._thread.start()
        self._todo.put(read)

    @staticmethod
    def _do(journal: Any, read: Read) -> Answer:
        try:
            return read.token, answer(journal, read), None
        except Exception as e:  # the database is away: the core tells who waited
            log.warning("journal read failed (%s %s): %s", read.what, read.key, e)
            return read.token, None, str(e).strip() or type(e).__name__

    def _run(self) -> None:
        assert self._opener is not None
        journal = None
        try:
            while True:
                read = self._todo.get()
                if read is None:
                    return
                if journal is None:
                    try:
                        journal = self._opener()
                    except Exception as e:
                        self.answers.append((read.token, None, str(e).strip()))
                        self._wake()
                        continue
                self.answers.append(self._do(journal, read))
                self._wake()
        finally:
            if journal is not None:
                journal.close()

    def close(self) -> None:
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join(5)


__all__ = ["Reads", "answer"]
