"""What the queen's loop publishes for observers: one plain dict, rebuilt every ``period``.

Sans-IO like the core: :meth:`Observer.publish` reads a
:class:`~meshant.core.queen.router.QueenCore` in the loop's own thread (so nothing it
reads changes under it) and ``now`` is the driver's monotonic clock. The result is swapped
into :attr:`Observer.latest` in one assignment; the HTTP server, the metrics and the
dashboard only ever read that reference, so serving them takes no lock the loop waits on
and reads nothing the loop is changing.

The cost per snapshot is bounded: finished tasks are read once each (walking the
scheduler's ``done`` back to the last one already seen), new submissions likewise (the
tail of the scheduler's ``tasks``), foragers through their in-flight attempts, and the
one pass over live tasks (queue depth per capability) takes at most about a millisecond
per snapshot (``SCAN_BUDGET``) and goes on at the next: a queue of 100,000 is counted over
a few seconds instead of stalling the loop for tens of milliseconds at once (the copy of
the ids that starts a pass, about 1.5 ms per 100,000, is the one step not split).
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshant.core.tasks.model import ASSIGNED, FINAL, QUEUED, Task

if TYPE_CHECKING:
    from meshant.core.queen.router import QueenCore

# Seconds: from a millisecond (an echo on loopback) to the default assign timeout.
BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
KEEP_TASKS = 40  # running, recent and dead-letter tasks listed, each
KEEP_KEYS = 200  # colony memory keys listed
HISTORY = 600  # chart points kept (five minutes at the default period)
WINDOW = 10.0  # seconds of finished tasks the latency percentiles cover
SCAN_BUDGET = 0.001  # seconds of counting queued tasks per snapshot, at most (about)
SCAN_SLICE = 500  # tasks counted between two looks at the clock


@dataclass(slots=True)
class Histogram:
    """Cumulative counts per bucket (Prometheus style: ``counts[i]`` is observations up to
    ``BUCKETS[i]``, not cumulated yet; the exporter cumulates), their sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0
    count: int = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(BUCKETS, v)] += 1
        self.sum += v
        self.count += 1

    def export(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum, "count": self.count}


@dataclass(slots=True)
class _PerCapability:
    finished: dict[str, int] = field(default_factory=dict)  # completed+failed+cancelled
    completed: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)
    reissued: dict[str, int] = field(default_factory=dict)


def _bump(d: dict[str, int], k: str, n: int = 1) -> None:
    d[k] = d.get(k, 0) + n


INPUT_REQUIRED = "input-required"


def task_view(task: Task, now: float, wall: float) -> dict[str, Any]:
    """A task as the dashboard lists it, its audit timeline included (seconds since
    submission, state, why). ``started`` is when its latest attempt began, in seconds
    since submission (None while it never ran): its age counts from submission, its
    run time from there."""
    started = None
    for t, s, _ in reversed(task.history):
        if s == ASSIGNED:
            started = round(t - task.submitted, 6)
            break
    view: dict[str, Any] = {
        "task": task.id, "capability": task.capability, "state": task.state,
        "attempt": task.attempt, "priority": task.priority,
        "forager": task.current.node.name if task.current is not None else None,
        "client": task.client_name, "submitted": round(task.submitted + wall, 3),
        "age": round(now - task.submitted, 3), "started": started,
        "history": [[round(t - task.submitted, 6), s, w] for t, s, w in task.history],
    }
    if task.wake is not None:
        view["waiting"] = {k: v for k, v in task.wake.items() if k in (
            "until", "request", "child", "position")}
    if task.steps:
        view["steps"] = len(task.steps)
    if task.parent is not None:
        view["parent"] = task.parent
    if task.children:
        view["children"] = list(task.children[:KEEP_TASKS])
    final = task.final
    if final is not None and "error" in final:
        err = final["error"]
        view["error"] = {"code": err.get("code"), "message": err.get("message")}
    return view


class Observer:
    """Builds and holds the latest snapshot of a queen (see the module's docstring).

    The driver calls :meth:`publish` once ``now`` reaches :attr:`next`, and tells
    :meth:`wrote` how long each journal write took. :attr:`role` is what the last
    snapshot found the queen to be: ``leader``, or ``standby`` while another queen holds
    the shared journal's lease.
    """

    def __init__(self, *, period: float = 0.5) -> None:
        if period <= 0:
            raise ValueError("period must be > 0")
        self.period = period
        self.role = "leader"
        self._core: object = None
        self.latest: dict[str, Any] | None = None
        self.published = 0.0  # the driver's ``now`` (monotonic) at the latest snapshot
        self.journal_seconds = 0.0
        self.journal_writes = 0
        self.next = 0.0
        self._seq = 0
        self._last_done: str | None = None
        self._caps = _PerCapability()
        self._queue_wait = Histogram()
        self._run_time = Histogram()
        self._latency = Histogram()
        self._recent: deque[tuple[float, float]] = deque(maxlen=20_000)  # (done at, e2e)
        self._history: deque[tuple[float | int | None, ...]] = deque(maxlen=HISTORY)
        self._scan: dict[str, int] = {}  # queued tasks per capability, last full count
        self._scan_keys: list[str] | None = None
        self._scan_pos = 0
        self._scan_acc: dict[str, int] = {}
        self._submitted: dict[str, int] = {}
        self._last_order = -1  # the newest submission counted (scheduler's task.order)
        # Operator commands from other threads, run by the loop at its next publish.
        self._commands: deque[tuple[str, str, Future[dict[str, Any]]]] = deque(maxlen=64)

    def command(self, op: str, arg: str) -> Future[dict[str, Any]]:
        """Ask the loop to run ``op`` on ``arg`` (from any thread): ``cancel`` a task the
        operator names, whoever submitted it. The future holds the outcome, or a
        LookupError; the caller wakes the loop (or waits up to one period)."""
        fut: Future[dict[str, Any]] = Future()
        self._commands.append((op, arg, fut))
        self.next = 0.0
        return fut

    def _run_commands(self, core: QueenCore, now: float) -> None:
        while self._commands:
            op, arg, fut = self._commands.popleft()
            if op == "cancel":
                sched = core.scheduler
                if arg not in sched.tasks:
                    fut.set_exception(LookupError(f"no unfinished task {arg!r}"))
                    continue
                sched.cancel(arg, now)  # what follows goes out at the loop's next turn
                fut.set_result({"ok": True, "op": op, "task": arg})
            else:
                fut.set_exception(LookupError(f"no command {op!r}"))

    def wrote(self, seconds: float) -> None:
        """The driver's journal took ``seconds`` for one transaction."""
        self.journal_seconds += seconds
        self.journal_writes += 1

    def publish(self, core: QueenCore, now: float, wall_offset: float) -> dict[str, Any]:
        """Rebuild the snapshot from ``core`` (in the loop's thread) and publish it."""
        t0 = time.perf_counter()
        self.next = now + self.period
        if core is not self._core:
            # A queen that takes over or steps down gets a new core: start reading it afresh
            # (the counters go on from where they were).
            self._core = core
            self._last_done = None
            self._last_order = -1
            self._scan_keys = None
        if self._commands:
            self._run_commands(core, now)
        sched = core.scheduler
        fresh = self._read_finished(sched.done)
        self._count_submitted(sched.tasks, fresh)
        self._scan_step(sched.tasks)
        queued_by = self._scan
        caps = self._caps
        submitted = self._submitted
        wall = wall_offset
        foragers: list[dict[str, Any]] = []
        running: list[dict[str, Any]] = []
        by_state: dict[str, int] = {}
        slots_free = missed = in_flight = waiting_input = 0
        monitor = core.registry.monitor
        breakers = sched.breakers.foragers
        clients = 0
        for node in list(core.registry.by_id.values()):
            if node.role != "forager":
                clients += 1
                continue
            rec = node.record(now)
            b = breakers.get(node.name)
            rec["breaker"] = b.state if b is not None else "closed"
            m = monitor.missed(node.identity, now)
            rec["missed"] = m
            missed += m
            foragers.append(rec)
            _bump(by_state, node.state)
            slots_free += node.free
            atts = list(sched.running_on(node).values())
            in_flight += len(atts)
            waiting_input += sum(1 for att in atts if att.task.state == INPUT_REQUIRED)
            for att in atts[:KEEP_TASKS - len(running)]:
                running.append(task_view(att.task, now, wall))
        gone = [g for g in list(core.registry.gone) if g.get("role") == "forager"]
        by_state["offline"] = len(gone)
        recent = [task_view(t, now, wall)
                  for t in _last(sched.done, KEEP_TASKS)]
        dead = [task_view(t, now, wall) for t in _last(sched.dlq, KEEP_TASKS)]
        recent_e2e = self._recent
        while recent_e2e and recent_e2e[0][0] < now - WINDOW:
            recent_e2e.popleft()
        lat = sorted(e for _, e in recent_e2e)
        p50 = _pct(lat, 0.50)
        p99 = _pct(lat, 0.99)
        counters = core.counters
        queued_total = sched.queued
        self._history.append((round(now + wall, 3), counters["completed"], counters["failed"],
                              p50, p99, queued_total, in_flight))
        mem_items = core.memory.items
        self._seq += 1
        info = core.info
        standby = core.standby
        self.role = role = "leader" if standby is None else "standby"
        snap: dict[str, Any] = {
            "seq": self._seq,
            "time": round(now + wall, 3),
            "period": self.period,
            "role": role,
            # A standby's own term may lag; its hint carries the leader's.
            "term": standby.get("term", core.term) if standby is not None else core.term,
            "leader": standby.get("leader") if standby is not None else None,
            "queen": {"name": core.name, "colony": core.config.colony, "epoch": core.epoch,
                      "endpoint": info.endpoint, "pub": info.pub, "pid": info.pid,
                      "host": info.host, "uptime": round(now - info.started, 3)},
            "foragers": foragers,
            "foragers_by_state": by_state,
            "recently_gone": gone[-10:],
            "clients": clients,
            "slots_free": slots_free,
            "running": in_flight,
            "queued": queued_total,
            "delayed": sched.delayed,
            # Who waits at which limit (core/tasks/limits.py, rates.py): the busiest 20.
            "limits": sched.limits.state(20) if sched.limits.active else [],
            "rates": sched.rates.state(now, 20) if sched.rates.active else [],
            "queues": queued_by,
            "submitted": dict(submitted),
            "completed": dict(caps.completed),
            "failed": dict(caps.failed),
            "cancelled": dict(caps.cancelled),
            "reissued": dict(caps.reissued),
            "counters": counters,
            "dead_letters": len(sched.dlq),
            "breakers": sched.breakers.states(),
            "heartbeats_missed": missed,
            "memory": {"keys": len(mem_items), "seq": core.memory.seq,
                       "names": sorted(list(mem_items)[:KEEP_KEYS])},
            "journal": {"seconds": self.journal_seconds, "writes": self.journal_writes},
            "histograms": {"queue_wait": self._queue_wait.export(),
                           "run_time": self._run_time.export(),
                           "latency": self._latency.export()},
            "latency": {"p50": p50, "p99": p99, "window": WINDOW, "n": len(lat)},
            "running_tasks": running,
            "recent_tasks": recent,
            "dead_letter_tasks": dead,
            # Tasks that asked for input and wait for an answer, and the running task
            # graphs (their sizes only: counting a big graph's nodes is not loop work).
            "waiting_input": waiting_input,
            "waiting_input_tasks": [t for t in running if t["state"] == INPUT_REQUIRED],
            # Durable tasks that wait with no slot held: a time, an answer, a sub-task.
            "suspended": len(sched.suspended),
            "suspended_tasks": [task_view(t, now, wall)
                                for t in itertools.islice(sched.suspended.values(),
                                                          KEEP_TASKS)],
            "graphs_running": len(core.graphs.graphs),
            "graphs": [{"graph": g.id, "state": g.state, "client": g.client_name,
                        "nodes": len(g.nodes)}
                       for g in list(core.graphs.graphs.values())[:KEEP_TASKS]],
            # The schedules that fire soonest (core/schedules), and how many there are.
            "schedules": len(core.schedules.book),
            "next_schedules": core.schedules.views(KEEP_TASKS),
            "history": list(self._history),
            "build_seconds": round(time.perf_counter() - t0, 6),
        }
        self.published = now
        self.latest = snap  # one reference swap: readers see the old or the new, whole
        return snap

    def _count_submitted(self, tasks: dict[str, Task], finished: list[Task]) -> None:
        """Count the submissions since the last snapshot, exactly and in O(new): tasks
        are numbered in submission order (``order``) and the live ones sit in ``tasks`` in
        that order, so the new ones are its tail — and those already finished are among
        the tasks that just finished."""
        last = top = self._last_order
        sub = self._submitted
        for tid in reversed(tasks):
            t = tasks[tid]
            if t.order <= last:
                break
            sub[t.capability] = sub.get(t.capability, 0) + 1
            top = max(top, t.order)
        for t in finished:
            if t.order > last:
                sub[t.capability] = sub.get(t.capability, 0) + 1
                top = max(top, t.order)
        self._last_order = top

    def _read_finished(self, done: Any) -> list[Task]:
        """Count the tasks finished since the last snapshot (``done`` is in finish
        order); returns them."""
        fresh: list[Task] = []
        stop = self._last_done
        for tid in reversed(done):
            if tid == stop:
                break
            fresh.append(done[tid])
        if not fresh:
            return fresh
        self._last_done = fresh[0].id
        caps = self._caps
        for task in reversed(fresh):
            cap = task.capability
            state = task.state
            _bump(caps.finished, cap)
            _bump(getattr(caps, state), cap)
            if task.attempt > 1:
                _bump(caps.reissued, cap, task.attempt - 1)
            first = last = end = None
            for t, s, _ in task.history:
                if s == ASSIGNED:
                    if first is None:
                        first = t
                    last = t
                elif s in FINAL:
                    end = t
            if end is None:
                continue
            e2e = max(0.0, end - task.submitted)
            self._latency.observe(e2e)
            self._recent.append((end, e2e))
            if first is not None:
                self._queue_wait.observe(max(0.0, first - task.submitted))
            if last is not None and state != "cancelled":
                self._run_time.observe(max(0.0, end - last))
        return fresh

    def _scan_step(self, tasks: dict[str, Task]) -> None:
        """Count queued tasks by capability for about SCAN_BUDGET seconds; a finished
        pass becomes the depths shown."""
        if self._scan_keys is None:
            self._scan_keys = list(tasks)  # the ids now: later ones wait for the next pass
            self._scan_pos = 0
            self._scan_acc = {}
        keys = self._scan_keys
        queued = self._scan_acc
        get = tasks.get
        clock = time.perf_counter
        stop_at = clock() + SCAN_BUDGET
        end = self._scan_pos
        n = len(keys)
        while end < n:
            start, end = end, min(n, end + SCAN_SLICE)
            for tid in keys[start:end]:
                t = get(tid)
                if t is not None and t.state == QUEUED:  # (None: finished meanwhile)
                    queued[t.capability] = queued.get(t.capability, 0) + 1
            if clock() >= stop_at:
                break
        self._scan_pos = end
        if end >= n:
            self._scan = self._scan_acc
            self._scan_keys = None


def _last(od: Any, n: int) -> list[Task]:
    out: list[Task] = []
    for k in reversed(od):
        out.append(od[k])
        if len(out) >= n:
            break
    return out


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return round(sorted_values[i], 6)


__all__ = ["BUCKETS", "Histogram", "Observer", "task_view"]
