"""Which of a turn's changed tasks the journal writes now, and which may wait.

A submission from an IACP/2 client is kept by that client until its final result, and
sent again with the same id after a queen restart (spec §6, re-sending). So the queen
need not hold it durably the moment it arrives: a task that runs and finishes quickly is
written once, when it finishes (one row, inserted final), instead of once when it
arrives and again when it ends. On the sequential round trip that takes a whole commit
off the critical path (the assignment leaves before any write), and under load it halves
the task rows. Everything that depends on durability still waits for the write: the
result (the task is final, so it is written that turn) and the ``ack`` (an acknowledged
submission is never deferred).

A task waits only while all of this holds: it was submitted by an IACP/2 client without
``ack`` or an idempotency key (``Task.defer``), it is ``queued`` or ``assigned`` (not yet
accepted by a forager, so no handler has run for more than the forager's accept delay),
it has never been written, and it is younger than ``window`` seconds. What a killed
queen can cost is then bounded: a task assigned in its last ``window`` seconds and not
yet accepted runs again when its client re-sends it (a task's handler may run more than
once in any case: a lost forager's tasks are reissued). Nothing acknowledged is lost.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshant.core.tasks.model import ASSIGNED, QUEUED, Task

_YOUNG = (QUEUED, ASSIGNED)


class Deferral:
    """The tasks whose first journal write waits (sans-IO: driven with a clock)."""

    __slots__ = ("waiting", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        # In first-deferred order, which is submission order: the oldest is first.
        self.waiting: dict[str, Task] = {}

    def split(self, changed: Iterable[Task], now: float) -> list[Task]:
        """The tasks to journal this turn: those of ``changed`` that may not wait, and
        the waiting ones whose time is up."""
        write: list[Task] = []
        waiting = self.waiting
        if self.window <= 0:
            write.extend(changed)
            return write
        oldest = now - self.window
        for t in changed:
            if (t.defer and t.logged == 0 and t.final is None and t.state in _YOUNG
                    and t.submitted > oldest):
                waiting[t.id] = t  # (an id already there keeps its place)
            else:
                if waiting:
                    waiting.pop(t.id, None)
                write.append(t)
        while waiting:
            tid = next(iter(waiting))
            t = waiting[tid]
            if t.submitted > oldest and t.logged == 0:
                break
            del waiting[tid]
            if t.logged == 0:
                write.append(t)
        return write

    def flush(self) -> list[Task]:
        """Every waiting task, to be written now (the queen is stopping)."""
        out = [t for t in self.waiting.values() if t.logged == 0]
        self.waiting.clear()
        return out
