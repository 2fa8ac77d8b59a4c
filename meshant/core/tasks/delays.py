"""Delayed tasks: a submission that is not to start before a time (#32.1).

A ``task.submit`` may carry ``at`` (wall-clock seconds since the epoch, read on the
queen's clock: a sender's clock is informative only) or ``after`` (seconds from when the
queen takes the submission). The queen turns either into one wall-clock time, the
task's ``not_before``: journaled with the task, so a restarted queen, or one that takes
over the journal, keeps it. Until then the task is ``delayed`` — apart from the ready
work (no queue holds it, ``queued`` does not count it), its run-time ``timeout`` and its
wait for a capable forager not started — and it can be cancelled like a queued one. At
its time it joins its queue (``queued``), never earlier on the queen's wall clock.

Sans-IO: the rules (what is a valid delay, when a task is due, how a delay is said) are
here; the scheduler, the only writer of a task's state, moves the task
(``DELAYED --release--> QUEUED``, :mod:`meshant.core.lifecycle`). The client and the
command line parse what a person writes (``5m``, ``1h30m``, an ISO-8601 time) with
:func:`parse_duration` and :func:`parse_time`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

# A delay beyond this is a mistake (a time in milliseconds taken for seconds), not a plan.
MAX_DELAY = 366 * 86400.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def delay_problem(body: dict[str, Any]) -> str | None:
    """Why a submission's ``at``/``after`` is malformed, or None (absent is fine)."""
    at, after = body.get("at"), body.get("after")
    if at is not None and after is not None:
        return "a submission names one of 'at' (a wall-clock time) or 'after' (seconds), " \
               "not both"
    for name, v in (("at", at), ("after", after)):
        if v is None:
            continue
        if v.__class__ not in (int, float) or not math.isfinite(v):
            return f"'{name}' is a number of seconds, not {v!r}"
    if after is not None and not 0 <= after <= MAX_DELAY:
        return f"'after' is seconds between 0 and {MAX_DELAY:.0f} (366 days), not {after!r}"
    if at is not None and at < 0:
        return f"'at' is wall-clock seconds since 1970, not {at!r}"
    return None


def not_before(body: dict[str, Any], wall_now: float) -> float | None:
    """The wall-clock time a (checked) submission may start at; None: at once (no delay,
    or a time already past)."""
    at, after = body.get("at"), body.get("after")
    when = float(at) if at is not None else (wall_now + after if after else None)
    if when is None or when <= wall_now:
        return None
    return when


def too_far(when: float, wall_now: float) -> str | None:
    """Why ``when`` is too far ahead to be a delay, or None."""
    if when - wall_now > MAX_DELAY:
        return (f"'at' is {(when - wall_now) / 86400:.0f} days from now: a delay is at most "
                "366 days ('at' is seconds since 1970, not milliseconds)")
    return None


def due(not_before_wall: float, to_wall: float, now: float) -> float:
    """When, on the queen's monotonic clock (``to_wall``: wall minus monotonic), a task
    delayed until the wall-clock ``not_before_wall`` is due; never before ``now``."""
    return max(now, not_before_wall - to_wall)


def describe(not_before_wall: float) -> str:
    """A delay in words, for the audit trail."""
    return f"delayed until {datetime.fromtimestamp(not_before_wall, UTC):%Y-%m-%dT%H:%M:%SZ}"


def parse_duration(text: str) -> float:
    """Seconds in a duration a person writes: ``90``, ``90s``, ``5m``, ``1h30m``, ``2d``,
    ``250ms``. Raises ValueError with what is wrong and what would be right."""
    s = text.strip().lower().replace(" ", "")
    try:
        seconds = float(s)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _PART.finditer(s):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(s) or not s:
            raise ValueError(f"{text!r} is not a duration: write seconds (90) or a number "
                             "with a unit, ms s m h d w (5m, 1h30m, 2d)") from None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY:
        raise ValueError(f"{text!r} is not a duration of 0 to 366 days")
    return seconds


def parse_time(text: str) -> float:
    """Wall-clock seconds of an ISO-8601 time (``2026-12-24T18:00``, ``...+01:00``,
    ``...Z``; without an offset: this machine's local time). Raises ValueError with
    what is wrong and what would be right."""
    s = text.strip()
    if s[-1:] in ("z", "Z"):
        s = s[:-1] + "+00:00"
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time: write 2026-12-24T18:00, "
                         "2026-12-24T18:00:00+01:00 or 2026-12-24T17:00Z") from None
    return t.timestamp()  # a naive time is local time


__all__ = ["MAX_DELAY", "delay_problem", "describe", "due", "not_before", "parse_duration",
           "parse_time", "too_far"]
