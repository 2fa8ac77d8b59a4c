"""The scheduler's timers: a task's deadline, its wait for a capable forager, the end of
its retry backoff, a suspended task's wake, a delayed task's release. One heap for all,
with lazy deletion.

A task holds the id of each pending timer of its own (``Task.deadline_timer``,
``waiting``, ``retry_timer``; 0: none). A heap entry whose id no longer matches its task's
is stale; counting the live ones lets the heap be compacted when it is mostly stale (and
emptied when nothing is live), so it never grows with tasks that finished.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Literal

from meshant.core.tasks.model import Task

TimerKind = Literal["deadline", "wait", "retry", "wake", "delay"]

# Which Task field holds the id of a task's pending timer of each kind (0: none pending).
FIELD: dict[str, str] = {"deadline": "deadline_timer", "wait": "waiting",
                         "retry": "retry_timer", "wake": "wake_timer",
                         "delay": "delay_timer"}


class TaskTimers:
    """Timers keyed by task; ``tasks`` is the scheduler's map of live tasks."""

    __slots__ = ("_ids", "_live", "heap", "tasks")

    def __init__(self, tasks: dict[str, Task]) -> None:
        self.tasks = tasks
        # (when, id, task id, kind)
        self.heap: list[tuple[float, int, str, str]] = []
        self._live = 0
        self._ids = itertools.count(1)

    def set(self, when: float, task: Task, what: TimerKind) -> None:
        """Start (or restart) ``task``'s timer of kind ``what``."""
        n = next(self._ids)
        field_ = FIELD[what]
        if getattr(task, field_):
            self._live -= 1  # replaced: the old entry is stale from now on
        setattr(task, field_, n)
        heapq.heappush(self.heap, (when, n, task.id, what))
        self._live += 1

    def unset(self, task: Task, what: TimerKind) -> None:
        """Forget ``task``'s pending timer of kind ``what`` (its heap entry goes stale)."""
        field_ = FIELD[what]
        if getattr(task, field_):
            setattr(task, field_, 0)
            self._live -= 1
            self.compact()

    def unset_all(self, task: Task) -> None:
        """Forget every pending timer of ``task`` (it is final): one look at each field,
        no lookup by kind (a task's end, on every task's path; most of them are 0)."""
        n = (bool(task.deadline_timer) + bool(task.waiting) + bool(task.retry_timer)
             + bool(task.wake_timer) + bool(task.delay_timer))
        if n:
            task.deadline_timer = task.waiting = task.retry_timer = 0
            task.wake_timer = task.delay_timer = 0
            self._live -= n
            self.compact()

    def due(self, now: float) -> Iterator[tuple[Task, str]]:
        """The live timers whose time has come, each once, oldest first (each is unset
        before it is yielded)."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, n, task_id, what = heapq.heappop(heap)
            task = self.tasks.get(task_id)
            field_ = FIELD[what]
            if task is None or getattr(task, field_) != n:
                continue  # stale: its task finished or left the queue
            setattr(task, field_, 0)
            self._live -= 1
            yield task, what

    def _is_live(self, entry: tuple[float, int, str, str]) -> bool:
        task = self.tasks.get(entry[2])
        return task is not None and getattr(task, FIELD[entry[3]]) == entry[1]

    def compact(self) -> None:
        heap = self.heap
        if self._live <= 0:
            self._live = 0
            heap.clear()  # in place: ``due`` may be walking it
        elif len(heap) > 2 * self._live:
            # Stale entries never outnumber live ones; amortized O(1) per stale entry.
            live = [e for e in heap if self._is_live(e)]
            heapq.heapify(live)
            heap[:] = live
            self._live = len(live)

    @property
    def live(self) -> int:
        return self._live


__all__ = ["FIELD", "TaskTimers", "TimerKind"]
