"""The scheduler's routing: which forager gets a queued task (capability, name, labels,
free slots, least load) and the circuit breakers that hold work back from a forager, or
a capability, that keeps failing. A part of :class:`meshant.core.scheduler.Scheduler`."""

from __future__ import annotations

import heapq
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from meshant.core.policy import Breaker
from meshant.core.registry import ACTIVE, Node, Registry
from meshant.core.tasks import ASSIGNED, QUEUED, Attempt, Task
from meshant.protocol.codes import Code


class Routing:
    """Assignment and breakers; the state they use is the Scheduler's."""

    if TYPE_CHECKING:
        registry: Registry
        tasks: dict[str, Task]
        attempts: dict[str, Attempt]
        queues: dict[str, list[tuple[int, int, str]]]
        queued: int
        dirty: bool
        assign_timeout: float
        breaker_threshold: int
        breaker_cooldown: float
        forager_breakers: dict[str, Breaker]
        cap_breakers: dict[str, Breaker]
        out: list[tuple[Any, ...]]
        _now: float
        _lease_due: float
        _queue_stale: dict[str, int]

        def _move(self, task: Task, state: str, now: float, why: str = "") -> None: ...
        def _untimer(self, task: Task, what: str) -> None: ...
        def _fail(self, task: Task, now: float, code: str, message: str,
                  **extra: Any) -> None: ...

    # -- circuit breakers -----------------------------------------------------------------

    def _breaker(self, table: dict[str, Breaker], key: str) -> Breaker:
        b = table.get(key)
        if b is None:
            b = table[key] = Breaker(self.breaker_threshold, self.breaker_cooldown)
        return b

    def _outcome(self, att: Attempt, ok: bool, now: float, capability_too: bool) -> None:
        fb = self._breaker(self.forager_breakers, att.node.name)
        cb = self._breaker(self.cap_breakers, att.task.capability) if capability_too else None
        for b in (fb, cb):
            if b is None:
                continue
            if ok:
                b.success()
            else:
                b.failure(now)

    def breakers(self) -> dict[str, dict[str, str]]:
        """Circuits that are not closed, for status."""
        return {"foragers": {k: b.state for k, b in self.forager_breakers.items()
                             if b.state != "closed"},
                "capabilities": {k: b.state for k, b in self.cap_breakers.items()
                                 if b.state != "closed"}}

    # -- assignment -----------------------------------------------------------------------

    def _pick(self, task: Task) -> Node | None:
        best: Node | None = None
        best_load = 2.0
        by_name = self.registry.by_name
        names: Collection[str] = self.registry.by_tool.get(task.capability, ())
        if task.to is not None:
            names = (task.to,) if task.to in names else ()
        breakers = self.forager_breakers
        for name in names:
            node = by_name[name]
            if node.state != ACTIVE or (task.avoid and node.identity in task.avoid):
                continue
            fb = breakers.get(name)
            if fb is not None and not fb.allow(self._now):
                continue  # its circuit is open: it keeps failing
            busy = len(node.in_flight)
            if busy >= node.slots:
                continue
            if task.labels and any(node.labels.get(k) != v for k, v in task.labels.items()):
                continue
            load = busy / node.slots
            if load < best_load:
                best, best_load = node, load
                if busy == 0:
                    break
        return best

    def _has_capacity(self, capability: str) -> bool:
        by_name = self.registry.by_name
        return any(by_name[n].free > 0 for n in self.registry.by_tool.get(capability, ()))

    def _all_rejected(self, task: Task) -> bool:
        names = self.registry.by_tool.get(task.capability, set())
        if task.to is not None:
            names = {task.to} & names
        by_name = self.registry.by_name
        rejected = task.rejected
        return bool(names) and rejected is not None and all(
            by_name[n].identity in rejected for n in names)

    def dispatch(self, now: float, scan_limit: int = 256) -> int:
        """Assign queued tasks to free capable foragers. Returns how many were assigned."""
        self.dirty = False
        assigned = 0
        self._now = now
        for cap, heap in list(self.queues.items()):
            cb = self.cap_breakers.get(cap)
            if cb is not None and not cb.allow(now):
                continue  # this capability keeps failing everywhere: hold its tasks
            skipped: list[tuple[int, int, str]] = []
            while heap and len(skipped) < scan_limit and self._has_capacity(cap):
                entry = heapq.heappop(heap)
                task = self.tasks.get(entry[2])
                if task is None or task.state != QUEUED or task.order != entry[1]:
                    continue
                node = self._pick(task)
                if node is None:
                    if self._all_rejected(task):
                        reasons = task.reasons or []
                        self._fail(task, now, Code.REJECTED, "rejected by every capable forager: "
                                   + "; ".join(reasons), reasons=reasons, cause=Code.REJECTED)
                    else:
                        skipped.append(entry)
                    continue
                self.queued -= 1
                self._assign(task, node, now)
                assigned += 1
            for entry in skipped:
                heapq.heappush(heap, entry)
            if not heap:
                del self.queues[cap]
                self._queue_stale.pop(cap, None)
        return assigned

    def _assign(self, task: Task, node: Node, now: float) -> None:
        for b in (self.forager_breakers.get(node.name), self.cap_breakers.get(task.capability)):
            if b is not None:
                b.started()  # in half-open, this assignment is the trial
        self._untimer(task, "wait")  # it left the queue: no longer waiting for a forager
        task.attempt += 1
        att = Attempt(f"{task.id}.{task.attempt}", task, node, task.attempt,
                      now + self.assign_timeout)
        task.current = att
        node.in_flight[att.id] = att
        if att.lease < self._lease_due:
            self._lease_due = att.lease
        self.attempts[att.id] = att
        self._move(task, ASSIGNED, now, node.name)
        self.out.append(("assign", node, att))
