"""Schedules (#32.4): a capability and a payload submitted as a task at every tick of a
cron expression, in a time zone — kept in the journal and fired by whichever queen leads.

The rules are here, sans-IO: what a valid schedule is, when its ticks fall (cron through
``cronsim``: it follows Debian's cron, daylight-saving quirks included, and is typed and
dependency-free — croniter's day-of-week/day-of-month handling and its own DST rules
differ from cron's), and what its policies decide:

``overlap`` — a tick comes while the task of an earlier one has not ended:
  ``skip`` it (counted), ``queue`` it (at most ``MAX_QUEUED``, each fired as the one
  before ends), or ``allow`` it (fired alongside).

``catch_up`` — ticks more than ``GRACE`` seconds past when the queen looks (it was
  down, paused, or took over after a failover): ``none`` fires none of them, ``latest``
  fires the newest once, ``all`` fires each, oldest first (at most ``MAX_CATCH_UP``; the
  rest are skipped, counted). A tick later than its time by less than ``GRACE`` is late,
  not missed: it fires.

A schedule's ``cursor`` is the last tick it handled (fired, queued or skipped). The queen
journals the cursor in the same transaction as the task a tick fired, so a queen that
restarts or takes over fires the ticks after the cursor and never one at or before it:
one task per tick. Each firing also carries the idempotency key
``schedule:<name>:<tick>``, which names its tick wherever the task is seen.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

OVERLAP = ("skip", "queue", "allow")
CATCH_UP = ("none", "latest", "all")
GRACE = 10.0  # seconds: a tick later than this when the queen looks is missed
MAX_CATCH_UP = 100  # missed ticks 'all' fires at most, at one look
MAX_QUEUED = 100  # ticks 'queue' holds at most behind a running one
MAX_LOOK = 10_000  # late ticks (within the grace) fired at one look at most
COUNT_WALK = 16  # missed ticks walked to count them (past these, counted from their spacing)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
KEY_PREFIX = "schedule:"
# The task options a schedule may give its firings (a submission's, at, after and key
# aside: the schedule decides when, and the key is the tick's).
OPTIONS: dict[str, tuple[type, ...]] = {
    "priority": (int,), "max_attempts": (int,), "timeout": (int, float),
    "wait": (int, float), "labels": (dict,), "to": (str,), "retry_on": (list,),
    "retry_base": (int, float), "retry_cap": (int, float), "concurrency": (dict,),
    "cost": (int, float)}


@dataclass(slots=True, eq=False)
class Schedule:
    """One schedule and where it stands. ``cursor``: the wall-clock time of the last tick
    it handled; ``next``: its next tick (derived from the cursor, not journaled)."""

    name: str
    cron: str
    capability: str
    payload: Any = None
    tz: str = "UTC"
    overlap: str = "skip"
    catch_up: str = "latest"
    options: dict[str, Any] = field(default_factory=dict)
    paused: bool = False
    cursor: float = 0.0
    created: float = 0.0
    by: str = ""
    last_task: str | None = None  # the task the newest firing made
    last_tick: float | None = None
    queued: list[float] = field(default_factory=list)  # ticks behind the running one
    fired: int = 0
    skipped: int = 0
    refused: int = 0  # firings the queen could not submit (its queue full, ...)
    last_refusal: str | None = None  # why the newest one was refused, and for which tick
    next: float = math.inf

    def row(self) -> dict[str, Any]:
        """The schedule as the journal keeps it."""
        return {"name": self.name, "cron": self.cron, "capability": self.capability,
                "payload": self.payload, "tz": self.tz, "overlap": self.overlap,
                "catch_up": self.catch_up, "options": self.options, "paused": self.paused,
                "cursor": self.cursor, "created": self.created, "by": self.by,
                "last_task": self.last_task, "last_tick": self.last_tick,
                "queued": list(self.queued), "fired": self.fired, "skipped": self.skipped,
                "refused": self.refused, "last_refusal": self.last_refusal}

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> Schedule:
        s = cls(name=r["name"], cron=r["cron"], capability=r["capability"],
                payload=r.get("payload"), tz=r.get("tz", "UTC"),
                overlap=r.get("overlap", "skip"), catch_up=r.get("catch_up", "latest"),
                options=dict(r.get("options") or {}), paused=bool(r.get("paused")),
                cursor=float(r.get("cursor", 0.0)), created=float(r.get("created", 0.0)),
                by=r.get("by", ""), last_task=r.get("last_task"),
                last_tick=r.get("last_tick"), queued=list(r.get("queued") or []),
                fired=int(r.get("fired", 0)), skipped=int(r.get("skipped", 0)),
                refused=int(r.get("refused", 0)), last_refusal=r.get("last_refusal"))
        s.next = math.inf if s.paused else next_tick(s.cron, s.tz, s.cursor)
        return s

    def view(self) -> dict[str, Any]:
        """What ``schedule list``, status and the dashboard show."""
        return {"name": self.name, "cron": self.cron, "tz": self.tz,
                "capability": self.capability, "payload": self.payload,
                "overlap": self.overlap, "catch_up": self.catch_up, "options": self.options,
                "paused": self.paused,
                "next": None if self.paused or math.isinf(self.next) else self.next,
                "last_tick": self.last_tick, "last_task": self.last_task,
                "queued": len(self.queued), "fired": self.fired, "skipped": self.skipped,
                "refused": self.refused, "last_refusal": self.last_refusal,
                "created": self.created, "by": self.by}


def tick_key(name: str, tick: float) -> str:
    """The idempotency key of the firing of ``name``'s tick ``tick`` (a wall time)."""
    return f"{KEY_PREFIX}{name}:{stamp(tick)}"


def tick_of(key: str) -> tuple[str, float] | None:
    """The schedule and tick a firing's key names (``tick_key``), or None: not a tick's
    key (a trigger's ``schedule:NAME:manual:...``, any other key)."""
    if not key.startswith(KEY_PREFIX) or ":manual:" in key:
        return None
    # (The stamp is 20 characters with colons in it; a name may hold colons too.)
    name, text = key[len(KEY_PREFIX):-21], key[-20:]
    try:
        when = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return name, when.timestamp()


def stamp(wall: float) -> str:
    """A wall time as the keys and messages write it (UTC, to the second)."""
    return f"{datetime.fromtimestamp(wall, UTC):%Y-%m-%dT%H:%M:%SZ}"


def zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def next_tick(cron: str, tz: str, after: float) -> float:
    """The first tick of ``cron`` (in time zone ``tz``) strictly after wall time
    ``after``; inf if there is none (a 30th of February)."""
    try:
        return next(CronSim(cron, datetime.fromtimestamp(after, zone(tz)))).timestamp()
    except StopIteration:
        return math.inf


def latest_tick(cron: str, tz: str, at: float) -> float | None:
    """The newest tick of ``cron`` at or before wall time ``at`` (None: there is none)."""
    try:
        start = datetime.fromtimestamp(math.floor(at) + 1, zone(tz))
        return next(CronSim(cron, start, reverse=True)).timestamp()
    except StopIteration:
        return None


def cron_problem(cron: Any, tz: Any, wall: float) -> str | None:
    """Why a cron expression or a time zone is not one, or None (``wall``: now, in
    wall-clock seconds: the core reads no clock)."""
    if not isinstance(tz, str) or not tz:
        return f"a time zone is an IANA name such as UTC or Europe/Paris, not {tz!r}"
    try:
        zone(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        return (f"unknown time zone {tz!r}: give an IANA name such as UTC, Europe/Paris or "
                "America/New_York")
    if not isinstance(cron, str) or not cron.strip():
        return "a cron expression is 5 fields, minute hour day month weekday (*/5 * * * *)"
    try:
        CronSim(cron, datetime.fromtimestamp(wall, zone(tz)))
    except CronSimError as e:
        return (f"{cron!r} is not a cron expression ({e}): write 5 fields, minute hour "
                "day-of-month month day-of-week, such as '*/15 * * * *' or '0 9 * * MON-FRI'"
                " (6 fields: seconds first, '*/15 * * * * *')")
    if math.isinf(next_tick(cron, tz, wall)):
        return f"{cron!r} never fires (no such date)"
    return None


def spec_problem(b: dict[str, Any], wall: float) -> str | None:
    """Why a ``schedule`` add's body is not a schedule, or None (``wall``: now)."""
    name = b.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return (f"a schedule's name is 1-100 letters, digits and _ . : - (starting with a "
                f"letter or digit), not {name!r}")
    problem = cron_problem(b.get("cron"), b.get("tz", "UTC"), wall)
    if problem is not None:
        return problem
    cap = b.get("capability")
    if not isinstance(cap, str) or not cap:
        return "a schedule names the capability its tasks run"
    if b.get("overlap", "skip") not in OVERLAP:
        return f"overlap is one of {', '.join(OVERLAP)}, not {b.get('overlap')!r}"
    if b.get("catch_up", "latest") not in CATCH_UP:
        return f"catch_up is one of {', '.join(CATCH_UP)}, not {b.get('catch_up')!r}"
    options = b.get("options") or {}
    if not isinstance(options, dict):
        return "a schedule's options are a map of task options (priority, labels, ...)"
    for k, v in options.items():
        types = OPTIONS.get(k)
        if types is None:
            return (f"{k!r} is not a task option a schedule can give (one of "
                    f"{', '.join(OPTIONS)})")
        if not isinstance(v, types) or v.__class__ is bool:
            return f"option {k} must be {' or '.join(t.__name__ for t in types)}, not {v!r}"
    return None


def new(b: dict[str, Any], wall: float, by: str) -> Schedule:
    """A schedule from a checked add (``spec_problem`` found nothing), starting now: its
    first tick is the first after ``wall``."""
    s = Schedule(name=b["name"], cron=b["cron"], capability=b["capability"],
                 payload=b.get("payload"), tz=b.get("tz", "UTC"),
                 overlap=b.get("overlap", "skip"), catch_up=b.get("catch_up", "latest"),
                 options=dict(b.get("options") or {}), paused=bool(b.get("paused")),
                 cursor=wall, created=wall, by=by)
    s.next = math.inf if s.paused else next_tick(s.cron, s.tz, wall)
    return s


def _span(cron: str, tz: str, after: float, upto: float,
          limit: int) -> tuple[list[float], int]:
    """The ticks of ``cron`` strictly after ``after`` and at or before ``upto``, oldest
    first, at most ``limit`` of them (one parse, one walk), and how many there are: past
    ``limit`` the rest are counted from the walked ticks' mean spacing, not walked — a
    day of a per-second cron costs what ``limit`` ticks do."""
    ticks: list[float] = []
    for when in CronSim(cron, datetime.fromtimestamp(after, zone(tz))):
        t = when.timestamp()
        if t > upto:
            break
        if len(ticks) == limit:
            gap = (t - ticks[0]) / len(ticks)
            return ticks, len(ticks) + 1 + int((upto - t) / gap)
        ticks.append(t)
    return ticks, len(ticks)


def due(s: Schedule, wall: float, grace: float = GRACE) -> tuple[list[float], int, float]:
    """The ticks of ``s`` to fire at wall time ``wall`` by its catch-up policy, how many
    it skips as missed, and its new cursor. Ticks after the cursor, up to ``wall``: those
    within ``grace`` of ``wall`` fire; older ones (missed) follow ``catch_up``.

    What it costs is bounded whatever the gap: the missed ticks are walked only as far
    as ``all`` fires them (``MAX_CATCH_UP``; ``COUNT_WALK`` for the others, to count
    them), the newest missed one is found directly (``latest_tick``), and a count past
    the walk is an estimate from the ticks' spacing."""
    if s.next > wall:
        return [], 0, s.cursor
    edge = wall - grace
    if s.next >= edge:  # late, none missed
        late, n = _span(s.cron, s.tz, s.cursor, wall, MAX_LOOK)
        return late, n - len(late), _newest(s, wall, late, n)
    # (Ticks are whole seconds: the newest one more than ``grace`` ago.)
    last_missed = latest_tick(s.cron, s.tz, math.ceil(edge) - 1)
    assert last_missed is not None  # (s.next is one)
    missed, n_missed = _span(s.cron, s.tz, s.cursor, last_missed,
                             MAX_CATCH_UP if s.catch_up == "all" else COUNT_WALK)
    late, n_late = _span(s.cron, s.tz, last_missed, wall, MAX_LOOK)
    cursor = _newest(s, wall, late, n_late) if late else last_missed
    over = n_late - len(late)  # (late ticks past MAX_LOOK: skipped)
    if s.catch_up == "all":
        return missed + late, n_missed - len(missed) + over, cursor
    if s.catch_up == "latest" and not late:
        return [last_missed], n_missed - 1, cursor
    return late, n_missed + over, cursor


def _newest(s: Schedule, wall: float, walked: list[float], n: int) -> float:
    """The cursor after ``n`` ticks up to ``wall`` of which ``walked`` were walked."""
    if n == len(walked):
        return walked[-1]
    newest = latest_tick(s.cron, s.tz, wall)
    return newest if newest is not None else walked[-1]


__all__ = ["CATCH_UP", "GRACE", "KEY_PREFIX", "MAX_CATCH_UP", "MAX_QUEUED", "OPTIONS",
           "OVERLAP", "Schedule", "cron_problem", "due", "latest_tick", "new", "next_tick",
           "spec_problem", "stamp", "tick_key", "tick_of"]
