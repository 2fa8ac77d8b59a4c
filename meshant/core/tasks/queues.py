"""The ready queues: a heap per capability of ``(priority, order, task id)``, lower first,
so priority 0 leaves before 99 and FIFO holds within a priority.

A task that leaves its queue without being popped (cancelled, failed on a timer) leaves
its entry behind, stale; the heap is rebuilt once stale entries are half of it, so a
queue never holds more than twice its live tasks.
"""

from __future__ import annotations

import heapq

from meshant.core.tasks.model import QUEUED, Task

COMPACT_MIN = 64  # a heap smaller than this is rebuilt at its first stale entry

Entry = tuple[int, int, str]


class TaskQueues:
    """Heaps of ready tasks per capability; ``tasks`` is the scheduler's live tasks."""

    __slots__ = ("_stale", "heaps", "tasks")

    def __init__(self, tasks: dict[str, Task]) -> None:
        self.tasks = tasks
        self.heaps: dict[str, list[Entry]] = {}
        self._stale: dict[str, int] = {}

    def push(self, task: Task) -> None:
        heapq.heappush(self.heaps.setdefault(task.capability, []),
                       (task.priority, task.order, task.id))

    def left(self, task: Task) -> None:
        """``task`` left its queue without being popped: its entry is stale now."""
        cap = task.capability
        self._stale[cap] = self._stale.get(cap, 0) + 1

    def is_current(self, entry: Entry) -> Task | None:
        """The task an entry stands for, if it is still queued under that entry."""
        task = self.tasks.get(entry[2])
        if task is None or task.state != QUEUED or task.order != entry[1]:
            return None
        return task

    def settle(self, capability: str) -> None:
        """Forget an emptied heap."""
        heap = self.heaps.get(capability)
        if heap is not None and not heap:
            del self.heaps[capability]
            self._stale.pop(capability, None)

    def compact(self) -> None:
        """Rebuild the heaps whose entries are mostly those of tasks gone from them."""
        if not self._stale:
            return
        for cap, stale in list(self._stale.items()):
            heap = self.heaps.get(cap)
            if heap is None:
                del self._stale[cap]
                continue
            if stale * 2 < len(heap) and len(heap) >= COMPACT_MIN:
                continue
            tasks = self.tasks
            live = [e for e in heap if (t := tasks.get(e[2])) is not None
                    and t.state == QUEUED and t.order == e[1] and not t.retry_timer]
            del self._stale[cap]
            if live:
                heapq.heapify(live)
                heap[:] = live
            else:
                del self.heaps[cap]

    def entries(self, capability: str) -> list[Entry]:
        return self.heaps.get(capability, [])


__all__ = ["COMPACT_MIN", "Entry", "TaskQueues"]
