"""Schedules at the queen: the ``schedule`` messages (add, list, show, pause, resume,
remove, trigger) and the firing of ticks as the queen's clock passes them.

A service of the queen core (:mod:`meshant.core.queen.router`) over the
:class:`~meshant.core.schedules.book.ScheduleBook`; a firing is a task submitted through
:meth:`TaskService.scheduled` with its tick's idempotency key. What changes is journaled
at the end of the turn in the same transaction as the tasks fired (``QueenCore.end_turn``),
and an answer that says a change was made leaves after that record.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from meshant import protocol as p
from meshant.core.queen.state import QueenState, Request
from meshant.core.queen.task_service import TaskService
from meshant.core.schedules import model
from meshant.core.schedules.book import ScheduleBook
from meshant.core.schedules.model import Schedule
from meshant.core.tasks.scheduler import Scheduler
from meshant.protocol.codes import Code

_CHANGES = ("add", "pause", "resume", "remove", "trigger")
OPS = ("add", "list", "show", *_CHANGES[1:])


class ScheduleService:
    """Schedules' requests, and their ticks."""

    def __init__(self, state: QueenState, scheduler: Scheduler, tasks: TaskService,
                 book: ScheduleBook) -> None:
        self.state = state
        self.scheduler = scheduler
        self.tasks = tasks
        self.book = book
        book.on_block = self._watch
        self._refused: str | None = None  # why the last firing was refused (trigger's answer)
        state.counters.declare("schedules", "schedule_fired", "schedule_refused")

    # -- the clock ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Fire the ticks the wall clock has passed (a comparison when none is due)."""
        book = self.book
        if not book.schedules:
            return
        wall = self.state.wall(now)
        if book.ready or book.soonest() <= wall:
            book.tick(wall, lambda s, t, key: self._fire(s, t, key, now), self._live)

    def _watch(self, task_id: str) -> None:
        """A queued tick waits for ``task_id``'s end: tell the book when it ends."""
        self.scheduler.final_hooks[task_id] = lambda task: self.book.task_ended(task.id)

    def _live(self, task_id: str) -> bool:
        task = self.scheduler.tasks.get(task_id)
        return task is not None  # (the scheduler holds only unfinished tasks in ``tasks``)

    def _fire(self, s: Schedule, tick: float, key: str, now: float) -> str | None:
        """Submit the task of ``s``'s tick ``tick``; its id, or None (not submitted)."""
        st = self.state
        known = self.scheduler.by_key.get(key)
        owner = f"{model.KEY_PREFIX}{s.name}"
        if known is not None:
            mine = self.scheduler.find_live(known)
            if mine is not None and mine.client_name == owner:
                return known  # (this tick's task exists: it is not made twice)
            # (A client's task that took the key is not the tick's: the tick fires.)
        task = self.tasks.scheduled(f"{s.name}.{p.new_id()}", s.capability, s.payload,
                                    s.options, key, owner, now)
        if isinstance(task, str):
            st.counters["schedule_refused"] += 1
            s.refused += 1
            s.last_refusal = f"{model.stamp(tick)}: {task}"
            self._refused = task
            return None
        st.counters["schedule_fired"] += 1
        first = task.history[0]  # (its submission: say which tick's)
        task.history[0] = (first[0], first[1],
                           f"submitted by schedule {s.name} for {model.stamp(tick)}")
        return task.id

    # -- requests -------------------------------------------------------------------------

    def request(self, req: Request) -> None:
        st, b = self.state, req.msg.b
        op = b["op"]
        if op not in OPS:
            st.refuse(req, Code.BAD_VALUE, f"schedule op is one of {', '.join(OPS)}, not "
                      f"{op!r}")
            return
        if op in _CHANGES and st.forbidden(req, "schedule.change"):
            return
        if op == "list":
            items = [s.view() for s in sorted(self.book.schedules.values(),
                                              key=lambda s: s.name)]
            self._reply(req, {"op": op, "items": items}, later=False)
            return
        if op == "add":
            self._add(req)
            return
        name = b.get("name")
        s = self.book.schedules.get(name) if isinstance(name, str) else None
        if s is None:
            st.refuse(req, Code.UNKNOWN_SCHEDULE, f"no schedule named {name!r} (meshant "
                      "schedule list shows them)")
            return
        wall = st.wall(req.now)
        out: dict[str, Any] = {"op": op}
        if op == "pause":
            self.book.pause(s)
        elif op == "resume":
            self.book.resume(s, wall)
        elif op == "remove":
            self.book.remove(s.name)
        elif op == "trigger":
            running = self.book.running(s, self._live)
            if running is not None and s.overlap != "allow":
                st.refuse(req, Code.BAD_VALUE, f"schedule {s.name}'s last task {running} "
                          f"is still running and its overlap is {s.overlap}: wait for it to "
                          "end (or cancel it)")
                return
            task = self.book.trigger(s, wall, lambda s, t, key: self._fire(s, t, key,
                                                                          req.now), self._live)
            if task is None:
                why = self._refused or ""
                st.refuse(req, Code.QUEUE_FULL if why.startswith("queue full")
                          else Code.BAD_VALUE, f"schedule {s.name}'s task could not be "
                          f"submitted: {why}")
                return
            out["task"] = task
        out["schedule"] = s.view()
        self._reply(req, out, later=op != "show")

    def _add(self, req: Request) -> None:
        st, b = self.state, req.msg.b
        problem = model.spec_problem(b, st.wall(req.now))
        if problem is None:
            problem = self._task_problem(b)
        if problem is not None:
            st.refuse(req, Code.BAD_VALUE, problem)
            return
        book = self.book
        old = book.schedules.get(b["name"])
        if old is not None and not b.get("replace"):
            st.refuse(req, Code.SCHEDULE_EXISTS, f"a schedule named {b['name']!r} exists: "
                      "remove it first, or add it with replace (--replace, replace=True)")
            return
        if old is None and len(book) >= book.max_schedules:
            st.refuse(req, Code.BAD_VALUE, f"the queen holds {len(book):,} schedules, its "
                      "limit: remove some first")
            return
        s = model.new(b, st.wall(req.now), req.node.name)
        if old is not None:
            book.remove(old.name)
            s.fired, s.skipped = old.fired, old.skipped
            s.last_task, s.last_tick = old.last_task, old.last_tick
            if old.cursor > s.cursor:  # (a clock behind the old one's: fire no tick twice)
                s.cursor = old.cursor
                s.next = math.inf if s.paused else model.next_tick(s.cron, s.tz, s.cursor)
        book.add(s)
        self._reply(req, {"op": "add", "schedule": s.view()}, later=True)

    def _task_problem(self, b: dict[str, Any]) -> str | None:
        """Why the tasks the schedule would submit would be refused (their options, the
        limits' keys), checked once now rather than at every tick."""
        return self.tasks.options_refused(b["capability"], b.get("payload"),
                                          dict(b.get("options") or {}))

    def _reply(self, req: Request, body: dict[str, Any], later: bool) -> None:
        msg = p.Message("schedule.reply", body, ref=req.msg.id)
        if later:
            self.state.later(req.node, msg)
        else:
            self.state.send(req.node, msg)

    def restore(self, rows: list[dict[str, Any]]) -> None:
        self.book.restore(rows)

    def views(self, limit: int = 20) -> list[dict[str, Any]]:
        """The schedules that fire soonest (status, the dashboard)."""
        soon = heapq.nsmallest(limit, list(self.book.schedules.values()),
                               key=lambda s: s.next)
        return [s.view() for s in soon]


__all__ = ["OPS", "ScheduleService"]
