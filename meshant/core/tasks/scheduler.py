"""The queen's scheduler: the task lifecycle, assignment by capability, slots and leases,
reissue with attempt fencing. Sans-IO: events come in as method calls with the current
monotonic time; what to put on the wire goes out as typed work
(:class:`~meshant.core.tasks.work.Assign`, ``Revoke``, ``Deliver``, ``Watch``).

The scheduler is the only writer of a task's and an attempt's state, lease and counters:
the services ask it through the methods below, never change a task themselves. Each
lifecycle is a table keyed by (state, event) (:mod:`meshant.core.lifecycle`); every
change goes through ``_move`` (tasks) or ``_end_attempt`` (attempts), so a forbidden one
is a bug that shows (:class:`~meshant.core.lifecycle.LifecycleError`), not a silent
corruption. The scheduler is composed of collaborators that own their state: the ready
queues (:mod:`.queues`), the timers (:mod:`.timers`), the circuit breakers
(:mod:`.breakers`), the dead letters (:mod:`.dead_letters`). It owns the in-flight
relation itself: which attempts run on which forager (``running``), so the registry knows
how many slots a forager has taken (``Node.busy``) but not what runs in them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from meshant.core.counters import Counters
from meshant.core.lifecycle import (
    ATTEMPT,
    TASK,
    AttemptEvent,
    AttemptState,
    TaskEvent,
    TaskState,
    step,
)
from meshant.core.nodes.registry import ACTIVE, OFFLINE, Node, Registry
from meshant.core.policy import Backoff
from meshant.core.tasks import delays
from meshant.core.tasks.breakers import Breakers
from meshant.core.tasks.dead_letters import DeadLetters
from meshant.core.tasks.limits import Limits
from meshant.core.tasks.model import (
    ACCEPTED,
    ASSIGNED,
    CANCELLED,
    COMPLETED,
    DELAYED,
    FAILED,
    FINAL,
    INPUT_REQUIRED,
    QUEUED,
    SUSPENDED,
    Attempt,
    Task,
    is_graph_node,
    retries,
    slim,
)
from meshant.core.tasks.queues import TaskQueues
from meshant.core.tasks.rates import Rates
from meshant.core.tasks.steps import STEPS_BYTES, size_of
from meshant.core.tasks.timers import TaskTimers
from meshant.core.tasks.work import Assign, Deliver, Revoke, Watch, Work
from meshant.errors import QueueFull
from meshant.protocol.codes import Code

__all__ = [  # the task model is re-exported: it is what the scheduler takes and gives
    "ACCEPTED", "ASSIGNED", "CANCELLED", "COMPLETED", "FAILED", "FINAL", "QUEUED",
    "Attempt", "QueueFull", "Scheduler", "Task", "Verdict", "revive",
]

# The event that makes a task final, by the final state.
_ENDS = {COMPLETED: TaskEvent.COMPLETE, FAILED: TaskEvent.FAIL, CANCELLED: TaskEvent.CANCEL}
COUNTERS = ("submitted", "completed", "failed", "cancelled", "reissued", "rejected",
            "duplicates", "unknown_results", "retried", "dead_lettered", "suspended",
            "woken", "steps")
# What of a task.step body is its record.
_RECORD = ("position", "kind", "name", "occurrence", "value", "error", "child", "until",
           "request", "seconds")


def _waiting_for(w: dict[str, Any]) -> str:
    """What a suspended task waits for, in words (its audit trail, status)."""
    if "request" in w:
        return f"waits for an answer to {w['request']}"
    if "child" in w:
        return f"waits for sub-task {w['child']}"
    if "until" in w:
        return f"sleeps until {w['until']:.3f}"
    return "waits"


class Verdict(StrEnum):
    """What a forager's message about an assignment is (``Scheduler.lookup``)."""

    OK = "ok"  # about the task's current attempt, run by this forager
    DUPLICATE = "duplicate"  # about an attempt that no longer counts (expected, dropped)
    FOREIGN = "foreign"  # about another forager's attempt (impersonation, or a bug)
    UNKNOWN = "unknown"  # about no attempt this queen knows


def revive(r: dict[str, Any], to_wall: float) -> Task:
    """A Task from a journal row (``Journal.unfinished``/``find``); ``to_wall`` turns the
    row's wall-clock times into the scheduler's clock."""
    task = Task(id=r["id"], capability=r["capability"], payload=r["payload"],
                client_name=r["client_name"], priority=r["priority"],
                timeout=r["timeout"], to=r["to_name"], labels=r["labels"] or {},
                max_attempts=r["max_attempts"], wait=r["wait"], state=TaskState(r["state"]),
                attempt=r["attempt"], tries=r["tries"], restored=True,
                key=r.get("idem_key"), retry_base=r.get("retry_base"),
                retry_cap=r.get("retry_cap"), final=r["final"], dead=bool(r.get("dead")),
                retry_on=tuple(r.get("retry_on") or ()) or None,
                parent=r.get("parent"), wake=r.get("wake"), not_before=r.get("not_before"),
                concurrency=tuple(r["concurrency"]) if r.get("concurrency") else None,
                cost=r.get("cost"))
    task.submitted = r["created"] - to_wall
    if "events" in r:
        task.history = [(e["ts"] - to_wall, e["state"], e["why"]) for e in r["events"]]
        task.logged = len(task.history)
    return task


class Scheduler:
    """Queues, assignment and the task lifecycle. All times are the queen's monotonic clock."""

    def __init__(
        self,
        registry: Registry,
        work: list[Work] | None = None,
        *,
        assign_timeout: float = 300.0,
        max_queue: int = 100_000,
        keep_done: int = 10_000,
        default_wait: float = 30.0,
        backoff: Backoff | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        counters: Counters | None = None,
    ) -> None:
        self.registry = registry
        # Where the decisions of a turn go (the queen's outbox's ``work``, taken each turn).
        self.work: list[Work] = work if work is not None else []
        self.assign_timeout = assign_timeout
        self.max_queue = max_queue
        self.keep_done = keep_done
        self.default_wait = default_wait
        self.tasks: dict[str, Task] = {}
        self.done: OrderedDict[str, Task] = OrderedDict()
        # The tasks suspended now (their waits: status, the dashboard), by id.
        self.suspended: dict[str, Task] = {}
        self.attempts: dict[str, Attempt] = {}
        # What runs where: a forager's attempts, by assign id.
        self.running: dict[Node, dict[str, Attempt]] = {}
        self.queues = TaskQueues(self.tasks)
        self.timers = TaskTimers(self.tasks)
        self.limits = Limits(self.tasks)  # concurrency limits (core/tasks/limits.py)
        self.rates = Rates(self.tasks)  # rate limits (core/tasks/rates.py)
        self.breakers = Breakers(breaker_threshold, breaker_cooldown)
        self.dead = DeadLetters()
        self.dlq = self.dead.tasks
        self.queued = 0  # queued tasks, those in a retry backoff included
        self.delayed = 0  # delayed tasks (core/tasks/delays.py): in no queue yet
        # The colony's counters (one namespace, each name declared by its owner once).
        self.counters = counters if counters is not None else Counters()
        self.counters.declare("scheduler", *COUNTERS)
        self._order = itertools.count()
        # No lease of a running attempt ends before this: tick() scans the foragers only
        # from then on (leases only ever move later, new attempts lower it).
        self._lease_due = math.inf
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
        # Turns the journal's wall-clock times into this clock's (set by ``restore``).
        self.to_wall = 0.0
        # Graphs (meshant.core.graphs.book): told when a graph node's task ends.
        self.on_graph_final: Callable[[Task], None] | None = None
        # One-shot hooks on given tasks' ends, by task id (a schedule's queued tick
        # waiting for its last firing's task: core/schedules/book.py).
        self.final_hooks: dict[str, Callable[[Task], None]] = {}
        # Called as a task suspends (the conversations' hook: a durable ask answered
        # before its run ended wakes it at once).
        self.on_suspend: Callable[[Task, float], None] | None = None
        # Whether a task id may exist outside memory (the archive index), for dlq retry.
        self.archived: Callable[[str], bool] = lambda task_id: False

    # -- the in-flight relation -----------------------------------------------------------

    def running_on(self, node: Node) -> dict[str, Attempt]:
        """The attempts ``node`` runs (do not change the dict)."""
        return self.running.get(node) or {}

    def _hold(self, node: Node, att: Attempt) -> None:
        runs = self.running.get(node)
        if runs is None:
            runs = self.running[node] = {}
        runs[att.id] = att
        node.busy = len(runs)

    def _drop(self, node: Node, att_id: str) -> Attempt | None:
        runs = self.running.get(node)
        if runs is None:
            return None
        att = runs.pop(att_id, None)
        node.busy = len(runs)
        if not runs:
            del self.running[node]
        return att

    # -- lifecycle plumbing ---------------------------------------------------------------

    def _move(self, task: Task, event: TaskEvent, now: float, why: str = "") -> None:
        """Move the task by ``event`` (a change its table forbids is a bug:
        LifecycleError), into its audit trail and the journal's next record."""
        was = task.state
        state = task.state = (TASK.get((was, event))  # (step() only to raise)
                              or step(TASK, was, event, "task %s", task.id))
        task.history.append((now, state, why))
        if state == SUSPENDED:
            self.suspended[task.id] = task
        elif was == SUSPENDED:
            del self.suspended[task.id]
        if self.track_changes:
            self.changed[task.id] = task

    @staticmethod
    def _end_attempt(att: Attempt, event: AttemptEvent) -> None:
        att.state = (ATTEMPT.get((att.state, event))
                     or step(ATTEMPT, att.state, event, "attempt %s", att.id))

    def note(self, task: Task, now: float, what: str, why: str) -> None:
        """Add a line to the task's audit trail that is not a state (a question, an
        answer, progress): journaled with the task's next record."""
        task.history.append((now, what, why))
        if self.track_changes:
            self.changed[task.id] = task

    def _enqueue(self, task: Task, now: float | None = None, delay: float = 0.0) -> None:
        if now is not None and task.steps:
            w = self._sleeping(task, now)
            if w is not None:
                # Its run recorded a sleep and died before suspending: the task sleeps
                # the rest of it (never woken early by a re-run).
                task.wake = w
                if self.limits.active:
                    self._ready(self.limits.release(task))
                self._move(task, TaskEvent.SUSPEND, now, _waiting_for(w))
                self._arm_wake(task, now)
                return
        self.queued += 1
        if delay > 0 and now is not None:
            # Counted as queued from now; it joins its queue when the backoff ends.
            self.timers.set(now + delay, task, "retry")
            if self.limits.active:  # (its limits' tokens go to others meanwhile)
                self._ready(self.limits.release(task))
            return
        if not self.limits.active or self.limits.admit(task):
            self.queues.push(task)  # (else it waits at a full limit: limits.py)
            self.dirty = True
        if now is not None and not self._anyone_serves(task):
            self._wait_for_forager(task, now)

    def _finish(self, task: Task, state: TaskState, now: float, body: dict[str, Any]) -> None:
        """Make ``task`` final and emit its one and only final result."""
        if task.state == QUEUED:
            self.queued -= 1
            if not task.retry_timer and task.id not in self.limits.parked and \
                    task.id not in self.rates.parked:
                # Its queue entry stays behind, stale, until the queue is compacted.
                self.queues.left(task)
        elif task.state == DELAYED:
            self.delayed -= 1
        self.timers.unset_all(task)
        if self.limits.active:
            self._ready(self.limits.release(task))
        if self.rates.active:
            self.rates.forget(task)
        self._move(task, _ENDS[state], now, body.get("error", {}).get("code", "")
                   if state == FAILED else "")
        self.counters[state] += 1
        body["task"] = task.id
        body["state"] = state
        body["attempt"] = task.attempt
        body["seq"] = task.next_seq()
        task.final = body
        if task.steps is not None:
            # Its records are journaled (or were only ever memory's): a final task need
            # not hold up to STEPS_BYTES each in the queen's memory.
            task.steps, task.steps_bytes = None, 0
        if state != FAILED and (task.logged or not self.track_changes):
            # No longer needed (a failed task's may be retried); a task whose first
            # journal write waited for its end keeps it until that write has it.
            task.payload = None
        work = self.work
        work.append(Deliver(task, "task.result", body))
        for identity, name, alias in task._watchers or ():
            # Later submissions with the same idempotency key get the same result.
            work.append(Watch(identity, name, {**body, "task": alias, "original": task.id}))
        del self.tasks[task.id]
        self.done[task.id] = task
        while len(self.done) > self.keep_done:
            old_id, old = self.done.popitem(last=False)
            for n in range(1, old.attempt + 1):
                self.attempts.pop(f"{old_id}.{n}", None)
            if old.key is not None and self.by_key.get(old.key) == old_id:
                del self.by_key[old.key]
        if self.on_graph_final is not None and is_graph_node(task.id):  # graph hook
            self.on_graph_final(task)
        if self.final_hooks:
            hook = self.final_hooks.pop(task.id, None)
            if hook is not None:
                hook(task)
        if task.children and state != COMPLETED:
            # Its handler's sub-tasks have nobody to wait for them now.
            for cid in task.children:
                if cid in self.tasks:
                    self.cancel(cid, now, why="its parent task ended")
        if task.parent is not None:
            parent = self.tasks.get(task.parent)
            if parent is not None and parent.state == SUSPENDED and parent.wake is not None \
                    and parent.wake.get("child") == task.id:
                self.wake(parent, now, f"sub-task {task.id} ended")

    def _fail(self, task: Task, now: float, code: str, message: str, **extra: Any) -> None:
        self._abandon(task, now, cancel=True)
        extra.setdefault("cause", code)
        extra.setdefault("attempts", task.attempt)
        self._finish(task, FAILED, now, {"error": {"code": code, "message": message, **extra}})
        self._dead_letter(task)

    def _dead_letter(self, task: Task) -> None:
        """Every failed task lands in the dead-letter queue, with its last error, until
        retried or purged."""
        self.dead.add(task)
        self.counters["dead_lettered"] += 1

    def _retry_later(self, task: Task, now: float, why: str) -> None:
        """Queue the task again after a jittered backoff: its own policy, else the queen's."""
        delay = self.backoff.delay(task.tries - 1, task.retry_base, task.retry_cap)
        self.counters["retried"] += 1
        self._move(task, TaskEvent.REQUEUE, now, f"{why}; retry in {delay:.2f} s")
        self._enqueue(task, now, delay)

    def _abandon(self, task: Task, now: float, *, cancel: bool,
                 event: AttemptEvent = AttemptEvent.FENCE) -> None:
        """Fence off the task's current attempt (or, ``FINISH``, end it: its result was
        taken): anything it sends from now on is a duplicate."""
        att = task.current
        if att is None:
            return
        task.current = None
        self._end_attempt(att, event)
        self._drop(att.node, att.id)
        self.dirty = True
        if cancel and att.node.state == ACTIVE:
            self.work.append(Revoke(att.node, att))

    def _abandon_keep_slot(self, task: Task) -> None:
        # A cancelled attempt may still be running: its slot stays taken until the forager
        # answers or the lease runs out, so the forager is never given more than its slots.
        att = task.current
        if att is None:
            return
        task.current = None
        self._end_attempt(att, AttemptEvent.FENCE)
        if att.node.state == ACTIVE:
            self.work.append(Revoke(att.node, att))

    # -- events in ------------------------------------------------------------------------

    def submit(self, task: Task, now: float) -> Task:
        """Queue a new task (its id is new: the caller checked). Raises QueueFull and
        changes nothing then."""
        if task.id in self.tasks:
            # Two live tasks of one id would both run and both be journaled: a bug.
            raise RuntimeError(f"task {task.id} exists already")
        if self.queued + self.delayed >= self.max_queue:
            raise QueueFull(f"the queue holds {self.queued + self.delayed} tasks, its limit")
        task.order = next(self._order)
        task.submitted = now
        slim(task)
        first = QUEUED
        if task.not_before is None or task.not_before - self.to_wall <= now:
            entry = (now, QUEUED, "submitted")
        else:
            first = task.state = DELAYED  # (core/tasks/delays.py)
            entry = (now, DELAYED, f"submitted, {delays.describe(task.not_before)}")
        if task.history:
            task.history.append(entry)
        else:
            task.history = [entry]  # exactly sized
        if self.track_changes:
            self.changed[task.id] = task
        self.tasks[task.id] = task
        if task.key is not None:
            self.by_key[task.key] = task.id
        self.counters["submitted"] += 1
        if first is DELAYED:
            self._delay(task, now)
            return task
        if task.timeout is not None:
            task.deadline = now + task.timeout
            self.timers.set(task.deadline, task, "deadline")
        if not self._anyone_serves(task):
            self._wait_for_forager(task, now)
        self._enqueue(task)
        return task

    def cancel(self, task_id: str, now: float, why: str = "cancelled by the client"
               ) -> Task | None:
        """Cancel at once if queued or suspended; best effort (cancel sent to the
        forager) if assigned. Its running sub-tasks are cancelled too."""
        task = self.tasks.get(task_id)
        if task is None:
            return None
        self._abandon_keep_slot(task)
        self._finish(task, CANCELLED, now, {"error": {"code": Code.CANCELLED,
                                                      "message": why}})
        return task

    def lookup(self, node: Node, ref: str | None) -> tuple[Verdict, Attempt | None]:
        """What a forager's message about an assign is (see :class:`Verdict`)."""
        att = self.attempts.get(ref) if ref is not None else None
        if att is None:
            return Verdict.UNKNOWN, None
        if att.node is not node and att.node.name != node.name:
            return Verdict.FOREIGN, att
        if not att.live or att.task.current is not att:
            return Verdict.DUPLICATE, att
        return Verdict.OK, att

    def accept(self, att: Attempt, now: float) -> None:
        att.lease = now + self.assign_timeout
        if att.task.state == ASSIGNED:
            self._move(att.task, TaskEvent.ACCEPT, now, att.node.name)

    def _implied_accept(self, att: Attempt, now: float) -> None:
        """Anything a forager sends about an assignment implies it took it: a forager may
        skip task.accept for a task that finishes at once (one message fewer)."""
        if att.task.state == ASSIGNED:
            self._move(att.task, TaskEvent.ACCEPT, now, f"{att.node.name} (implied)")

    def reject(self, att: Attempt, reason: str, now: float) -> None:
        task = att.task
        self.counters["rejected"] += 1
        task.add_avoid(att.node.identity)
        if task.rejected is None:
            task.rejected = set()
        task.rejected.add(att.node.identity)
        task.add_reason(f"{att.node.name}: {reason}")
        self._abandon(task, now, cancel=False)
        self._move(task, TaskEvent.REQUEUE, now, f"rejected by {att.node.name}: {reason}")
        self._enqueue(task, now)

    @staticmethod
    def _numbered(att: Attempt, body: dict[str, Any], out: dict[str, Any]) -> bool:
        """A progress report or partial result the forager numbered (``n``): False if
        this attempt's was taken already (sent again after a reconnect, or duplicated on
        the way); else ``out`` carries the attempt and number (kept in the journal, so a
        queen taking over knows what the forager need not send again)."""
        n = body.get("n")
        if n.__class__ is not int:
            return True
        if n <= att.n:
            return False
        att.n = n
        out["attempt"] = att.number
        out["n"] = n
        return True

    def progress(self, att: Attempt, body: dict[str, Any], now: float) -> None:
        att.lease = now + self.assign_timeout
        task = att.task
        out: dict[str, Any] = {"task": task.id}
        if not self._numbered(att, body, out):
            return  # taken already
        self._implied_accept(att, now)
        charge = body.get("charge")
        if charge.__class__ in (int, float) and 0 <= charge <= 1e9 and self.rates.active:
            self.rates.charge(task, charge, now)  # what its run really spent (rates.py)
        if charge is not None and "fraction" not in body and "note" not in body:
            return  # (a charge alone is no progress to tell the submitter of)
        # The audit trail keeps each progress report (not a state: the task stays put).
        self.note(task, now, "progress",
                  f"{body.get('fraction', '')} {body.get('note', '')}".strip())
        out["seq"] = task.next_seq()
        for k in ("fraction", "note"):
            if k in body:
                out[k] = body[k]
        self.work.append(Deliver(task, "task.progress", out))

    def deliver(self, task: Task, kind: str, body: dict[str, Any]) -> None:
        """An update of the task for its submitter (and its watchers), in sequence."""
        self.work.append(Deliver(task, kind, {"task": task.id, "seq": task.next_seq(),
                                                     **body}))

    def result(self, att: Attempt, body: dict[str, Any], now: float) -> None:
        """A result for the current attempt: partial (relayed) or final (delivered once)."""
        task = att.task
        self._implied_accept(att, now)
        if body.get("partial"):
            att.lease = now + self.assign_timeout
            out: dict[str, Any] = {"task": task.id}
            if self._numbered(att, body, out):
                out["seq"] = task.next_seq()
                out["partial"] = True
                out["value"] = body.get("value")
                self.work.append(Deliver(task, "task.result", out))
            return
        status = body.get("status", "ok")
        if status == "suspended":
            self._suspend(att, body.get("wait"), now)
            return
        if status == "cancelled":
            # The forager gave the task up (it is stopping) without being asked to:
            # the task is not at fault, so it moves on without using up an attempt.
            task.add_avoid(att.node.identity)
            self.breakers.settled(att.node.name, task.capability)
            self._abandon(task, now, cancel=False)
            self.counters["reissued"] += 1
            self._move(task, TaskEvent.REQUEUE, now, f"given up by {att.node.name}")
            self._enqueue(task, now)
            return
        self._abandon(task, now, cancel=False, event=AttemptEvent.FINISH)
        if status == "ok":
            self.breakers.outcome(att.node.name, task.capability, True, now)
            # IACP 1.1 results carry their fields in the body itself (status, artifacts...).
            result = body["result"] if "result" in body else {
                k: v for k, v in body.items() if k not in ("status", "ref", "partial")} or None
            self._finish(task, COMPLETED, now, {"result": result})
            return
        raw = body.get("error")
        err: dict[str, Any] = raw if isinstance(raw, dict) else {}
        etype, emsg = str(err.get("type", "Error")), str(err.get("message", ""))
        if err.get("code") == Code.TOO_LARGE:
            # The forager could not send its result: running it again cannot help.
            self.too_large(att, emsg, now)
            return
        nondeterministic = err.get("code") == Code.NONDETERMINISTIC
        # (a re-run that diverged from its record would diverge again: never retried)
        again = retries(task, err) and not nondeterministic
        if task.tries == 0 and again:
            # Breakers count failing tasks, not one task's retries: a payload its
            # handler rejects must not shut a capability down, an outage does. And only
            # failures that are retried (a policy says they may pass, an outage's): one
            # that fails its task at once is the handler's answer to that task, and must
            # not hold back a forager's other capabilities.
            self.breakers.outcome(att.node.name, task.capability, False, now)
        else:
            self.breakers.settled(att.node.name, task.capability)
        task.tries += 1
        task.add_reason(f"{att.node.name}: {etype}: {emsg}")
        if task.tries >= task.max_attempts or not again:
            self._abandon(task, now, cancel=False)
            code = Code.NONDETERMINISTIC if nondeterministic else Code.HANDLER_ERROR
            error = {"code": code, "type": etype, "message": emsg,
                     "forager": att.node.name, "cause": code,
                     "attempts": task.attempt, "reasons": task.reasons or []}
            tb = err.get("traceback")
            if isinstance(tb, list):
                error["traceback"] = tb
            self._finish(task, FAILED, now, {"error": error})
            self._dead_letter(task)
        else:
            self._retry_later(task, now, f"{etype} on {att.node.name}")

    # -- durable agents: steps, sub-tasks, waits ------------------------------------------

    def record_step(self, att: Attempt, body: dict[str, Any], now: float
                    ) -> dict[str, Any] | None:
        """A step's record from the attempt's handler (its body already checked: see
        ``core/tasks/steps.py``). Returns the record to journal, or None when it was
        taken already (sent again, or a position recorded by an earlier run). A task
        whose records outgrow their bound fails (too-large)."""
        att.lease = now + self.assign_timeout
        task = att.task
        out: dict[str, Any] = {}
        if not self._numbered(att, body, out):
            return None
        self._implied_accept(att, now)
        steps = task.steps
        if steps is None:
            steps = task.steps = []
        if body["position"] < len(steps):
            return None  # recorded by an earlier run: the same step, already kept
        rec = {k: body[k] for k in _RECORD if k in body}
        seconds = rec.get("seconds")
        if rec["kind"] == "sleep" and isinstance(seconds, int | float):
            # A sleep ends on this queen's wall clock (the journal's), whatever the
            # forager's says: a re-run on another machine, or after a failover, keeps it.
            rec["until"] = now + self.to_wall + max(0.0, float(seconds))
        size = size_of(rec)
        if task.steps_bytes + size > STEPS_BYTES:
            self._fail(task, now, Code.TOO_LARGE, f"task {task.id}'s recorded steps would "
                       f"take over {STEPS_BYTES:,} bytes: keep large values out of step "
                       "results (put them in colony memory or a blob store)",
                       cause=Code.TOO_LARGE)
            return None
        steps.append(rec)
        task.steps_bytes += size
        self.counters["steps"] += 1
        # Its record must find its task after a restart: a young task's first write
        # waits no longer (core/journal/defer.py).
        self.journal_now(task)
        return rec

    def _sleeping(self, task: Task, now: float) -> dict[str, Any] | None:
        """The sleep a task's last record says it is in, if not over on this queen's
        wall clock."""
        last = task.steps[-1] if task.steps else None
        until = last.get("until") if last is not None else None
        if (last is not None and last.get("kind") == "sleep"
                and isinstance(until, int | float) and until > now + self.to_wall):
            return {"until": until, "position": last["position"]}
        return None

    def _suspend(self, att: Attempt, wait: Any, now: float) -> None:
        """The attempt's handler waits durably: the attempt ends (its slot is free) and
        the task waits for ``wait`` — ``until`` a wall-clock time, an answer to
        ``request``, the end of sub-task ``child``."""
        task = att.task
        self._abandon(task, now, cancel=False, event=AttemptEvent.FINISH)
        self.breakers.settled(att.node.name, task.capability)
        w = dict(wait) if isinstance(wait, dict) else {}
        pos = w.get("position")
        steps = task.steps or []
        if "until" in w and pos.__class__ is int and 0 <= pos < len(steps) and isinstance(
                steps[pos].get("until"), int | float):
            w["until"] = steps[pos]["until"]  # (the sleep's end as its record has it)
        task.wake = w
        if self.limits.active:  # (a suspended task runs nowhere: its tokens go back)
            self._ready(self.limits.release(task))
        self._move(task, TaskEvent.SUSPEND, now, _waiting_for(w))
        self.counters["suspended"] += 1
        self._arm_wake(task, now)
        if self.on_suspend is not None and task.state == SUSPENDED:
            self.on_suspend(task, now)

    def _arm_wake(self, task: Task, now: float) -> None:
        """Set what wakes a suspended task: its timer, or a child that ended already."""
        w = task.wake or {}
        until = w.get("until")
        if isinstance(until, int | float):
            # Never early: the wall-clock time on this queen's monotonic clock.
            self.timers.set(max(now, until - self.to_wall), task, "wake")
        pos = w.get("position")
        if "request" in w and pos.__class__ is int and len(task.steps or ()) > pos:
            # Its answer was recorded (its wake did not reach the journal before a crash).
            self.wake(task, now, f"answer to {w['request']} (recorded)")
            return
        child = w.get("child")
        if isinstance(child, str) and child not in self.tasks:
            # It ended already (or never was: the re-run calls it again, and learns so).
            self.wake(task, now, f"sub-task {child} ended")

    def wake(self, task: Task, now: float, why: str) -> None:
        """What a suspended task waited for came: it runs again (its handler replays
        its recorded steps and passes the wait at once)."""
        if task.state != SUSPENDED:
            return
        self.timers.unset(task, "wake")
        task.wake = None
        self.counters["woken"] += 1
        self._move(task, TaskEvent.WAKE, now, why)
        self._enqueue(task, now)

    def answer_step(self, task: Task, record: dict[str, Any], now: float) -> dict[str, Any] | None:
        """The answer a suspended task waited for: recorded as the step that asked (its
        re-run gets it back), and the task woken. Returns the record to journal."""
        steps = task.steps
        if steps is None:
            steps = task.steps = []
        if record["position"] != len(steps):
            return None
        steps.append(record)
        task.steps_bytes += size_of(record)
        self.journal_now(task)
        self.wake(task, now, f"answer to {record.get('request')}")
        return record

    def add_child(self, parent: Task, child: Task, now: float) -> None:
        """``child`` is the sub-task ``parent``'s handler called (submitted by the
        caller): the parent's cancel reaches it."""
        if parent.children is None:
            parent.children = []
        parent.children.append(child.id)
        self.submit(child, now)

    def too_large(self, att: Attempt, message: str, now: float) -> None:
        """The attempt's result is over the size limit: the task fails at once, for good
        (a retry would produce the same result)."""
        task = att.task
        task.tries += 1
        # It finished: nothing to cancel.
        self._abandon(task, now, cancel=False, event=AttemptEvent.FINISH)
        self._fail(task, now, Code.TOO_LARGE, message, cause=Code.TOO_LARGE,
                   forager=att.node.name)

    def release(self, att: Attempt) -> None:
        """A forager finished an abandoned attempt: free its slot."""
        if self._drop(att.node, att.id) is not None:
            self.dirty = True

    def late_final(self, att: Attempt) -> None:
        """A final answer for an attempt no longer current: count it (unless it is the
        expected end of a cancelled task's run) and free the slot it was holding."""
        if att.task.state != CANCELLED:
            self.counters["duplicates"] += 1
        self.release(att)

    def stale_final(self, node: Node, ref: str) -> None:
        """The final answer of an old run (``Node.stale``: an assignment a restarted
        queen did not make): dropped as a duplicate, and its id no longer stale."""
        stale = node.stale
        if stale is None:
            return
        stale.discard(ref)
        if not stale:
            node.stale = None
            self.dirty = True
        self.counters["duplicates"] += 1

    # -- questions (the conversations service asks) ---------------------------------------

    def asked(self, att: Attempt, now: float, note: str) -> None:
        """The attempt's handler asked a question and waits: its lease is renewed, the
        task accepted (implied) and waiting for input (or, already waiting, the question
        noted)."""
        att.lease = now + self.assign_timeout
        task = att.task
        self._implied_accept(att, now)
        if task.state == INPUT_REQUIRED:
            self.note(task, now, "ask", note)
        else:
            self._move(task, TaskEvent.ASK, now, note)

    def input_received(self, task: Task, now: float) -> None:
        """Nothing the task's handler waits on is left unanswered: it runs on."""
        if task.state == INPUT_REQUIRED:
            self._move(task, TaskEvent.INPUT, now, "input received")

    # -- who hears of a task --------------------------------------------------------------

    def follow(self, task: Task, identity: bytes, name: str | None = None) -> None:
        """The task's results go to the connection ``identity`` from now on (its
        submitter reconnected; a graph sent again), and to ``name``'s if given."""
        task.client = identity
        if name is not None:
            task.client_name = name

    def journal_now(self, task: Task) -> None:
        """A task whose first journal write waited (core/journal/defer.py) is written in
        this turn's record: an acknowledgement is about to promise it durable."""
        if task.logged == 0 and not task.restored and self.track_changes:
            task.defer = False
            self.changed[task.id] = task

    def renew(self, node: Node, refs: Iterable[Any], now: float) -> None:
        """A heartbeat listing the attempts a forager is running renews their leases."""
        lease = now + self.assign_timeout
        runs = self.running.get(node)
        if runs is None:
            return
        for ref in refs:
            att = runs.get(ref) if isinstance(ref, str) else None
            if att is not None:
                att.lease = lease

    def forager_joined(self, node: Node) -> None:
        self.dirty = True

    def forager_rejoined(self, old: Node, new: Node, running: list[Any], now: float) -> None:
        """A forager said hello again: adopt the attempts it still runs, reissue the rest."""
        keep = {r for r in running if isinstance(r, str)}
        for att in list(self.running_on(old).values()):
            self._drop(old, att.id)
            if att.id in keep and new.busy < new.slots:
                att.node = new
                self._hold(new, att)
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
        for att in list(self.running_on(node).values()):
            self._drop(node, att.id)
            if att.live and att.task.current is att:
                self._reissue(att.task, now, f"{why}: {node.name}")
        # Queued tasks only this forager could serve now wait for another, for a while.
        for tool in sorted(node.tools):
            for _, _, task_id in self.queues.entries(tool):
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
            self.breakers.outcome(old.node.name, None, False, now)
            # (a lost run says nothing of the capability: its trial, if it was one, ends)
            self.breakers.settled(old.node.name, task.capability)
        if task.tries >= task.max_attempts:
            self._fail(task, now, Code.ATTEMPTS_EXHAUSTED,
                       f"gave up after {task.tries} attempts; last: {why}",
                       reasons=task.reasons or [], cause=cause)
            return
        self._abandon(task, now, cancel=True)
        self.counters["reissued"] += 1
        task.add_reason(why)
        self._move(task, TaskEvent.REQUEUE, now, why)
        self._enqueue(task, now)

    def tick(self, now: float) -> None:
        """Expire leases, enforce deadlines and the wait for a capable forager."""
        if self.queued and self.breakers.cooled(now):
            self.dirty = True  # a circuit may let its trial through now
        for ref, att in list(self.held.items()):
            if att.lease <= now:
                del self.held[ref]
                if att.live and att.task.current is att:
                    self._reissue(att.task, now, "not reported by its forager after the "
                                  "queen restarted", avoid=False)
        if now >= self._lease_due:
            due = math.inf
            for node, runs in list(self.running.items()):
                if node.role != "forager":
                    continue
                for att in list(runs.values()):
                    if att.lease <= now:
                        if att.live and att.task.current is att:
                            self._reissue(att.task, now, f"assign timeout on {node.name}",
                                          cause=Code.ASSIGN_TIMEOUT)
                        else:
                            self._drop(node, att.id)
                            self.dirty = True
                    elif att.lease < due:
                        due = att.lease
            self._lease_due = due
        if now >= self.rates.due:  # buckets refilled: who waited at them goes on
            self._ready(self.rates.wake(now))
        for task, what in self.timers.due(now):
            if what == "delay":
                self._release(task, now)
                continue
            if what == "wake":
                self.wake(task, now, "its sleep ended")
                continue
            if what == "retry":
                if task.state == QUEUED:
                    if not self.limits.active or self.limits.admit(task):
                        self.queues.push(task)
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
        self.timers.compact()
        self.queues.compact()

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
            self.timers.set(now + task.wait, task, "wait")

    def _anyone_serves(self, task: Task) -> bool:
        for node in self.registry.serving(task.capability):
            if task.to and node.name != task.to:
                continue
            if task.labels and any(node.labels.get(k) != v for k, v in task.labels.items()):
                continue
            return True
        return False

    # -- concurrency limits (the rules: core/tasks/limits.py) -----------------------------

    def _ready(self, tasks: list[Task]) -> None:
        """Tasks that waited at a limit and have their tokens now: into their queues."""
        for t in tasks:
            if t.state == QUEUED and not t.retry_timer:
                self.queues.push(t)
                self.dirty = True

    # -- delayed tasks (the rules: core/tasks/delays.py) ----------------------------------

    def _delay(self, task: Task, now: float) -> None:
        """Hold a delayed task out of its queue until its ``not_before`` (wall clock)."""
        self.delayed += 1
        when = task.not_before if task.not_before is not None else now + self.to_wall
        self.timers.set(delays.due(when, self.to_wall, now), task, "delay")

    def _release(self, task: Task, now: float) -> None:
        """A delayed task's time came: it joins its queue, its timeout and its wait for a
        capable forager start now."""
        self.delayed -= 1
        self._move(task, TaskEvent.RELEASE, now, "its time came")
        if task.timeout is not None:
            task.deadline = now + task.timeout
            self.timers.set(task.deadline, task, "deadline")
        self._enqueue(task, now)

    # -- assignment -----------------------------------------------------------------------

    def _pick(self, task: Task) -> Node | None:
        """The least loaded forager with a free slot that may take ``task`` now. One the
        task's earlier attempts went wrong on (``avoid``) takes it only when no other
        forager could ever take it (it is the one the task names, or the only one with
        its labels): avoiding it then would leave the task waiting for ever."""
        best: Node | None = None
        best_load = 2.0
        by_name = self.registry.by_name
        names: Iterable[str] = self.registry.by_tool.get(task.capability, ())
        if task.to is not None:
            names = (task.to,) if task.to in names else ()
        avoided: list[Node] | None = None
        others = False
        for name in names:
            node = by_name[name]
            if node.state != ACTIVE:
                continue
            if task.labels and any(node.labels.get(k) != v for k, v in task.labels.items()):
                continue
            if task.avoid and node.identity in task.avoid:
                if avoided is None:
                    avoided = []
                avoided.append(node)
                continue
            others = True
            load = self._load(task, node)
            if load is not None and load < best_load:
                best, best_load = node, load
                if load == 0.0:
                    break
        if best is None and avoided and not others:
            rejected = task.rejected
            for node in avoided:
                if rejected and node.identity in rejected:
                    continue  # it said no: that stands
                load = self._load(task, node)
                if load is not None and load < best_load:
                    best, best_load = node, load
        return best

    def _load(self, task: Task, node: Node) -> float | None:
        """How loaded ``node`` is (0.0-1.0), or None if it cannot take ``task`` now."""
        if not self.breakers.forager_allows(node.name, self._now):
            return None  # its circuit is open: it keeps failing
        busy = node.busy
        if busy >= node.slots:
            return None
        if node.stale and f"{task.id}.{task.attempt + 1}" in node.stale:
            return None  # an old run there still answers to that id
        return busy / node.slots

    def _has_capacity(self, capability: str) -> bool:
        by_name = self.registry.by_name
        return any(by_name[n].free > 0 for n in self.registry.by_tool.get(capability, ()))

    def _all_rejected(self, task: Task) -> bool:
        names: Iterable[str] = self.registry.by_tool.get(task.capability, {})
        if task.to is not None:
            names = [task.to] if task.to in names else []
        names = list(names)
        by_name = self.registry.by_name
        rejected = task.rejected
        return bool(names) and rejected is not None and all(
            by_name[n].identity in rejected for n in names)

    def dispatch(self, now: float, scan_limit: int = 256) -> int:
        """Assign queued tasks to free capable foragers. Returns how many were assigned."""
        self.dirty = False
        assigned = 0
        self._now = now
        queues = self.queues
        for cap, heap in list(queues.heaps.items()):
            if not self.breakers.capability_allows(cap, now):
                continue  # this capability keeps failing everywhere: hold its tasks
            skipped: list[tuple[int, int, str]] = []
            while heap and len(skipped) < scan_limit and self._has_capacity(cap):
                entry = heapq.heappop(heap)
                task = queues.is_current(entry)
                if task is None:
                    continue
                node = self._pick(task)
                if node is not None and self.rates.active and not self.rates.take(task, now):
                    continue  # its bucket is short: it waits at it (core/tasks/rates.py)
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
            queues.settle(cap)
        return assigned

    def _assign(self, task: Task, node: Node, now: float) -> None:
        self.breakers.started(node.name, task.capability)
        if task.waiting:
            self.timers.unset(task, "wait")  # it left the queue: no longer waiting for one
        task.attempt += 1
        att = Attempt(f"{task.id}.{task.attempt}", task, node, task.attempt,
                      now + self.assign_timeout)
        task.current = att
        self._hold(node, att)
        if att.lease < self._lease_due:
            self._lease_due = att.lease
        self.attempts[att.id] = att
        self._move(task, TaskEvent.ASSIGN, now, node.name)
        self.work.append(Assign(node, att))

    # -- restart --------------------------------------------------------------------------

    def restore(self, rows: list[dict[str, Any]], now: float, wall_now: float,
                grace: float) -> int:
        """Take back a journal's tasks after a restart; returns how many are unfinished.

        ``rows``: the unfinished tasks and the dead letters (``Journal.unfinished``).
        Other final tasks stay on disk, read when asked for (``core/journal/archive.py``)."""
        self.to_wall = wall_now - now
        unfinished = 0
        queued: list[Task] = []
        for r in rows:
            if r["final"] is not None and not r.get("dead"):
                continue  # finished: the journal keeps it
            task = revive(r, self.to_wall)
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
            if task.state == DELAYED:
                self._delay(task, now)  # its time is journaled: it waits for it again
                continue
            if task.timeout is not None:
                # (A delayed task's run-time limit counts from its release.)
                start = task.submitted if task.not_before is None else max(
                    task.submitted, task.not_before - self.to_wall)
                task.deadline = start + task.timeout
                self.timers.set(task.deadline, task, "deadline")
            if task.state == QUEUED:
                queued.append(task)  # (after the running ones took their limits' tokens)
                continue
            if task.state == SUSPENDED:
                self.suspended[task.id] = task
                continue  # armed once its steps are back (restore_steps)
            # Assigned before the restart: perhaps still running on its forager.
            ghost = Node(name=r["forager"] or "?", identity=b"", role="forager", codec="",
                         state=OFFLINE)
            att = Attempt(f"{task.id}.{task.attempt}", task, ghost, task.attempt, now + grace,
                          AttemptState.HELD)
            task.current = att
            self.attempts[att.id] = att
            self.held[att.id] = att
            if self.limits.active:
                self.limits.hold(task)  # (perhaps still running: it keeps its tokens)
        for task in queued:
            self._enqueue(task, now)
        self.dirty = True
        return unfinished

    def restore_steps(self, steps: dict[str, list[dict[str, Any]]], now: float) -> None:
        """The restored tasks' recorded steps (after ``restore``); suspended tasks wait
        again for what they waited for."""
        for task_id, recs in steps.items():
            task = self.tasks.get(task_id)
            if task is not None:
                task.steps = list(recs)
                task.steps_bytes = sum(size_of(r) for r in recs)
        for task in list(self.tasks.values()):
            parent = self.tasks.get(task.parent) if task.parent is not None else None
            if parent is not None:
                # A parent's cancel reaches the sub-tasks it called before the restart.
                if parent.children is None:
                    parent.children = []
                parent.children.append(task.id)
        for task in list(self.tasks.values()):
            if task.state == SUSPENDED:
                self._arm_wake(task, now)

    def adopt(self, node: Node, refs: list[Any], now: float) -> int:
        """A forager's hello lists what it runs: take back the held attempts it names."""
        n = 0
        for ref in refs:
            att = self.held.get(ref) if isinstance(ref, str) else None
            if att is None or att.node.name != node.name or node.busy >= node.slots:
                continue
            del self.held[ref]
            self._end_attempt(att, AttemptEvent.ADOPT)
            att.node = node
            att.lease = now + self.assign_timeout
            self._lease_due = min(self._lease_due, att.lease)
            self._hold(node, att)
            if not att.live:
                # Cancelled while its forager was away: the run goes on there, so it
                # keeps its slot until it answers, and is told to stop now.
                self.work.append(Revoke(node, att))
            n += 1
        return n

    # -- dead letters ---------------------------------------------------------------------

    def dlq_retry(self, task_id: str, client: bytes, client_name: str, now: float) -> Task:
        """Submit a dead letter's work again as a new task (for ``client``)."""
        old, new = self.dead.retry(task_id, client, client_name,
                                   lambda i: self.find_live(i) is not None or self.archived(i))
        if self.track_changes:
            self.changed[old.id] = old
        return self.submit(new, now)

    def dlq_purge(self, task_id: str) -> None:
        task = self.dead.purge(task_id)
        if self.track_changes:
            self.changed[task.id] = task

    # -- queries --------------------------------------------------------------------------

    def find_live(self, task_id: str) -> Task | None:
        """A task the scheduler holds: running, recently finished, or a dead letter."""
        return self.tasks.get(task_id) or self.done.get(task_id) or self.dlq.get(task_id)

    def depths(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for t in list(self.tasks.values()):
            if t.state == QUEUED:
                depth[t.capability] = depth.get(t.capability, 0) + 1
        return depth
