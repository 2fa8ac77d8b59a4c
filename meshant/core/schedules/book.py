"""The queen's schedules, and their firing: which ticks are due, by each schedule's
policies (:mod:`meshant.core.schedules.model`), in order of their times.

Between ticks the book costs nothing: one heap of next fire times, looked at when the
queen ticks (``tick``: the soonest entry's time against the clock), so 10,000 schedules
cost the queen a comparison per loop turn until one is due. What a firing does — submit
a task — is the caller's (``fire``: the schedule, the tick, returning the new task's id
or None when it could not be submitted); what changed is kept for the journal
(``take_changes``), to be written in the same transaction as the tasks it fired.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from meshant.core.schedules.model import (
    GRACE,
    KEY_PREFIX,
    MAX_QUEUED,
    Schedule,
    due,
    next_tick,
    stamp,
    tick_key,
)

# (schedule, tick, idempotency key) -> the new task's id, or None: not submitted.
Fire = Callable[[Schedule, float, str], str | None]
Live = Callable[[str], bool]


class ScheduleBook:
    """Every schedule the colony has, by name."""

    def __init__(self, max_schedules: int = 100_000, grace: float = GRACE) -> None:
        self.max_schedules = max_schedules
        self.grace = grace  # a tick later than this is missed (model.due)
        self.schedules: dict[str, Schedule] = {}
        self._heap: list[tuple[float, str]] = []
        # Names whose schedule changed since the journal last looked (None: removed).
        self.changed: dict[str, Schedule | None] = {}
        self.track_changes = False
        # Overlap 'queue': the schedules whose queued ticks wait for a task's end, by
        # that task (``task_ended`` moves them on), and those that may fire one now.
        self._blocked: dict[str, str] = {}
        self._ready: set[str] = set()
        # Called with a task's id when a queued tick waits for its end: the caller
        # must call ``task_ended`` when it ends (the scheduler's final hook).
        self.on_block: Callable[[str], None] = lambda task_id: None
        self.fired = 0

    def __len__(self) -> int:
        return len(self.schedules)

    @property
    def ready(self) -> bool:
        """Whether some schedule's queued tick may fire now (its blocker ended)."""
        return bool(self._ready)

    def task_ended(self, task_id: str) -> None:
        """A task a queued tick waited for ended: that schedule's next queued tick fires
        at the next ``tick``."""
        name = self._blocked.pop(task_id, None)
        if name is not None:
            self._ready.add(name)

    def _wait(self, s: Schedule, live: Live) -> None:
        """``s`` has queued ticks: wait for its last firing's task to end, or fire the
        next at once if it has."""
        task = s.last_task
        if task is not None and live(task):
            if self._blocked.get(task) != s.name:
                self._blocked[task] = s.name
                self.on_block(task)
        else:
            self._ready.add(s.name)

    def _changed(self, s: Schedule) -> None:
        if self.track_changes:
            self.changed[s.name] = s

    def _plan(self, s: Schedule) -> None:
        """(Re)enter ``s`` in the heap at its next tick; a stale entry is skipped later,
        and the heap is rebuilt when stale ones are more than half of it (pause and
        resume over and over between two ticks leave one each)."""
        if not s.paused and not math.isinf(s.next):
            heapq.heappush(self._heap, (s.next, s.name))
            if len(self._heap) > 2 * len(self.schedules) + 64:
                self._heap = [(x.next, x.name) for x in self.schedules.values()
                              if not x.paused and not math.isinf(x.next)]
                heapq.heapify(self._heap)

    def restore(self, rows: list[dict[str, Any]]) -> None:
        """The schedules a queen finds in its journal (starting, or taking over)."""
        for r in rows:
            s = Schedule.from_row(r)
            self.schedules[s.name] = s
            self._plan(s)
            if s.queued:
                self._ready.add(s.name)  # (``tick`` finds whether its last task runs)

    def add(self, s: Schedule) -> None:
        """A new schedule (its name is free: the caller checked)."""
        self.schedules[s.name] = s
        self._plan(s)
        self._changed(s)

    def remove(self, name: str) -> Schedule | None:
        s = self.schedules.pop(name, None)
        if s is not None:
            self._ready.discard(name)
            if self.track_changes:
                self.changed[name] = None
        return s

    def pause(self, s: Schedule) -> None:
        s.paused = True
        s.next = math.inf
        self._changed(s)

    def resume(self, s: Schedule, wall: float) -> None:
        """Resume from now: the ticks it was paused through are not caught up."""
        if not s.paused:
            return
        s.paused = False
        s.cursor = max(s.cursor, wall)
        s.next = next_tick(s.cron, s.tz, s.cursor)
        self._plan(s)
        if s.queued:
            self._ready.add(s.name)
        self._changed(s)

    def soonest(self) -> float:
        """The wall time of the next tick of any schedule (inf: none)."""
        heap = self._heap
        while heap:
            when, name = heap[0]
            s = self.schedules.get(name)
            if s is not None and s.next == when:
                return when
            heapq.heappop(heap)  # stale: removed, paused, or moved
        return math.inf

    def tick(self, wall: float, fire: Fire, live: Live) -> None:
        """Fire what is due at wall time ``wall``: every schedule's ticks by its
        policies, and ticks queued behind a firing that has ended since."""
        if self._ready:
            ready, self._ready = self._ready, set()
            for name in ready:
                s = self.schedules.get(name)
                if s is None or not s.queued or s.paused:
                    continue  # (a paused one's queue waits for its resume)
                if s.last_task is None or not live(s.last_task):
                    self._fire(s, s.queued.pop(0), fire)
                    self._changed(s)
                if s.queued:
                    self._wait(s, live)
        heap = self._heap
        while heap and heap[0][0] <= wall:
            when, name = heapq.heappop(heap)
            s = self.schedules.get(name)
            if s is None or s.next != when or s.paused:
                continue  # a stale entry
            ticks, skipped, cursor = due(s, wall, self.grace)
            s.skipped += skipped
            for t in ticks:
                self._handle(s, t, fire, live)
            s.cursor = cursor
            s.next = next_tick(s.cron, s.tz, cursor)
            self._plan(s)
            self._changed(s)

    def _handle(self, s: Schedule, tick: float, fire: Fire, live: Live) -> None:
        """One due tick of ``s``, by its overlap policy."""
        running = s.last_task is not None and live(s.last_task)
        if running and s.overlap == "skip":
            s.skipped += 1
            return
        if (running or s.queued) and s.overlap == "queue":
            if len(s.queued) >= MAX_QUEUED:
                s.skipped += 1
            else:
                s.queued.append(tick)
                if len(s.queued) == 1:
                    self._wait(s, live)
            return
        self._fire(s, tick, fire)

    def _fire(self, s: Schedule, tick: float, fire: Fire) -> None:
        task = fire(s, tick, tick_key(s.name, tick))
        if task is None:
            return  # (refused: the caller counts it in ``refused``, with the reason)
        s.last_task, s.last_tick = task, tick
        s.fired += 1
        self.fired += 1

    def trigger(self, s: Schedule, wall: float, fire: Fire, live: Live) -> str | None:
        """Fire ``s`` now, outside its cron (an operator asked): the new task's id, or
        None. Its overlap policy holds: unless it is ``allow``, the caller refuses a
        trigger while the last firing's task runs (``running``)."""
        task = fire(s, wall, f"{KEY_PREFIX}{s.name}:manual:{stamp(wall)}:{s.fired}")
        if task is not None:
            s.last_task, s.last_tick = task, wall
            s.fired += 1
            self.fired += 1
        self._changed(s)  # (a refusal is counted in it too)
        return task

    def running(self, s: Schedule, live: Live) -> str | None:
        """The task of ``s``'s last firing, if it has not ended."""
        return s.last_task if s.last_task is not None and live(s.last_task) else None

    def take_changes(self) -> list[tuple[str, dict[str, Any] | None]]:
        """The journal's rows of what changed since the last call (None: removed)."""
        out = [(name, s.row() if s is not None else None)
               for name, s in self.changed.items()]
        self.changed.clear()
        return out


__all__ = ["Fire", "Live", "ScheduleBook"]
