"""Rate limits by key (#32.3): token buckets per capability, or per value of a key drawn
from a task's labels or a payload field — a model API's requests (RPM) or tokens (TPM)
per minute, a tenant's share.

A **rate rule** is written ``CAPABILITY[:KEY]=N/UNIT[,burst=B][,cost]``: ``llm=600/min``
(600 tasks a minute, a burst of 600), ``llm:payload.tenant=10/s,burst=20``,
``llm=90000/min,cost`` (tokens a minute). UNIT is ``s``, ``min`` or ``h``. Each slot
(rule, key value) is a bucket of ``burst`` tokens that refills at ``N/UNIT``; a task
takes 1 token from each bucket it falls under — its submission's ``cost`` from a rule
written with ``,cost`` — **when it is assigned**: what leaves the queen is what the
bucket counts. So a model API's requests and tokens a minute are two rules of one
capability. A task whose bucket is short when its turn comes leaves its
ready queue and **waits at that bucket**, queued, in a heap per slot (priority, then
submission order: one key's backlog never waits in front of another key's tasks), until
the bucket will have refilled enough; then it joins its queue again. A cost larger than
the burst waits for a full bucket and takes it below zero (it would never fit).

A handler may report what its run really spent (``ctx.charge(n)``: the tokens a model
call took): the difference from the task's cost comes off its ``,cost`` buckets (or
back, at most to the burst), so the bucket follows real use.

So, per slot, over any window of T seconds the costs taken are at most
``burst + rate * T`` (plus what charges added).

Buckets live in the queen's memory, and the promise holds **across a restart or a
takeover** too: the new queen starts each bucket with the tokens it would hold had it
been empty at the journal's newest task event and refilling since (``resume``; at most
the burst). Why that moment: an assignment is an event, journaled with its own time
before the task leaves, so every task the old queen let through was let through by
then, and its bucket held at least 0 after. (The exception: a task whose first write
was deferred, core/journal/defer.py, leaves unwritten for up to ``journal_defer``; the
driver adds that to the moment, which covers such tasks whenever the old queen
journaled anything in its last ``journal_defer`` seconds, as a loaded one does. And
the event's time is the old queen's wall clock: two hosts' clocks disagreeing by d
let ``rate * d`` more through.) Then over a window starting before that moment, the old
queen let through at most ``burst + rate * t1`` (t1: its part of the window), the new
one at most ``rate * (gap + t2)``; over one starting after it, only the new queen's, at
most ``burst + rate * T``. A full bucket at takeover would let ``burst`` more through
in a window that also holds the old queen's last burst. Nothing is journaled per
bucket: the newest event is one number read at takeover, where a rule per slot would
read every recent assignment. Under a flood the old queen let tasks through until it
died, so after a takeover gap of ``burst / rate`` or more the buckets start full, as
before; a quick restart starts them with what the gap refilled.

Sans-IO: times are the scheduler's monotonic clock, passed in; nothing here changes a
task (the scheduler asks ``take`` in its dispatch and queues what ``wake`` lets go).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshant.core.tasks.model import Task

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "m": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)/([a-z]+)((?:,burst=\d+(?:\.\d+)?|,cost)*)$")
MAX_COST = 1e9
MAX_KEY = 200  # characters of a key value (a tenant's name), at most


def key_value(v: Any) -> str | None:
    """A label's or payload field's value as a limit's key (a string, a number, a
    bool); None: not one."""
    if v is None or isinstance(v, (dict, list, bytes, bytearray)):
        return None
    s = str(v)
    return s if 0 < len(s) <= MAX_KEY else None


@dataclass(frozen=True, slots=True)
class RateRule:
    """``capability`` (``*``: every one) at most ``rate`` tokens a second, ``burst`` at
    once, per value of ``source.field`` (None: the capability as a whole)."""

    capability: str
    source: str | None
    field: str | None
    rate: float
    burst: float
    written: str  # N/UNIT[,burst=B][,cost] as given
    by_cost: bool = False  # counts a task's cost (else 1 a task)

    @property
    def text(self) -> str:
        key = f":{self.source}.{self.field}" if self.source else ""
        return f"{self.capability}{key}={self.written}"


def parse_rate(capability: str, source: str | None, field: str | None, value: str,
               text: str) -> RateRule:
    """The rate rule of a limit whose value is ``N/UNIT[,burst=B]``; ValueError naming
    what is wrong and what would be right."""
    m = _RATE.match(value)
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"limit {text!r}: {value!r} is not a rate: write N/s, N/min or "
                         "N/h, optionally ,burst=B and ,cost (600/min, 10/s,burst=20, "
                         "90000/min,cost)")
    n, unit, extra = float(m.group(1)), m.group(2), m.group(3)
    rate = n / _UNITS[unit]
    bursts = re.findall(r"burst=(\d+(?:\.\d+)?)", extra)
    b = float(bursts[-1]) if bursts else n
    if not (rate > 0 and math.isfinite(rate)) or not 0 < b <= MAX_COST:
        raise ValueError(f"limit {text!r}: a rate and a burst are above zero "
                         "(600/min, 10/s,burst=20)")
    return RateRule(capability, source, field, rate, b, value, ",cost" in extra)


def cost_problem(value: Any) -> str | None:
    """Why a submission's ``cost`` is malformed, or None (absent is fine)."""
    if value is None:
        return None
    if value.__class__ not in (int, float) or not 0 < value <= MAX_COST:
        return f"'cost' is a number of tokens above 0 (at most 1e9), not {value!r}"
    return None


Slot = tuple[int, str]  # (rule index, key value)


class Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class Rates:
    """The buckets and the tasks waiting at them; ``tasks``: the scheduler's live ones."""

    def __init__(self, tasks: dict[str, Task], rules: Iterable[RateRule] = ()) -> None:
        self.tasks = tasks
        self.buckets: dict[Slot, Bucket] = {}
        self.waiting: dict[Slot, list[tuple[int, int, str]]] = {}
        self.parked: dict[str, Slot] = {}
        self.spent: dict[str, float] = {}  # what a running task took, for its charges
        self.due = math.inf  # when a waiting task may go, at the earliest
        # When another queen (or this one's last life) may last have let tasks through
        # (this clock): a bucket made after it holds what it refilled since (``resume``).
        self.since = -math.inf
        self.configure(rules)

    def configure(self, rules: Iterable[Any]) -> None:
        """The rate rules of ``rules`` (the rest are core/tasks/limits.py's)."""
        self.rules = [r for r in rules if isinstance(r, RateRule)]
        self.active = bool(self.rules)
        self._plans: dict[str, list[tuple[int, bool, str]]] = {}

    def _plan(self, capability: str) -> list[tuple[int, bool, str]]:
        plan = self._plans.get(capability)
        if plan is None:
            plan = self._plans[capability] = [
                (i, r.source == "labels", r.field or "") if r.source else (i, False, "")
                for i, r in enumerate(self.rules) if r.capability in ("*", capability)]
        return plan

    def slots_of(self, task: Task) -> list[Slot]:
        out: list[Slot] = []
        for i, from_labels, name in self._plan(task.capability):
            if not name:
                out.append((i, ""))
                continue
            src = task.labels if from_labels else task.payload
            v = key_value(src.get(name)) if src.__class__ is dict else None
            if v is not None:
                out.append((i, v))
        return out

    def problem(self, capability: str, labels: dict[str, Any], payload: Any) -> str | None:
        """Why a submission cannot be held to its rates (a key a rule draws from is
        missing), or None."""
        for i, from_labels, name in self._plan(capability):
            if not name:
                continue
            src = labels if from_labels else payload
            if (key_value(src.get(name)) if isinstance(src, dict) else None) is None:
                r = self.rules[i]
                where = (f"a label {name!r} (--label {name}=VALUE)" if from_labels
                         else f"a payload map with a field {name!r}")
                return (f"capability {capability!r} is rate-limited per {r.source}.{name} "
                        f"({r.text}): the task needs {where}")
        return None

    def resume(self, since: float) -> None:
        """This queen took over a journal whose newest event is at ``since`` (this clock,
        with the deferral window added): the buckets start as if empty then, and
        refilling since — at most full (see the module's docstring)."""
        self.since = since

    def _bucket(self, slot: Slot, now: float) -> Bucket:
        r = self.rules[slot[0]]
        b = self.buckets.get(slot)
        if b is None:
            tokens = r.burst if now - self.since >= r.burst / r.rate else max(
                0.0, (now - self.since) * r.rate)
            b = self.buckets[slot] = Bucket(tokens, now)
        elif now > b.at:
            b.tokens = min(r.burst, b.tokens + (now - b.at) * r.rate)
            b.at = now
        return b

    # -- at assignment ------------------------------------------------------------------

    def take(self, task: Task, now: float) -> bool:
        """Take the task's cost from each of its buckets (True), or, one of them short,
        nothing: the task waits at that bucket (False; it left its ready queue)."""
        slots = self.slots_of(task)
        if not slots:
            return True
        cost = task.cost if task.cost is not None else 1.0
        rules = self.rules
        for slot in slots:
            b = self._bucket(slot, now)
            r = rules[slot[0]]
            need = min(cost if r.by_cost else 1.0, r.burst)  # (over the burst: a full one)
            if b.tokens < need - 1e-9:
                heapq.heappush(self.waiting.setdefault(slot, []),
                               (task.priority, task.order, task.id))
                self.parked[task.id] = slot
                when = b.at + (need - b.tokens) / self.rules[slot[0]].rate
                if when < self.due:
                    self.due = when
                return False
        for slot in slots:
            self.buckets[slot].tokens -= cost if rules[slot[0]].by_cost else 1.0
        self.spent[task.id] = cost  # (this run's: what its charges are measured from)
        return True

    def wake(self, now: float) -> list[Task]:
        """The waiting tasks whose buckets have refilled enough: out of waiting, best
        first per bucket (each is tried again by ``take`` when its turn comes)."""
        out: list[Task] = []
        due = math.inf
        for slot, heap in list(self.waiting.items()):
            b = self._bucket(slot, now)
            r = self.rules[slot[0]]
            avail = b.tokens
            while heap:
                _, order, task_id = heap[0]
                task = self.tasks.get(task_id)
                if task is None or self.parked.get(task_id) != slot or task.order != order:
                    heapq.heappop(heap)  # stale
                    continue
                cost = min(task.cost if task.cost is not None and r.by_cost else 1.0,
                           r.burst)
                if avail < cost - 1e-9:
                    due = min(due, b.at + (cost - avail) / r.rate)
                    break
                heapq.heappop(heap)
                del self.parked[task_id]
                avail -= cost  # (so a refill lets go what it pays for, not everyone)
                out.append(task)
            if not heap:
                del self.waiting[slot]
        self.due = due
        return out

    def forget(self, task: Task) -> None:
        """The task ended: it waits nowhere, and its charges are over."""
        self.parked.pop(task.id, None)
        self.spent.pop(task.id, None)

    def charge(self, task: Task, n: float, now: float) -> None:
        """The task's handler says its run really spent ``n`` in all: its buckets pay
        the difference from what it took (or get it back, at most to the burst)."""
        took = self.spent.get(task.id)
        if took is None:
            return
        extra = n - took
        self.spent[task.id] = n
        for slot in self.slots_of(task):
            r = self.rules[slot[0]]
            if r.by_cost:
                b = self._bucket(slot, now)
                b.tokens = min(r.burst, b.tokens - extra)

    # -- what is seen from outside ----------------------------------------------------

    def why(self, task: Task, now: float) -> str | None:
        """Why a queued task waits (which rate, when it frees), or None."""
        slot = self.parked.get(task.id)
        if slot is None:
            return None
        b = self._bucket(slot, now)
        r = self.rules[slot[0]]
        cost = min(task.cost if task.cost is not None and r.by_cost else 1.0, r.burst)
        wait = max(0.0, (cost - b.tokens) / r.rate)
        key = f" ({r.field}={slot[1]})" if r.source else ""
        return (f"waits for rate limit {r.text}{key}: {max(b.tokens, 0.0):.6g} of "
                f"{cost:.6g} tokens, frees in {wait:.3f} s")

    def state(self, now: float, most: int = 100) -> list[dict[str, Any]]:
        waiting: dict[Slot, int] = {}
        for slot in list(self.parked.values()):
            waiting[slot] = waiting.get(slot, 0) + 1
        out = []
        for slot in sorted(waiting, key=lambda s: -waiting[s])[:most]:
            r = self.rules[slot[0]]
            b = self.buckets.get(slot)
            out.append({"limit": r.text, "key": slot[1], "waiting": waiting[slot],
                        "tokens": round(b.tokens, 3) if b is not None else r.burst})
        return out


__all__ = ["MAX_KEY", "Bucket", "RateRule", "Rates", "cost_problem", "key_value",
           "parse_rate"]
