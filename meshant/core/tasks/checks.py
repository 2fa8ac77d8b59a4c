"""What a forager may answer about an assignment (spec §6 "Answers"), checked before the
scheduler sees it.

A malformed answer is refused ``bad-value`` and changes nothing: the attempt stays
current and its lease is not renewed, so the forager can still send a well-formed answer
(or the lease runs out). Guessing instead — completing a task whose result has no status,
failing one whose status is unknown — would deliver something the forager never said.
"""

from __future__ import annotations

from typing import Any

from meshant.protocol.codec import JSON

STATUSES = ("ok", "error", "cancelled")


def result_problem(body: dict[str, Any], codec: str) -> str | None:
    """Why a ``task.result`` body (or a ``task.batch`` item) is malformed, or None."""
    if body.get("partial"):
        if "value" not in body:
            return "a partial result (partial: true) carries its 'value'"
        return None
    status = body.get("status")
    if status not in STATUSES:
        return (f"a final result needs 'status' \"ok\", \"error\" or \"cancelled\", "
                f"not {status!r}")
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


def progress_problem(body: dict[str, Any]) -> str | None:
    """Why a ``task.progress`` body is malformed, or None."""
    fraction = body.get("fraction")
    if fraction is not None and not 0 <= fraction <= 1:
        return f"'fraction' is between 0 and 1, not {fraction!r}"
    return None
