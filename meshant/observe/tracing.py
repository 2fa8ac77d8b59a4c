"""Traces across hops: a W3C ``traceparent`` travels with a task (IACP/2's ``traceparent``
envelope extension, docs/protocol.md).

The client puts its current span's ``traceparent`` on ``task.submit``; the queen records a
scheduling span (from submission to assignment) as that span's child and forwards its own
``traceparent`` on ``task.assign`` (in a ``task.assigns`` batch, on each item); the forager
runs the handler inside a span that is the queen's span's child. One task, one connected
trace across three processes.

All of it only when the process uses OpenTelemetry (``meshant[otel]``): meshant never
imports it itself — a program that traces has imported ``opentelemetry.trace`` already
(to configure a provider or open a span), and only then does meshant look for spans.
Otherwise every function here returns at once (one dictionary lookup) and nothing changes
on the wire. Spans go wherever the process's tracer provider sends them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TRACEPARENT = "traceparent"
_api: Any = None  # (trace, propagate) once the program has loaded opentelemetry


def _otel() -> Any:
    global _api
    if _api is None:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:
            return None  # the program does not trace: import nothing (it takes ~80 ms)
        from opentelemetry import propagate  # part of the same package, already installed

        _api = (trace, propagate)
    return _api


def available() -> bool:
    """Whether this process uses OpenTelemetry (has loaded ``opentelemetry.trace``)."""
    return _otel() is not None


def current() -> str | None:
    """The caller's current span as a ``traceparent``; None without one (or without
    opentelemetry)."""
    api = _otel()
    if api is None:
        return None
    trace, propagate = api
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def child_span(parent: str, name: str, start_ns: int, attributes: dict[str, Any]) -> str:
    """Record a finished span ``name`` (from ``start_ns`` to now) as the child of
    ``parent``; its own ``traceparent`` (``parent`` itself when nothing records)."""
    api = _otel()
    if api is None:
        return parent
    trace, propagate = api
    ctx = propagate.extract({TRACEPARENT: parent})
    span = trace.get_tracer("meshant").start_span(name, context=ctx, start_time=start_ns,
                                                  attributes=attributes)
    span.end()
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT, parent)


@contextmanager
def span_from(parent: str | None, name: str, attributes: dict[str, Any]) -> Iterator[None]:
    """Run the block in a span ``name``, the child of ``parent`` (a ``traceparent``);
    nothing at all without a parent or without opentelemetry."""
    api = _otel() if parent else None
    if api is None:
        yield
        return
    trace, propagate = api
    ctx = propagate.extract({TRACEPARENT: parent})
    with trace.get_tracer("meshant").start_as_current_span(name, context=ctx,
                                                           attributes=attributes):
        yield


def traced(fn: Callable[..., Any], parent: str, attributes: dict[str, Any],
           is_async: bool) -> Callable[..., Any]:
    """``fn`` run inside a span that is the child of ``parent`` (the forager's handler)."""
    if is_async:
        async def run_async(*args: Any) -> Any:
            with span_from(parent, "meshant.handle", attributes):
                return await fn(*args)
        return run_async

    def run(*args: Any) -> Any:
        with span_from(parent, "meshant.handle", attributes):
            return fn(*args)
    return run


def assign_spans(msg: Any, submitted: Callable[[str], float | None]) -> None:
    """The queen's scheduling spans for a ``task.assign`` (or each item of a
    ``task.assigns``) that carries a ``traceparent``: recorded, and the message's
    ``traceparent`` replaced by the span's own so the forager's span is its child.
    ``submitted(task_id)`` is the task's submission time in wall-clock seconds."""
    import time

    def one(tp: str, body: dict[str, Any]) -> str:
        t = submitted(str(body.get("task")))
        start = int((t if t is not None else time.time()) * 1e9)
        return child_span(tp, "meshant.schedule", start, {
            "meshant.task": str(body.get("task")), "meshant.attempt": body.get("attempt", 0),
            "meshant.capability": str(body.get("capability")),
            "meshant.forager": str(msg.to)})

    if msg.kind == "task.assign":
        tp = (msg.extra or {}).get(TRACEPARENT)
        if isinstance(tp, str):
            msg.extra = {**msg.extra, TRACEPARENT: one(tp, msg.b)}
        return
    for item in msg.b.get("assigns", ()):
        tp = item.get(TRACEPARENT)
        if isinstance(tp, str):
            item[TRACEPARENT] = one(tp, item)


__all__ = ["TRACEPARENT", "assign_spans", "available", "child_span", "current", "span_from",
           "traced"]
