"""The queen's scheduler: priority queues, capability routing, slot credits, leases, fencing.

Sans-IO. The queen feeds it events with the current monotonic time and drains ``out``,
a list of actions to put on the wire:

* ``("assign", node, attempt)``  — send ``task.assign`` for ``attempt`` to ``node``
* ``("cancel", node, attempt)``  — send ``task.cancel`` for an abandoned attempt
* ``("deliver", task, kind, body)`` — send ``kind`` (progress, partial or final result)
  to the task's submitter

Each task's lifecycle is the table ``TRANSITIONS`` (:mod:`meshant.core.tasks`, the task
model); every state change goes through ``_move`` so an illegal one is a bug that shows,
not a silent corruption. Which forager gets a task, and the circuit breakers, are
:mod:`meshant.core.scheduler_routing`; dead letters, restoring from the journal and
archive lookups are :mod:`meshant.core.scheduler_store`. Retry delays are
:class:`meshant.core.policy.Backoff`'s.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from meshant.core.policy import Backoff, Breaker
from meshant.core.registry import ACTIVE, Node, Registry
from meshant.core.scheduler_routing import Routing
from meshant.core.scheduler_store import TaskStore
from meshant.core.tasks import (
    ACCEPTED,
    ASSIGNED,
    CANCELLED,
    COMPLETED,
    FAILED,
    FINAL,
    QUEUED,
    TRANSITIONS,
    Attempt,
    Task,
    slim,
)
from meshant.errors import QueueFull
from meshant.protocol.codes import Code

__all__ = [  # the task model is re-exported: it is what the scheduler takes and gives
    "ACCEPTED", "ASSIGNED", "CANCELLED", "COMPLETED", "FAILED", "FINAL", "QUEUED",
    "TRANSITIONS", "Attempt", "DuplicateTask", "QueueFull", "Scheduler", "Task",
]


class DuplicateTask(Exception):
    """A task with this id is already known."""


# Which Task field holds the id of a task's pending timer of each kind (0: none pending).
_TIMER_FIELD = {"deadline": "deadline_timer", "wait": "waiting", "retry": "retry_timer"}
_COMPACT_MIN = 64  # a queue heap smaller than this is rebuilt at its first stale entry

class Scheduler(Routing, TaskStore):
    """Queues, assignment and the task lifecycle. All times are the queen's monotonic clock."""

    def __init__(
        self,
        registry: Registry,
        *,
        assign_timeout: float = 300.0,
        max_queue: int = 100_000,
        keep_done: int = 10_000,
        default_wait: float = 30.0,
        backoff: Backoff | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
    ) -> None:
        self.registry = registry
        self.assign_timeout = assign_timeout
        self.max_queue = max_queue
        self.keep_done = keep_done
        self.default_wait = default_wait
        self.tasks: dict[str, Task] = {}
        self.done: OrderedDict[str, Task] = OrderedDict()
        self.attempts: dict[str, Attempt] = {}
        self.queues: dict[str, list[tuple[int, int, str]]] = {}
        self.queued = 0
        # Entries of tasks that left a queue without being popped, per capability: the
        # heap is rebuilt once they are half of it.
        self._queue_stale: dict[str, int] = {}
        # (when, id, task id, kind): a heap, with lazily deleted entries. Those of tasks
        # that left the queue or finished are stale; counting the live ones lets the heap
        # be compacted when it is mostly stale (and emptied when nothing is live).
        self.timers: list[tuple[float, int, str, str]] = []
        self._live_timers = 0
        self.out: list[tuple[Any, ...]] = []
        self.counters: dict[str, int] = {
            "submitted": 0, "completed": 0, "failed": 0, "cancelled": 0, "reissued": 0,
            "rejected": 0, "duplicates": 0, "unknown_results": 0, "retried": 0,
            "dead_lettered": 0,
        }
        self._order = itertools.count()
        # No lease of a running attempt ends before this: tick() scans the foragers only
        # from then on (leases only ever move later, new attempts lower it).
        self._lease_due = math.inf
        self._timer_n = itertools.count(1)
        self.dirty = False
        self._now = 0.0
        # Tasks changed since the journal last looked (it drains this once per turn);
        # tracked only when there is a journal to write them to.
        self.track_changes = False
        self.changed: dict[str, Task] = {}
        # Attempts a restarted queen found in its journal: kept for the foragers' hellos
        # to adopt, reissued when their grace period ends.
        self.held: dict[str, Attempt] = {}
        self.by_key: dict[str, str] = {}
        self.backoff = backoff or Backoff()
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.forager_breakers: dict[str, Breaker] = {}
        self.cap_breakers: dict[str, Breaker] = {}
        self.dlq: OrderedDict[str, Task] = OrderedDict()
        # Where final tasks that are not in memory are found: the queen's journal (its
        # find, find_key and has), or None. ``to_wall`` turns its wall-clock times into
        # this clock's (set by ``restore``).
        self.archive: Any = None
        self.to_wall = 0.0
        # Graphs (meshant.core.graph_book): told when a graph node's task ends.
        self.on_graph_final: Callable[[Task], None] | None = None

    # -- lifecycle plumbing ---------------------------------------------------------------

    def _move(self, task: Task, state: str, now: float, why: str = "") -> None:
        if state not in TRANSITIONS[task.state]:
            raise RuntimeError(f"illegal task transition {task.state} -> {state} ({task.id})")
        task.state = state
        task.history.append((now, state, why))
        if self.track_changes:
            self.changed[task.id] = task

    def _enqueue(self, task: Task, now: float | None = None, delay: float = 0.0) -> None:
        self.queued += 1
        if delay > 0 and now is not None:
            # Counted as queued from now; it joins its queue when the backoff ends.
            self._timer(now + delay, task, "retry")
            return
        heapq.heappush(self.queues.setdefault(task.capability, []),
                       (task.priority, task.order, task.id))
        self.dirty = True
        if now is not None and not self._anyone_serves(task):
            self._wait_for_forager(task, now)

    def _timer(self, when: float, task: Task, what: str) -> None:
        n = next(self._timer_n)
        field_ = _TIMER_FIELD[what]
        if getattr(task, field_):
            self._live_timers -= 1  # replaced: the old entry is stale from now on
        setattr(task, field_, n)
        heapq.heappush(self.timers, (when, n, task.id, what))
        self._live_timers += 1

    def _untimer(self, task: Task, what: str) -> None:
        """Forget ``task``'s pending timer of kind ``what`` (its heap entry goes stale)."""
        field_ = _TIMER_FIELD[what]
        if getattr(task, field_):
            setattr(task, field_, 0)
            self._live_timers -= 1
            self._compact_timers()

    def _timer_live(self, entry: tuple[float, int, str, str]) -> bool:
        task = self.tasks.get(entry[2])
        return task is not None and getattr(task, _TIMER_FIELD[entry[3]]) == entry[1]

    def _compact_timers(self) -> None:
        timers = self.timers
        if self._live_timers <= 0:
            self._live_timers = 0
            timers.clear()  # in place: tick() may be walking it
        elif len(timers) > 2 * self._live_timers:
            # Stale entries never outnumber live ones; amortized O(1) per stale entry.
            live = [e for e in timers if self._timer_live(e)]
            heapq.heapify(live)
            timers[:] = live
            self._live_timers = len(live)

    def _compact_queues(self) -> None:
        """Rebuild the queues whose entries are mostly those of tasks gone from them."""
        for cap, stale in list(self._queue_stale.items()):
            heap = self.queues.get(cap)
            if heap is None:
                del self._queue_stale[cap]
                continue
            if stale * 2 < len(heap) and len(heap) >= _COMPACT_MIN:
                continue
            tasks = self.tasks
            live = [e for e in heap if (t := tasks.get(e[2])) is not None
                    and t.state == QUEUED and t.order == e[1] and not t.retry_timer]
            del self._queue_stale[cap]
            if live:
                heapq.heapify(live)
                heap[:] = live
            else:
                del self.queues[cap]

    def _finish(self, task: Task, state: str, now: float, body: dict[str, Any]) -> None:
        """Make ``task`` final and emit its one and only final result."""
        if task.state == QUEUED:
            self.queued -= 1
            if not task.retry_timer:
                # Its queue entry stays behind, stale, until the queue is compacted.
                cap = task.capability
                self._queue_stale[cap] = self._queue_stale.get(cap, 0) + 1
        for what in ("deadline", "wait", "retry"):
            self._untimer(task, what)
        self._move(task, state, now, body.get("error", {}).get("code", "") if state == FAILED
                   else "")
        self.counters[state] += 1
        body["task"] = task.id
        body["state"] = state
        body["attempt"] = task.attempt
        body["seq"] = task.next_seq()
        task.final = body
        if state != FAILED and (task.logged or not self.track_changes):
            # No longer needed (a failed task's may be retried); a task whose first
            # journal write waited for its end keeps it until that write has it.
            task.payload = None
        self.out.append(("deliver", task, "task.result", body))
        for identity, name, alias in task._watchers or ():
            # Later submissions with the same idempotency key get the same result.
            self.out.append(("watch", identity, name, {**body, "task": alias,
                                                        "original": task.id}))
        del self.tasks[task.id]
        self.done[task.id] = task
        while len(self.done) > self.keep_done:
            old_id, old = self.done.popitem(last=False)
            for n in range(1, old.attempt + 1):
                self.attempts.pop(f"{old_id}.{n}", None)
            if old.key is not None and self.by_key.get(old.key) == old_id:
                del self.by_key[old.key]
        if self.on_graph_final is not None and task.id[:3] == "tg:":  # graph hook
            self.on_graph_final(task)

    def _fail(self, task: Task, now: float, code: str, message: str, **extra: Any) -> None:
        self._abandon(task, now, cancel=True)
        extra.setdefault("cause", code)
        extra.setdefault("attempts", task.attempt)
        self._finish(task, FAILED, now, {"error": {"code": code, "message": message, **extra}})
        self._dead_letter(task)

    def _dead_letter(self, task: Task) -> None:
        """Every failed task lands in the dead-letter queue, with its last error, until
        retried or purged."""
        task.dead = True
        self.dlq[task.id] = task
        self.counters["dead_lettered"] += 1

    def _retry_later(self, task: Task, now: float, why: str) -> None:
        """Queue the task again after a jittered backoff: its own policy, else the queen's."""
        delay = self.backoff.delay(task.tries - 1, task.retry_base, task.retry_cap)
        self.counters["retried"] += 1
        self._move(task, QUEUED, now, f"{why}; retry in {delay:.2f} s")
        self._enqueue(task, now, delay)

    def _abandon(self, task: Task, now: float, *, cancel: bool) -> None:
        """Fence off the task's current attempt: its result will be a duplicate from now on."""
        att = task.current
        if att is None:
            return
        task.current = None
        att.live = False
        att.node.in_flight.pop(att.id, None)
        self.dirty = True
        if cancel and att.node.state == ACTIVE:
            self.out.append(("cancel", att.node, att))

    # -- events in ------------------------------------------------------------------------

    def submit(self, task: Task, now: float, *, unknown: bool = False) -> Task:
        """Queue a new task. Raises QueueFull or DuplicateTask and changes nothing then.
        ``unknown=True``: the caller has just checked that the id is new (``known``)."""
        if not unknown and self._known(task.id):
            raise DuplicateTask(task.id)
        if self.queued >= self.max_queue:
            raise QueueFull(f"the queue holds {self.queued} tasks, its limit")
        task.order = next(self._order)
        task.submitted = now
        slim(task)
        if task.history:
            task.history.append((now, QUEUED, "submitted"))
        else:
            task.history = [(now, QUEUED, "submitted")]  # exactly sized
        if self.track_changes:
            self.changed[task.id] = task
        self.tasks[task.id] = task
        if task.key is not None:
            self.by_key[task.key] = task.id
        self.counters["submitted"] += 1
        if task.timeout is not None:
            task.deadline = now + task.timeout
            self._timer(task.deadline, task, "deadline")
        if not self._anyone_serves(task):
            self._wait_for_forager(task, now)
        self._enqueue(task)
        return task

    def cancel(self, task_id: str, now: float) -> Task | None:
        """Cancel at once if queued; best effort (cancel sent to the forager) if assigned."""
        task = self.tasks.get(task_id)
        if task is None:
            return None
        self._abandon_keep_slot(task)
        self._finish(task, CANCELLED, now, {"error": {"code": Code.CANCELLED,
                                                      "message": "cancelled by the client"}})
        return task

    def _abandon_keep_slot(self, task: Task) -> None:
        # A cancelled attempt may still be running: its slot stays taken until the forager
        # answers or the lease runs out, so the forager is never given more than its slots.
        att = task.current
        if att is None:
            return
        task.current = None
        att.live = False
        if att.node.state == ACTIVE:
            self.out.append(("cancel", att.node, att))

    def lookup(self, node: Node, ref: str | None) -> tuple[str, Attempt | None]:
        """Classify a forager's message about an assign: ok, duplicate, foreign, unknown."""
        att = self.attempts.get(ref) if ref is not None else None
        if att is None:
            return "unknown", None
        if att.node is not node and att.node.name != node.name:
            return "foreign", att
        if not att.live or att.task.current is not att:
            return "duplicate", att
        return "ok", att

    def accept(self, att: Attempt, now: float) -> None:
        att.lease = now + self.assign_timeout
        if att.task.state == ASSIGNED:
            self._move(att.task, ACCEPTED, now, att.node.name)

    def reject(self, att: Attempt, reason: str, now: float) -> None:
        task = att.task
        self.counters["rejected"] += 1
        task.add_avoid(att.node.identity)
        if task.rejected is None:
            task.rejected = set()
        task.rejected.add(att.node.identity)
        task.add_reason(f"{att.node.name}: {reason}")
        self._abandon(task, now, cancel=False)
        self._move(task, QUEUED, now, f"rejected by {att.node.name}: {reason}")
        self._enqueue(task, now)

    def progress(self, att: Attempt, body: dict[str, Any], now: float) -> None:
        att.lease = now + self.assign_timeout
        task = att.task
        if task.state == ASSIGNED:
            self._move(task, ACCEPTED, now, f"{att.node.name} (implied)")
        # The audit trail keeps each progress report (not a state: the task stays put).
        task.history.append((now, "progress", f"{body.get('fraction', '')} "
                             f"{body.get('note', '')}".strip()))
        if self.track_changes:
            self.changed[task.id] = task
        out = {"task": task.id, "seq": task.next_seq()}
        for k in ("fraction", "note"):
            if k in body:
                out[k] = body[k]
        self.out.append(("deliver", task, "task.progress", out))

    def result(self, att: Attempt, body: dict[str, Any], now: float) -> None:
        """A result for the current attempt: partial (relayed) or final (delivered once)."""
        task = att.task
        if task.state == ASSIGNED:
            # A forager may skip task.accept for a task that finishes at once.
            self._move(task, ACCEPTED, now, f"{att.node.name} (implied)")
        if body.get("partial"):
            att.lease = now + self.assign_timeout
            self.out.append(("deliver", task, "task.result",
                             {"task": task.id, "seq": task.next_seq(), "partial": True,
                              "value": body.get("value")}))
            return
        status = body.get("status", "ok")
        if status == "cancelled":
            # The forager gave the task up (it is stopping) without being asked to:
            # the task is not at fault, so it moves on without using up an attempt.
            task.add_avoid(att.node.identity)
            self._abandon(task, now, cancel=False)
            self.counters["reissued"] += 1
            self._move(task, QUEUED, now, f"given up by {att.node.name}")
            self._enqueue(task, now)
            return
        self._abandon(task, now, cancel=False)
        if status == "ok":
            self._outcome(att, True, now, capability_too=True)
            # IACP 1.1 results carry their fields in the body itself (status, artifacts...).
            result = body["result"] if "result" in body else {
                k: v for k, v in body.items() if k not in ("status", "ref", "partial")} or None
            self._finish(task, COMPLETED, now, {"result": result})
        else:
            raw = body.get("error")
            err: dict[str, Any] = raw if isinstance(raw, dict) else {}
            etype, emsg = str(err.get("type", "Error")), str(err.get("message", ""))
            if err.get("code") == Code.TOO_LARGE:
                # The forager could not send its result: running it again cannot help.
                self.too_large(att, emsg, now)
                return
            if task.tries == 0:
                # Breakers count failing tasks, not one task's retries: a payload its
                # handler rejects must not shut a capability down, an outage does.
                self._outcome(att, False, now, capability_too=True)
            task.tries += 1
            task.add_reason(f"{att.node.name}: {etype}: {emsg}")
            if task.tries >= task.max_attempts:
                self._abandon(task, now, cancel=False)
                self._finish(task, FAILED, now, {"error": {
                    "code": Code.HANDLER_ERROR, "type": etype, "message": emsg,
                    "forager": att.node.name, "cause": Code.HANDLER_ERROR,
                    "attempts": task.attempt}})
                self._dead_letter(task)
            else:
                self._retry_later(task, now, f"{etype} on {att.node.name}")

    def too_large(self, att: Attempt, message: str, now: float) -> None:
        """The attempt's result is over the size limit: the task fails at once, for good
        (a retry would produce the same result)."""
        task = att.task
        task.tries += 1
        self._abandon(task, now, cancel=False)  # it finished: nothing to cancel
        self._fail(task, now, Code.TOO_LARGE, message, cause=Code.TOO_LARGE,
                   forager=att.node.name)

    def release(self, att: Attempt) -> None:
        """A forager finished an abandoned attempt: free its slot."""
        if att.node.in_flight.pop(att.id, None) is not None:
            self.dirty = True

    def renew(self, node: Node, refs: list[Any], now: float) -> None:
        """A heartbeat listing the attempts a forager is running renews their leases."""
        lease = now + self.assign_timeout
        for ref in refs:
            att = node.in_flight.get(ref) if isinstance(ref, str) else None
            if att is not None:
                att.lease = lease

    def forager_joined(self, node: Node) -> None:
        self.dirty = True

    def forager_rejoined(self, old: Node, new: Node, running: list[Any], now: float) -> None:
        """A forager said hello again: adopt the attempts it still runs, reissue the rest."""
        keep = {r for r in running if isinstance(r, str)}
        for att in list(old.in_flight.values()):
            old.in_flight.pop(att.id, None)
            if att.id in keep and len(new.in_flight) < new.slots:
                att.node = new
                new.in_flight[att.id] = att
                att.lease = now + self.assign_timeout
                self._lease_due = min(self._lease_due, att.lease)
            elif att.live and att.task.current is att:
                self._reissue(att.task, now, f"{new.name} restarted without it", avoid=False)
        self.dirty = True

    def client_moved(self, old: bytes, new: bytes) -> None:
        """A client reconnected on a new connection: its tasks' results follow it."""
        for task in self.tasks.values():
            if task.client == old:
                task.client = new

    def forager_lost(self, node: Node, now: float, why: str = "forager lost") -> None:
        """Reissue everything a vanished forager was running."""
        for att in list(node.in_flight.values()):
            node.in_flight.pop(att.id, None)
            if att.live and att.task.current is att:
                self._reissue(att.task, now, f"{why}: {node.name}")
        # Queued tasks only this forager could serve now wait for another, for a while.
        for tool in node.tools:
            for _, _, task_id in self.queues.get(tool, ()):
                task = self.tasks.get(task_id)
                if task is not None and task.state == QUEUED and not self._anyone_serves(task):
                    self._wait_for_forager(task, now)
        self.dirty = True

    def _reissue(self, task: Task, now: float, why: str, *, avoid: bool = True,
                 cause: str = Code.FORAGER_LOST) -> None:
        task.tries += 1
        old = task.current
        if old is not None and avoid:
            # By identity, not name: a hung forager keeps its connection and is avoided,
            # while a restarted one connects afresh and may take the task again.
            task.add_avoid(old.node.identity)
        if old is not None and old.node.identity:
            self._outcome(old, False, now, capability_too=False)
        if task.tries >= task.max_attempts:
            self._fail(task, now, Code.ATTEMPTS_EXHAUSTED,
                       f"gave up after {task.tries} attempts; last: {why}",
                       reasons=task.reasons or [], cause=cause)
            return
        self._abandon(task, now, cancel=True)
        self.counters["reissued"] += 1
        task.add_reason(why)
        self._move(task, QUEUED, now, why)
        self._enqueue(task, now)

    def tick(self, now: float) -> None:
        """Expire leases, enforce deadlines and the wait for a capable forager."""
        for ref, att in list(self.held.items()):
            if att.lease <= now:
                del self.held[ref]
                if att.live and att.task.current is att:
                    self._reissue(att.task, now, "not reported by its forager after the "
                                  "queen restarted", avoid=False)
        if now >= self._lease_due:
            due = math.inf
            for node in self.registry.foragers():
                if not node.in_flight:
                    continue
                for att in list(node.in_flight.values()):
                    if att.lease <= now:
                        if att.live and att.task.current is att:
                            self._reissue(att.task, now, f"assign timeout on {node.name}",
                                          cause=Code.ASSIGN_TIMEOUT)
                        else:
                            node.in_flight.pop(att.id, None)
                            self.dirty = True
                    elif att.lease < due:
                        due = att.lease
            self._lease_due = due
        timers = self.timers
        while timers and timers[0][0] <= now:
            _, n, task_id, what = heapq.heappop(timers)
            task = self.tasks.get(task_id)
            field_ = _TIMER_FIELD[what]
            if task is None or getattr(task, field_) != n:
                continue  # stale: its task finished or left the queue
            setattr(task, field_, 0)
            self._live_timers -= 1
            if what == "retry":
                if task.state == QUEUED:
                    heapq.heappush(self.queues.setdefault(task.capability, []),
                                   (task.priority, task.order, task.id))
                    self.dirty = True
                    if not self._anyone_serves(task):
                        self._wait_for_forager(task, now)
                continue
            if what == "deadline":
                if task.state == QUEUED and task.attempt == 0 and not self._anyone_serves(task):
                    # It never ran: what ended it is that nobody could run it.
                    self._fail(task, now, Code.NO_FORAGER,
                               f"{self._nobody(task)} joined before the task's timeout of "
                               f"{task.timeout:g} s ended the wait", cause=Code.NO_FORAGER)
                else:
                    self._fail(task, now, Code.DEADLINE_EXCEEDED,
                               f"the task ran past its timeout of {task.timeout:g} s")
            elif what == "wait" and task.state == QUEUED and not self._anyone_serves(task):
                self._fail(task, now, Code.NO_FORAGER,
                           f"{self._nobody(task)} joined within {task.wait:g} s")
        self._compact_timers()
        if self._queue_stale:
            self._compact_queues()

    @staticmethod
    def _nobody(task: Task) -> str:
        who = f"no forager named {task.to!r}" if task.to else "no forager"
        what = f"{who} offering capability {task.capability!r}"
        if task.labels:
            labels = ", ".join(f"{k}={v!r}" for k, v in task.labels.items())
            what += f" with the labels {labels}"
        return what

    def _wait_for_forager(self, task: Task, now: float) -> None:
        # Only tasks nobody can serve get a timer: the common case pays nothing for it.
        # It goes when the task leaves the queue; back in it, the wait starts afresh.
        if not task.waiting:
            self._timer(now + task.wait, task, "wait")

    def _anyone_serves(self, task: Task) -> bool:
        for node in self.registry.serving(task.capability):
            if task.to and node.name != task.to:
                continue
            if task.labels and any(node.labels.get(k) != v for k, v in task.labels.items()):
                continue
            return True
        return False
    # -- queries --------------------------------------------------------------------------

    def depths(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for t in list(self.tasks.values()):
            if t.state == QUEUED:
                depth[t.capability] = depth.get(t.capability, 0) + 1
        return depth

