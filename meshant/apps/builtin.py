"""Demo capabilities every forager can serve with no code: echo, sleep, fail, stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshant.actors.forager import Forager
from meshant.actors.handlers import TaskContext


class DemoError(Exception):
    """Raised by the ``fail`` capability."""


def echo(payload: Any) -> Any:
    """Return the payload as it came."""
    return payload


def sleep(payload: Any, ctx: TaskContext) -> Any:
    """Wait {"seconds": N} (default 1) seconds, cancellably, then return the payload."""
    seconds = float(payload.get("seconds", 1.0)) if isinstance(payload, dict) else 1.0
    if ctx.cancelled.wait(max(0.0, seconds)):
        raise DemoError("cancelled while sleeping")
    return payload


def fail(payload: Any) -> Any:
    """Fail on purpose, with {"message": TEXT} (or the payload) as the error."""
    message = payload.get("message", "failed on purpose") if isinstance(payload, dict) else (
        str(payload))
    raise DemoError(message)


def stream(payload: Any, ctx: TaskContext) -> Any:
    """Stream {"text": TEXT}'s words as partial results, like a model streaming tokens,
    each followed by a progress report unless "progress" is false; "delay" seconds
    (default 0.01) before each word."""
    text = payload.get("text", "") if isinstance(payload, dict) else str(payload or "")
    delay = float(payload.get("delay", 0.01)) if isinstance(payload, dict) else 0.01
    progress = not isinstance(payload, dict) or payload.get("progress", True) is not False
    words = text.split()
    for i, w in enumerate(words):
        if delay > 0 and ctx.cancelled.wait(delay):
            break
        if ctx.is_cancelled:
            break
        ctx.partial(w)
        if progress:
            ctx.progress((i + 1) / len(words))
    return {"words": len(words)}


BUILTINS: dict[str, Callable[..., Any]] = {
    "echo": echo, "sleep": sleep, "fail": fail, "stream": stream}


# echo takes microseconds and cannot block: it runs in the forager's I/O thread.
INLINE = frozenset({"echo"})


def add_builtins(forager: Forager, names: list[str] | None = None) -> None:
    """Serve the demo capabilities (all of them, or ``names``) on ``forager``."""
    for name in names or list(BUILTINS):
        if name not in forager.handlers:
            forager.add_handler(name, BUILTINS[name], inline=name in INLINE)
