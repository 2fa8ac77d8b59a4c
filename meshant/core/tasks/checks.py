"""What a forager may answer about an assignment (spec §6 "Answers"), checked before the
scheduler sees it.

A malformed answer is refused ``bad-value`` and changes nothing: the attempt stays
current and its lease is not renewed, so the forager can still send a well-formed answer
(or the lease runs out). Guessing instead — completing a task whose result has no status,
failing one whose status is unknown — would deliver something the forager never said.
"""

from __future__ import annotations

from typing import Any

from meshant.core.tasks.model import retry_on_problem
from meshant.protocol.codec import JSON

STATUSES = ("ok", "error", "cancelled", "suspended")


def result_problem(body: dict[str, Any], codec: str) -> str | None:
    """Why a ``task.result`` body (or a ``task.batch`` item) is malformed, or None."""
    if body.get("partial"):
        if "value" not in body:
            return "a partial result (partial: true) carries its 'value'"
        return None
    status = body.get("status")
    if status not in STATUSES:
        return (f"a final result needs 'status' \"ok\", \"error\", \"cancelled\" or "
                f"\"suspended\", not {status!r}")
    if status == "suspended":
        return _wait_problem(body.get("wait"))
    if status == "ok" and "result" not in body and codec != JSON:
        # IACP 1.1 results carry their fields in the body itself (spec §8).
        return "a result with status \"ok\" carries 'result' (nil for none)"
    if status == "error":
        err = body.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return "a result with status \"error\" carries 'error', a map with a 'message' string"
        if any(k in err and not isinstance(err[k], str) for k in ("type", "code")):
            return "the 'type' and 'code' of a result's 'error' are strings"
    return None


def _wait_problem(wait: Any) -> str | None:
    """Why a suspended result's ``wait`` is malformed (what wakes the task), or None."""
    if not isinstance(wait, dict):
        return "a suspended result carries 'wait': what wakes the task"
    until, request, child = wait.get("until"), wait.get("request"), wait.get("child")
    if sum(x is not None for x in (until, request, child)) != 1:
        return "a suspended result's 'wait' names one of until, request, child"
    if until is not None and (until.__class__ not in (int, float) or until != until):
        return "a wait's 'until' is wall-clock seconds"
    if request is not None and not (isinstance(request, str) and isinstance(
            wait.get("position"), int) and isinstance(wait.get("name"), str)
            and isinstance(wait.get("occurrence"), int)):
        return "a wait for an answer names its 'request' and its step (position, name, " \
               "occurrence)"
    if child is not None and not isinstance(child, str):
        return "a wait's 'child' is a sub-task's id"
    return None


_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "priority": (int,), "max_attempts": (int,), "timeout": (int, float), "wait": (int, float),
    "labels": (dict,), "to": (str,), "retry_on": (list,), "retry_base": (int, float),
    "retry_cap": (int, float)}


def options_problem(body: dict[str, Any]) -> str | None:
    """Why a submission's options (a ``task.submit`` body, or a sub-task's ``options``)
    are out of range, or None."""
    if _OPTION_TYPES.keys().isdisjoint(body):
        return None  # (most submissions: the defaults, nothing to check)
    for k, types in _OPTION_TYPES.items():
        v = body.get(k)
        if v is not None and (not isinstance(v, types) or v.__class__ is bool):
            return f"{k} must be {' or '.join(t.__name__ for t in types)}, not {v!r}"
    if not 0 <= body.get("priority", 50) <= 99 or not 1 <= body.get("max_attempts", 3) <= 100:
        return "priority must be 0-99 and max_attempts 1-100"
    if any(not 0 <= body.get(k, 0) <= 3600 for k in ("retry_base", "retry_cap")):
        return "retry_base and retry_cap are seconds between 0 and 3600"
    timeout = body.get("timeout")
    if (timeout is not None and timeout <= 0) or body.get("wait", 0) < 0:
        return "timeout must be > 0 and wait >= 0"
    retry_on = body.get("retry_on")
    if retry_on is not None:
        return retry_on_problem(retry_on)
    return None


def progress_problem(body: dict[str, Any]) -> str | None:
    """Why a ``task.progress`` body is malformed, or None."""
    fraction = body.get("fraction")
    if fraction is not None and not 0 <= fraction <= 1:
        return f"'fraction' is between 0 and 1, not {fraction!r}"
    return None
