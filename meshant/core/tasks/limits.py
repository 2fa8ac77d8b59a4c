"""Concurrency limits by key (#32.2): at most N running tasks of a capability, or of each
value of a key drawn from a task's labels or a payload field (a tenant), enforced by the
queen across all foragers.

A **rule** is written ``CAPABILITY[:KEY]=N``: ``llm=10`` (at most 10 ``llm`` tasks at
once), ``llm:payload.tenant=2`` (at most 2 per tenant, the payload map's ``tenant``),
``*:labels.region=50`` (per value of the label ``region``, every capability's tasks
counted together). The queen takes rules from ``QueenConfig.limits`` (``--limit``,
``--limits-file``); a submission may bring its own, ``concurrency: {key, max}`` (at most
``max`` tasks submitted with ``key`` running at once).

A task subject to rules takes a **token** of each (its slot: rule and key value) before
it joins its capability's ready queue, in order: its submission's own, the keyed rules,
the capability-wide ones; it holds them until it ends, suspends or waits out a retry
backoff. A task that finds a slot full **waits at that slot**, queued (``queued`` counts
it), holding the tokens it took; when a token of that slot comes back, the waiting task
of that slot first by priority, then by submission order, takes it and goes on. So:

* never more tasks running (assigned or accepted) per slot than its rule allows: they
  are a subset of the tokens taken;
* keys are fair: each key waits at a slot of its own, so one key's backlog waits behind
  its own limit and never in front of another key's tasks; behind a capability-wide rule
  each key has at most its own limit's tasks waiting;
* priorities hold within a key (its slot's waiting heap is ordered by them).

Sans-IO: the scheduler (the only writer of a task's state) asks ``admit``/``release`` at
the moments above and queues what ``release`` lets go; nothing here changes a task.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshant.core.tasks.model import Task
from meshant.core.tasks.rates import MAX_KEY, RateRule, key_value, parse_rate

MAX_RULES = 1000
_RULE = re.compile(r"^\s*([A-Za-z0-9_.\-/*]+)(?::(labels|payload)\.([A-Za-z0-9_\-]+))?\s*=\s*"
                   r"(\S+)\s*$")
SUBMITTED = "submitted"  # the source of a submission's own rule


@dataclass(frozen=True, slots=True)
class Rule:
    """``capability`` (``*``: every one) at most ``max`` running at once, per value of
    ``source.field`` (``labels``/``payload``; None: the capability as a whole)."""

    capability: str
    source: str | None
    field: str | None
    max: int

    @property
    def text(self) -> str:
        key = f":{self.source}.{self.field}" if self.source else ""
        return f"{self.capability}{key}={self.max}"


def parse_rule(text: str) -> Rule | RateRule:
    """A rule from its text — a concurrency limit (``=N``) or a rate (``=N/UNIT``,
    :mod:`meshant.core.tasks.rates`); ValueError naming what is wrong and what would be
    right."""
    m = _RULE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a limit: write CAPABILITY=N or "
                         "CAPABILITY:payload.FIELD=N or CAPABILITY:labels.NAME=N, or a rate, "
                         "CAPABILITY[:KEY]=N/min[,burst=B] (llm=10, llm:payload.tenant=2, "
                         "*:labels.region=5, llm=600/min)")
    cap, source, field_, value = m.groups()
    if "/" in value:
        return parse_rate(cap, source, field_, value, text)
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"limit {text!r}: {value!r} is not a whole number of tasks "
                         "(llm=10)") from None
    if not 1 <= n <= 1_000_000:
        raise ValueError(f"limit {text!r}: at most 1 to 1,000,000 tasks at once, not {n}")
    return Rule(cap, source, field_, n)


def parse_rules(texts: Iterable[str]) -> list[Rule | RateRule]:
    """Rules from their texts (``--limit``, the lines of ``--limits-file``: blank lines
    and ``#`` comments skipped); ValueError for the first bad one."""
    rules: list[Rule | RateRule] = []
    for raw in texts:
        line = raw.split("#", 1)[0].strip()
        if line:
            rules.append(parse_rule(line))
    if len(rules) > MAX_RULES:
        raise ValueError(f"{len(rules)} limits: at most {MAX_RULES}")
    return rules


def concurrency_problem(value: Any) -> str | None:
    """Why a submission's ``concurrency`` is malformed, or None (absent is fine)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("key"), str) or not (
            0 < len(value["key"]) <= MAX_KEY) or value.get("max").__class__ is not int or \
            not 1 <= value["max"] <= 1_000_000:
        return (f"'concurrency' is {{key: a string of 1-{MAX_KEY} characters, max: 1 to "
                f"1,000,000 tasks}}, not {value!r}")
    return None


Slot = tuple[int, str]  # (rule index; -1: a submission's own rule), key value


class Limits:
    """The tokens taken and the tasks waiting, per slot; ``tasks``: the scheduler's live
    tasks (what a waiting task's entry stands for)."""

    def __init__(self, tasks: dict[str, Task], rules: Iterable[Rule | RateRule] = ()
                 ) -> None:
        self.tasks = tasks
        self.taken: dict[Slot, int] = {}
        self.waiting: dict[Slot, list[tuple[int, int, str]]] = {}
        self.holds: dict[str, list[Slot]] = {}
        self.parked: dict[str, Slot] = {}
        # A submission's own rule's max, per key: the latest submission's.
        self.own_max: dict[str, int] = {}
        self.configure(rules)

    def configure(self, rules: Iterable[Rule | RateRule]) -> None:
        """The concurrency rules of ``rules`` (its rates are core/tasks/rates.py's)."""
        self.rules = [r for r in rules if isinstance(r, Rule)]
        self.by_cap: dict[str, list[int]] = {}
        self.every: list[int] = []
        for i, r in enumerate(self.rules):
            (self.every if r.capability == "*" else self.by_cap.setdefault(
                r.capability, [])).append(i)
        # Per capability, what slots_of walks: the keyed rules (index, source is
        # labels, field, max), then the capability-wide slots with their max.
        self._plans: dict[str, tuple[list[tuple[int, bool, str, int]],
                                     list[tuple[Slot, int]]]] = {}
        # Whether any task may be limited: off, the scheduler skips every call here.
        self.active = bool(self.rules) or bool(self.holds)

    # -- the rules a task is under --------------------------------------------------------

    def _rules_of(self, capability: str) -> list[int]:
        own = self.by_cap.get(capability)
        if not self.every:
            return own or []
        return [*(own or ()), *self.every]

    def problem(self, capability: str, labels: dict[str, Any], payload: Any,
                concurrency: Any, keys: list[tuple[int, str]] | None = None) -> str | None:
        """Why a submission cannot be held to its limits (a key its rules draw from is
        missing), or None; ``keys`` gets its keyed slots (the task's ``limit_keys``: its
        admission need not work them out again)."""
        if concurrency is not None:
            bad = concurrency_problem(concurrency)
            if bad is not None:
                return bad
        for i, from_labels, name, _ in self._plan(capability)[0]:
            src = labels if from_labels else payload
            v = src.get(name) if src.__class__ is dict else None
            if v.__class__ is not str or not 0 < len(v) <= MAX_KEY:
                v = key_value(v)
            if v is None:
                r = self.rules[i]
                where = (f"a label {r.field!r} (--label {r.field}=VALUE)" if r.source ==
                         "labels" else f"a payload map with a field {r.field!r}")
                return (f"capability {capability!r} is limited per {r.source}.{r.field} "
                        f"({r.text}): the task needs {where}")
            if keys is not None:
                keys.append((i, v))
        return None

    def _plan(self, capability: str) -> tuple[list[tuple[int, bool, str, int]],
                                              list[tuple[Slot, int]]]:
        plan = self._plans.get(capability)
        if plan is None:
            keyed: list[tuple[int, bool, str, int]] = []
            whole: list[tuple[Slot, int]] = []
            for i in self._rules_of(capability):
                r = self.rules[i]
                if r.source is None:
                    whole.append(((i, ""), r.max))
                else:
                    keyed.append((i, r.source == "labels", r.field or "", r.max))
            plan = self._plans[capability] = (keyed, whole)
        return plan

    def slots_of(self, task: Task) -> list[tuple[Slot, int]]:
        """The slots a task takes a token of, in order, with each one's max: its
        submission's own, the keyed rules', the capability-wide ones."""
        keyed, whole = self._plan(task.capability)
        own = task.concurrency
        out: list[tuple[Slot, int]] = [((-1, own[0]), own[1])] if own is not None else []
        if keyed:
            labels, payload = task.labels, task.payload
            for i, from_labels, name, most in keyed:
                src = labels if from_labels else payload
                if src.__class__ is not dict:
                    continue
                v = src.get(name)
                if v.__class__ is not str:
                    v = key_value(v)
                    if v is None:
                        continue
                elif not 0 < len(v) <= MAX_KEY:
                    continue
                out.append(((i, v), most))
        if not out:
            return whole
        return out + whole if whole else out

    # -- tokens ---------------------------------------------------------------------------

    def admit(self, task: Task) -> bool:
        """Take the task's tokens: True when it has them all (it may join its ready
        queue), False when it waits at a full slot (it holds those it took)."""
        if task.concurrency is not None:
            self.own_max[task.concurrency[0]] = task.concurrency[1]
            self.active = True
        held = self.holds.get(task.id)
        fresh = held is None
        if held is None:
            held = []
            if task.concurrency is None and task.id not in self.parked:
                return self._admit_fresh(task, held)
        if self.parked:
            self.parked.pop(task.id, None)
        taken = self.taken
        for slot, most in self.slots_of(task):
            if not fresh and slot in held:
                continue
            n = taken.get(slot, 0)
            if n >= most:
                heapq.heappush(self.waiting.setdefault(slot, []),
                               (task.priority, task.order, task.id))
                self.parked[task.id] = slot
                if held:
                    self.holds[task.id] = held
                return False
            taken[slot] = n + 1
            held.append(slot)
        if held:
            self.holds[task.id] = held
        return True

    def _admit_fresh(self, task: Task, held: list[Slot]) -> bool:
        """``admit`` of a task holding nothing (the common case, inlined: slots_of's
        walk, taking each slot's token as it goes)."""
        keyed, whole = self._plan(task.capability)
        taken = self.taken
        known = task.limit_keys
        if known is not None:
            task.limit_keys = None  # (worked out at submission; for this admission only)
            max_of = self.max_of
            for slot in known:
                n = taken.get(slot, 0)
                if n >= max_of(slot):
                    return self._park(task, slot, held)
                taken[slot] = n + 1
                held.append(slot)
        elif keyed:
            labels, payload = task.labels, task.payload
            for i, from_labels, name, most in keyed:
                src = labels if from_labels else payload
                if src.__class__ is not dict:
                    continue
                v = src.get(name)
                if v.__class__ is not str:
                    v = key_value(v)
                    if v is None:
                        continue
                elif not 0 < len(v) <= MAX_KEY:
                    continue
                slot = (i, v)
                n = taken.get(slot, 0)
                if n >= most:
                    return self._park(task, slot, held)
                taken[slot] = n + 1
                held.append(slot)
        for slot, most in whole:
            n = taken.get(slot, 0)
            if n >= most:
                return self._park(task, slot, held)
            taken[slot] = n + 1
            held.append(slot)
        if held:
            self.holds[task.id] = held
        return True

    def _park(self, task: Task, slot: Slot, held: list[Slot]) -> bool:
        heapq.heappush(self.waiting.setdefault(slot, []), (task.priority, task.order, task.id))
        self.parked[task.id] = slot
        if held:
            self.holds[task.id] = held
        return False

    def hold(self, task: Task) -> None:
        """A task running before a restart: it has its tokens, whatever they come to."""
        held = self.holds.setdefault(task.id, [])
        for slot, _ in self.slots_of(task):
            if slot not in held:
                self.taken[slot] = self.taken.get(slot, 0) + 1
                held.append(slot)
        if not held:
            del self.holds[task.id]
        self.active = True

    def release(self, task: Task) -> list[Task]:
        """The task no longer runs nor waits (it ended, suspended, backs off): its tokens
        come back. Returns the waiting tasks that now have all theirs, in order."""
        self.parked.pop(task.id, None)  # (its waiting entry goes stale)
        held = self.holds.pop(task.id, None)
        if not held:
            return []
        for slot in held:
            n = self.taken[slot] - 1
            if n:
                self.taken[slot] = n
            else:
                del self.taken[slot]
        out: list[Task] = []
        waiting = self.waiting
        if waiting:
            for slot in held:
                if slot in waiting:
                    self._wake(slot, out)
        return out

    def max_of(self, slot: Slot) -> int:
        return self.own_max.get(slot[1], 1) if slot[0] < 0 else self.rules[slot[0]].max

    def _wake(self, slot: Slot, out: list[Task]) -> None:
        """Let the slot's waiting tasks take its free tokens, best first."""
        heap = self.waiting.get(slot)
        most = self.max_of(slot)
        while heap and self.taken.get(slot, 0) < most:
            _, order, task_id = heapq.heappop(heap)
            task = self.tasks.get(task_id)
            if task is None or self.parked.get(task_id) != slot or task.order != order:
                continue  # stale: it ended, or waits elsewhere now
            if self.admit(task):
                out.append(task)
            elif self.parked.get(task_id) == slot:
                break  # (its own max is lower than the slot's: it waits on)
        if heap is not None and not heap:
            del self.waiting[slot]

    # -- what is seen from outside ----------------------------------------------------

    def why(self, task: Task) -> str | None:
        """Why a queued task waits (which limit, how full), or None."""
        slot = self.parked.get(task.id)
        if slot is None:
            return None
        return (f"waits for concurrency limit {self.slot_text(slot)}: "
                f"{self.taken.get(slot, 0)} of {self.max_of(slot)} running")

    def slot_text(self, slot: Slot) -> str:
        i, key = slot
        if i < 0:
            return f"concurrency key {key!r}"
        r = self.rules[i]
        return r.text if r.source is None else f"{r.text} ({r.field}={key})"

    def state(self, most: int = 100) -> list[dict[str, Any]]:
        """The busiest slots (status): rule, key, running, max, waiting."""
        # (Copies first: status may be asked from another thread.)
        taken = dict(self.taken)
        waiting: dict[Slot, int] = {}
        for slot in list(self.parked.values()):
            waiting[slot] = waiting.get(slot, 0) + 1
        slots = sorted(set(taken) | set(waiting),
                       key=lambda s: (-waiting.get(s, 0), -taken.get(s, 0), s))[:most]
        return [{"limit": self.rules[s[0]].text if s[0] >= 0 else "concurrency",
                 "key": s[1], "running": taken.get(s, 0), "max": self.max_of(s),
                 "waiting": waiting.get(s, 0)} for s in slots]


def _value(rule: Rule, labels: dict[str, Any], payload: Any) -> str | None:
    """The key value a rule draws from a task (None: it has none)."""
    src = labels if rule.source == "labels" else payload
    if not isinstance(src, dict):
        return None
    return key_value(src.get(rule.field or ""))


__all__ = ["MAX_RULES", "Limits", "Rule", "Slot", "concurrency_problem", "parse_rule",
           "parse_rules"]
