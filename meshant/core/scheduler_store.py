"""What the scheduler keeps beyond its live work: the dead-letter queue, the tasks a
restarted queen restores from its journal (and the attempts its foragers then adopt),
and final tasks looked up in the journal (the archive). A part of
:class:`meshant.core.scheduler.Scheduler`."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from meshant.core.registry import Node
from meshant.core.tasks import QUEUED, Attempt, Task, slim


class TaskStore:
    """Dead letters, restore and adopt, archive lookups; the state is the Scheduler's."""

    if TYPE_CHECKING:
        import itertools

        tasks: dict[str, Task]
        done: OrderedDict[str, Task]
        dlq: OrderedDict[str, Task]
        attempts: dict[str, Attempt]
        held: dict[str, Attempt]
        by_key: dict[str, str]
        archive: Any
        to_wall: float
        track_changes: bool
        changed: dict[str, Task]
        assign_timeout: float
        dirty: bool
        _order: itertools.count[int]
        _lease_due: float

        def submit(self, task: Task, now: float, *, unknown: bool = False) -> Task: ...
        def _timer(self, when: float, task: Task, what: str) -> None: ...
        def _enqueue(self, task: Task, now: float | None = None,
                     delay: float = 0.0) -> None: ...

    # -- restart --------------------------------------------------------------------------

    def _revive(self, r: dict[str, Any]) -> Task:
        """A Task from a journal row (``Journal.unfinished``/``find``)."""
        task = Task(id=r["id"], capability=r["capability"], payload=r["payload"],
                    client_name=r["client_name"], priority=r["priority"],
                    timeout=r["timeout"], to=r["to_name"], labels=r["labels"] or {},
                    max_attempts=r["max_attempts"], wait=r["wait"], state=r["state"],
                    attempt=r["attempt"], tries=r["tries"], restored=True,
                    key=r.get("idem_key"), retry_base=r.get("retry_base"),
                    retry_cap=r.get("retry_cap"), final=r["final"], dead=bool(r.get("dead")))
        task.submitted = r["created"] - self.to_wall
        return task

    def restore(self, rows: list[dict[str, Any]], now: float, wall_now: float,
                grace: float) -> int:
        """Take back a journal's tasks after a restart; returns how many are unfinished.

        ``rows``: the unfinished tasks and the dead letters (``Journal.unfinished``).
        Other final tasks stay on disk, found through ``archive`` when asked for."""
        self.to_wall = wall_now - now
        unfinished = 0
        for r in rows:
            if r["final"] is not None and not r.get("dead"):
                continue  # finished: the journal keeps it
            task = self._revive(r)
            slim(task)
            task.order = next(self._order)
            task.submitted = min(now, task.submitted)
            if task.final is not None:
                self.dlq[task.id] = task  # a dead letter: kept for dlq list/show/retry
                continue
            if task.key is not None:
                self.by_key[task.key] = task.id
            unfinished += 1
            self.tasks[task.id] = task
            if task.timeout is not None:
                task.deadline = task.submitted + task.timeout
                self._timer(task.deadline, task, "deadline")
            if task.state == QUEUED:
                self._enqueue(task, now)
                continue
            # Assigned before the restart: perhaps still running on its forager.
            ghost = Node(name=r["forager"] or "?", identity=b"", role="forager", codec="",
                         state="offline")
            att = Attempt(f"{task.id}.{task.attempt}", task, ghost, task.attempt, now + grace)
            task.current = att
            self.attempts[att.id] = att
            self.held[att.id] = att
        self.dirty = True
        return unfinished

    def adopt(self, node: Node, refs: list[Any], now: float) -> int:
        """A forager's hello lists what it runs: take back the held attempts it names."""
        n = 0
        for ref in refs:
            att = self.held.get(ref) if isinstance(ref, str) else None
            if att is None or att.node.name != node.name or len(node.in_flight) >= node.slots:
                continue
            del self.held[ref]
            att.node = node
            att.lease = now + self.assign_timeout
            self._lease_due = min(self._lease_due, att.lease)
            node.in_flight[ref] = att
            n += 1
        return n
    # -- dead letters ---------------------------------------------------------------------

    def dlq_retry(self, task_id: str, client: bytes, client_name: str, now: float) -> Task:
        """Submit a dead letter's work again as a new task (for ``client``)."""
        old = self.dlq.pop(task_id)
        old.dead = False
        if self.track_changes:
            self.changed[old.id] = old
        n = 1
        while self._known(f"{old.id}.r{n}"):
            n += 1
        payload = old.payload
        # The same work and options, its own retry policy included; not its idempotency
        # key (the key's answer stays the original's failure).
        new = Task(id=f"{old.id}.r{n}", capability=old.capability, payload=payload,
                   client=client, client_name=client_name, priority=old.priority,
                   timeout=old.timeout, to=old.to, labels=dict(old.labels),
                   max_attempts=old.max_attempts, wait=old.wait,
                   retry_base=old.retry_base, retry_cap=old.retry_cap)
        return self.submit(new, now)

    def dlq_purge(self, task_id: str) -> None:
        task = self.dlq.pop(task_id)
        task.dead = False
        if self.track_changes:
            self.changed[task.id] = task

    def find(self, task_id: str) -> Task | None:
        """A task in memory, else a final one from the archive (a transient copy: it is
        not kept, and changing it changes nothing)."""
        task = self.tasks.get(task_id) or self.done.get(task_id) or self.dlq.get(task_id)
        if task is not None or self.archive is None:
            return task
        r = self.archive.find(task_id, events=True)
        if r is None or r["final"] is None:
            return None
        task = self._revive(r)
        task.history = [(e["ts"] - self.to_wall, e["state"], e["why"]) for e in r["events"]]
        task.logged = len(task.history)
        return task

    def find_key(self, key: str) -> str | None:
        """The id of the task submitted with idempotency key ``key``, if any is known."""
        task_id = self.by_key.get(key)
        if task_id is not None or self.archive is None:
            return task_id
        r = self.archive.find_key(key)
        return r["id"] if r is not None else None

    def known(self, task_id: str) -> Task | None:
        """The task with this id if it exists anywhere (memory or archive), else None;
        a new id costs one primary-key probe of the archive."""
        task = self.tasks.get(task_id) or self.done.get(task_id) or self.dlq.get(task_id)
        if task is None and self.archive is not None and self.archive.has(task_id):
            task = self.find(task_id)
        return task

    def _known(self, task_id: str) -> bool:
        return task_id in self.tasks or task_id in self.done or task_id in self.dlq or (
            self.archive is not None and self.archive.has(task_id))
