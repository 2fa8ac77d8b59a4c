"""Tasks in conversation, sans-IO: the questions a running task asks (and their answers),
and each task's bounded log of updates that anyone with the right may replay from a cursor.

Plain objects driven by the queen core; the journal keeps both (``meshant.storage.
conversation``), so a restarted queen still holds a pending question and the updates a
late watcher asks for.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import msgpack

MAX_QUESTIONS = 100  # per task, answered ones included (so a second answer is refused)


@dataclass(slots=True)
class Question:
    """One question of a running task. ``attempt`` is the assign id whose handler asked:
    only that attempt may be answered (a reissued task asks afresh)."""

    task: str
    request: str
    attempt: str
    prompt: Any = None
    data: Any = None
    asked: float = 0.0  # wall clock
    answered: bool = False
    answer: Any = None
    by: str = ""
    withdrawn: bool = False

    def row(self) -> dict[str, Any]:
        return {"task": self.task, "request": self.request, "attempt": self.attempt,
                "prompt": self.prompt, "data": self.data, "asked": self.asked,
                "answered": self.answered, "answer": self.answer, "by": self.by,
                "withdrawn": self.withdrawn}


class Questions:
    """Every task's questions, by task id then request id (in the order asked)."""

    def __init__(self) -> None:
        self.by_task: dict[str, OrderedDict[str, Question]] = {}

    def add(self, q: Question) -> None:
        qs = self.by_task.setdefault(q.task, OrderedDict())
        qs[q.request] = q
        while len(qs) > MAX_QUESTIONS:
            old = next(iter(qs.values()))
            if not (old.answered or old.withdrawn):
                break  # never forget a pending one
            qs.popitem(last=False)

    def get(self, task_id: str, request: str) -> Question | None:
        qs = self.by_task.get(task_id)
        return qs.get(request) if qs is not None else None

    def pending(self, task_id: str) -> list[Question]:
        qs = self.by_task.get(task_id)
        return [q for q in qs.values() if not q.answered and not q.withdrawn] if qs else []

    def drop(self, task_id: str) -> None:
        self.by_task.pop(task_id, None)

    def all_pending(self) -> list[Question]:
        return [q for qs in self.by_task.values() for q in qs.values()
                if not q.answered and not q.withdrawn]


class CursorExpired(Exception):
    """The updates a cursor asks for are no longer kept; ``cursor`` is the lowest that
    works (its error carries it, spec §6a)."""

    def __init__(self, message: str, cursor: int) -> None:
        super().__init__(message)
        self.cursor = cursor


def size_of(body: Any) -> int:
    """About what a body costs to keep: its msgpack size (blobs as their bytes)."""
    try:
        return len(msgpack.packb(body, default=bytes))
    except (TypeError, ValueError):
        return 1024


class UpdateLog:
    """One task's updates, oldest first, bounded in count and bytes: ``dropped`` is the
    highest sequence number no longer kept (0: nothing dropped)."""

    __slots__ = ("behind", "bytes", "dropped", "entries")

    def __init__(self) -> None:
        self.entries: deque[tuple[int, str, dict[str, Any], int]] = deque()
        self.bytes = 0
        self.dropped = 0
        # The updates up to ``dropped`` are not here but may be in the journal: a log
        # begun anew for a task taken back after a restart or a takeover.
        self.behind = False

    def add(self, seq: int, kind: str, body: dict[str, Any], size: int, max_count: int,
            max_bytes: int) -> None:
        self.entries.append((seq, kind, body, size))
        self.bytes += size
        while self.entries and (len(self.entries) > max_count or self.bytes > max_bytes):
            old = self.entries.popleft()
            self.bytes -= old[3]
            self.dropped = max(self.dropped, old[0])

    @property
    def last(self) -> int:
        return self.entries[-1][0] if self.entries else self.dropped


class UpdateLogs:
    """The update logs of tasks, each bounded by ``max_count`` and ``max_bytes``, all
    together by ``total_bytes`` (the least recently written go first: the journal still
    has them)."""

    def __init__(self, max_count: int = 1000, max_bytes: int = 1 << 20,
                 total_bytes: int = 64 << 20) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.total_bytes = total_bytes
        self.logs: OrderedDict[str, UpdateLog] = OrderedDict()
        self.bytes = 0

    def add(self, task_id: str, seq: int, kind: str, body: dict[str, Any]) -> int:
        """Keep one update; returns its size."""
        log = self.logs.get(task_id)
        if log is None:
            log = self.logs[task_id] = UpdateLog()
        else:
            self.logs.move_to_end(task_id)
        size = size_of(body)
        before = log.bytes
        log.add(seq, kind, body, size, self.max_count, self.max_bytes)
        self.bytes += log.bytes - before
        while self.bytes > self.total_bytes and len(self.logs) > 1:
            _, old = self.logs.popitem(last=False)
            self.bytes -= old.bytes
        return size

    def load(self, task_id: str, rows: list[tuple[int, str, dict[str, Any]]],
             dropped: int = 0) -> UpdateLog:
        """Take a task's log back from the journal (rows oldest first); updates this log
        holds beyond the rows (kept after the journal was read) stay."""
        old = self.logs.get(task_id)
        newer = [e for e in old.entries if e[0] > rows[-1][0]] if old and rows else []
        self.drop(task_id)
        log = self.logs[task_id] = UpdateLog()
        log.dropped = dropped
        for seq, kind, body in rows:
            size = size_of(body)
            log.add(seq, kind, body, size, self.max_count, self.max_bytes)
        for seq, kind, body, size in newer:
            log.add(seq, kind, body, size, self.max_count, self.max_bytes)
        self.bytes += log.bytes
        return log

    def begin_behind(self, task_id: str, seq: int) -> None:
        """A task taken back from the journal gets its first update here (``seq``): its
        earlier ones are in the journal, read when someone attaches from before them."""
        if task_id not in self.logs and seq > 1:
            log = self.logs[task_id] = UpdateLog()
            log.dropped, log.behind = seq - 1, True

    def drop(self, task_id: str) -> None:
        log = self.logs.pop(task_id, None)
        if log is not None:
            self.bytes -= log.bytes

    def since(self, task_id: str, after: int) -> list[tuple[int, str, dict[str, Any]]]:
        """The updates kept after sequence ``after``; CursorExpired if some of those
        were dropped."""
        log = self.logs.get(task_id)
        if log is None:
            return []
        if after < log.dropped:
            raise CursorExpired(f"updates {after + 1}-{log.dropped} of task {task_id} were "
                                f"dropped (a task keeps its last {self.max_count} updates, "
                                f"{self.max_bytes:,} bytes): attach with after >= "
                                f"{log.dropped}", log.dropped)
        return [(s, k, b) for s, k, b, _ in log.entries if s > after]


__all__ = ["CursorExpired", "Question", "Questions", "UpdateLog", "UpdateLogs", "size_of"]
