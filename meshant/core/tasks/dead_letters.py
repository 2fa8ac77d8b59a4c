"""The dead-letter queue: every failed task lands here with its last error, until an
operator retries it (as a new task) or purges it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from meshant.core.tasks.model import Task


class DeadLetters:
    """Failed tasks by id, oldest first."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: OrderedDict[str, Task] = OrderedDict()

    def add(self, task: Task) -> None:
        task.dead = True
        self.tasks[task.id] = task

    def purge(self, task_id: str) -> Task:
        task = self.tasks.pop(task_id)
        task.dead = False
        return task

    def retry(self, task_id: str, client: bytes, client_name: str,
              taken: Callable[[str], bool]) -> tuple[Task, Task]:
        """Take a dead letter out and make the new task that does its work again (for
        ``client``); ``taken(id)``: whether a task id may already exist. Returns (the
        old task, the new one), which the caller submits."""
        old = self.purge(task_id)
        n = 1
        while taken(f"{old.id}.r{n}"):
            n += 1
        # The same work and options, its own retry policy and limits included; not its
        # idempotency key (the key's answer stays the original's failure), nor its delay
        # (a retry is asked for now).
        new = Task(id=f"{old.id}.r{n}", capability=old.capability, payload=old.payload,
                   client=client, client_name=client_name, priority=old.priority,
                   timeout=old.timeout, to=old.to, labels=dict(old.labels),
                   max_attempts=old.max_attempts, wait=old.wait,
                   retry_base=old.retry_base, retry_cap=old.retry_cap, retry_on=old.retry_on,
                   concurrency=old.concurrency, cost=old.cost)  # (held to its limits: #32)
        return old, new

    def __len__(self) -> int:
        return len(self.tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.tasks


__all__ = ["DeadLetters"]
