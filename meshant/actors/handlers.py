"""What a forager's handlers see, and how they are called: :class:`TaskContext` (the
task a handler runs, and how it reports progress or partial results), :class:`Handler`
(a registered handler) and :func:`positional_args` (the one rule for which arguments a
handler or a broadcast callback is given)."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from meshant import protocol as p


class Sender(Protocol):
    """Where a task context sends its progress and partial results (the forager)."""

    def send_message(self, msg: p.Message) -> None: ...

    @property
    def features(self) -> frozenset[str]: ...


class TaskContext:
    """What a handler knows about the task it runs, and how it talks back while running."""

    __slots__ = ("_cancelled", "_event", "_forager", "_future", "attempt", "capability",
                 "deadline", "ref", "task_id")

    def __init__(self, forager: Sender, ref: str, task_id: str, attempt: int,
                 capability: str, deadline: float | None) -> None:
        self._forager = forager
        self._future: Any = None
        self.ref = ref
        self.task_id = task_id
        self.attempt = attempt
        self.capability = capability
        self.deadline = deadline
        self._cancelled = False
        self._event: threading.Event | None = None

    @property
    def is_cancelled(self) -> bool:
        """True once the queen cancelled this task; long handlers should check it and stop."""
        return self._cancelled

    @property
    def cancelled(self) -> threading.Event:
        """An Event set when the task is cancelled (``ctx.cancelled.wait(s)`` sleeps
        cancellably). Made on first use: most tasks never need one."""
        ev = self._event
        if ev is None:
            ev = threading.Event()
            if self._cancelled:
                ev.set()
            self._event = ev
            if self._cancelled:  # a cancel raced with the creation
                ev.set()
        return ev

    def cancel(self) -> None:
        self._cancelled = True
        ev = self._event
        if ev is not None:
            ev.set()

    def progress(self, fraction: float | None = None, note: str | None = None) -> None:
        """Report progress (0.0-1.0) and/or a short note; also renews the task's lease.
        Nothing is sent once the task is cancelled, or when the queen did not negotiate
        ``progress`` (a feature not negotiated is not used, spec §5)."""
        if self._cancelled or "progress" not in self._forager.features:
            return
        body: dict[str, Any] = {}
        if fraction is not None:
            body["fraction"] = float(fraction)
        if note is not None:
            body["note"] = str(note)
        self._forager.send_message(p.Message("task.progress", body, ref=self.ref, to="queen"))

    def spawn(self, name: str, capability: str, payload: Any = None, *,
              after: list[str] | None = None, after_spawned: list[str] | None = None,
              **options: Any) -> Future[list[str]]:
        """Add a node to this task's graph (only a graph node may spawn): it runs once
        what it waits for (``after``, ``$result`` references in its payload) completes,
        and nodes declared ``after_spawned=[this node]`` wait for it too. ``options``:
        priority, timeout, labels, to, max_attempts, wait. Returns a future of the names
        the queen added; it fails with the queen's reason if it refused (a cycle, a
        missing or duplicate name, the size limit). A re-run of this node may spawn the
        same names again: they are the same nodes, not new ones."""
        node: dict[str, Any] = {"name": name, "capability": capability, "payload": payload}
        if after:
            node["after"] = list(after)
        if after_spawned:
            node["after_spawned"] = list(after_spawned)
        node.update({k: v for k, v in options.items() if v is not None})
        return self.spawn_many([node])

    def spawn_many(self, nodes: list[dict[str, Any]]) -> Future[list[str]]:
        """Add several nodes at once (each a map as :meth:`spawn` builds it); they may
        wait for each other. All are added, or none."""
        msg = p.Message("graph.spawn", {"nodes": [{**n, "payload": p.wrap_blob(n.get("payload"))}
                                                  for n in nodes]}, ref=self.ref, to="queen")
        fut: Future[list[str]] = Future()
        expect = getattr(self._forager, "await_reply", None)
        if expect is not None:
            expect(msg.id, fut)
        else:
            fut.set_result([str(n.get("name")) for n in nodes])
        self._forager.send_message(msg)
        return fut

    def partial(self, value: Any) -> None:
        """Stream a partial result to the submitter (delivered in order, exactly once).
        Nothing is sent once the task is cancelled, or without ``progress`` negotiated."""
        if self._cancelled or "progress" not in self._forager.features:
            return
        self._forager.send_message(p.Message(
            "task.result", {"partial": True, "value": p.wrap_blob(value)}, ref=self.ref,
            to="queen"))


def positional_args(fn: Callable[..., Any], most: int) -> int:
    """How many positional arguments to call ``fn`` with, at most ``most``: those it
    requires (parameters with defaults are the function's own, never filled), or
    ``most`` when it takes ``*args`` or its signature cannot be read.

    ``fn(payload, ctx)`` is given the task's context, ``fn(payload)`` not; a broadcast
    callback ``fn(topic, data, message)`` is given the message, ``fn(topic, data)`` not.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return most
    if any(q.kind == q.VAR_POSITIONAL for q in params):
        return most
    return min(most, sum(1 for q in params if q.kind in (q.POSITIONAL_ONLY,
                                                           q.POSITIONAL_OR_KEYWORD)
                         and q.default is q.empty))


@dataclass(slots=True)
class Handler:
    """A registered handler: how to call it (see :meth:`Forager.task`)."""

    fn: Callable[..., Any]
    batch: int | None
    is_async: bool
    takes_ctx: bool
    inline: bool = False

    @classmethod
    def of(cls, fn: Callable[..., Any], batch: int | None, inline: bool) -> Handler:
        """``fn`` is given the context if it requires a second positional argument."""
        return cls(fn, batch, inspect.iscoroutinefunction(fn), positional_args(fn, 2) >= 2,
                   inline)


def error_body(e: BaseException) -> dict[str, Any]:
    """The result body of a task whose handler raised ``e``."""
    return {"status": "error", "error": {"type": type(e).__name__, "message": str(e)}}


__all__ = ["Handler", "TaskContext", "error_body", "positional_args"]
