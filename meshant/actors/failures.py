"""What a handler's failure leaves in a result: its exception's type, message and a
bounded traceback of the handler's own frames."""

from __future__ import annotations

import os
import traceback
from typing import Any

from meshant.errors import MeshantError

# A failed result carries the last frames of its traceback, each string cut short, so
# one deep recursion cannot make a result of megabytes.
TRACEBACK_FRAMES = 20
_FIELD_MAX = 300
MESSAGE_MAX = 2000


def _cut(s: str, most: int) -> str:
    return s if len(s) <= most else s[:most - 1] + "…"


# The frames of meshant's own that called the handler (the forager's worker, a tracing
# wrapper) say nothing about where it failed.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def frames(e: BaseException, most: int = TRACEBACK_FRAMES) -> list[dict[str, Any]]:
    """The last ``most`` frames of where ``e`` was raised, innermost last, from the
    handler's own on (meshant's frames that called it left out): each a map of ``file``,
    ``line``, ``function`` and ``source`` (the line's text)."""
    tb = traceback.extract_tb(e.__traceback__)
    first = 0
    while first < len(tb) - 1 and tb[first].filename.startswith(_OURS):
        first += 1
    return [{"file": _cut(f.filename, _FIELD_MAX), "line": f.lineno or 0,
             "function": _cut(f.name, _FIELD_MAX), "source": _cut(f.line or "", _FIELD_MAX)}
            for f in tb[max(first, len(tb) - most):]]


def own_failure(e: BaseException) -> bool:
    """Whether ``e`` is a failure meshant's own code raised on purpose (a wrapper
    refusing a payload, a wrapped server's error): a MeshantError none of whose frames is
    the handler author's, so its traceback would show only meshant's internals."""
    return isinstance(e, MeshantError) and all(
        f.filename.startswith(_OURS) for f in traceback.extract_tb(e.__traceback__))


def error_body(e: BaseException, *, retry: bool = False) -> dict[str, Any]:
    """The result body of a task whose handler raised ``e``: its type, message and a
    bounded traceback (none for :func:`own_failure`); ``retry``: ask the queen to try the
    task again (the handler opted in for this exception)."""
    err: dict[str, Any] = {"type": type(e).__name__, "message": _cut(str(e), MESSAGE_MAX)}
    tb = [] if own_failure(e) else frames(e)
    if tb:
        err["traceback"] = tb
    if retry:
        err["retry"] = True
    return {"status": "error", "error": err}


__all__ = ["MESSAGE_MAX", "TRACEBACK_FRAMES", "error_body", "frames", "own_failure"]
