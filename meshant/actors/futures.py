"""What a client hands back for a submitted task: a :class:`TaskFuture` (its result, or
its error) and the :class:`Update` stream of its progress reports and partial results."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from meshant.errors import Timeout


@dataclass(frozen=True, slots=True)
class Update:
    """A progress report or a partial result of a running task, in the order sent."""

    # "progress", "partial", "input-required" (the task asks: ``value`` holds its prompt
    # and data, ``request`` the id to answer), "withdrawn" (it stopped waiting for
    # ``request``), or "callback-error" (your on_progress raised)
    kind: str
    seq: int
    fraction: float | None = None
    note: str | None = None
    value: Any = None
    request: str | None = None


R = TypeVar("R")


class TaskFuture(Future[R]):
    """A ``concurrent.futures.Future`` for one task, with its id and its stream of updates.
    ``R`` is its result's type when submitted by a :class:`~meshant.Capability`."""

    def __init__(self, task_id: str,
                 pump: Callable[[Callable[[], bool], float | None], None] | None = None) -> None:
        super().__init__()
        self.task_id = task_id
        self.acknowledged = False
        self.last_seq = 0
        self._size = 0  # bytes of its submission the client keeps (for re-sending)
        self._pump = pump
        self._updates: queue.SimpleQueue[Update | None] = queue.SimpleQueue()

    def result(self, timeout: float | None = None) -> R:
        if self._pump is not None and not self.done():
            # A direct client: this thread reads the socket until the result is here.
            self._pump(self.done, timeout)
            timeout = 0
        try:
            return super().result(timeout)
        except TimeoutError as e:
            if isinstance(e, Timeout):
                raise
            raise Timeout(f"task {self.task_id} did not finish within {timeout:g} s "
                          "(it goes on: wait again, or cancel it)") from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._pump is not None and not self.done():
            self._pump(self.done, timeout)
            timeout = 0
        try:
            return super().exception(timeout)
        except TimeoutError as e:
            if isinstance(e, Timeout):
                raise
            raise Timeout(f"task {self.task_id} did not finish within {timeout:g} s") from None

    def updates(self, timeout: float | None = None) -> Iterator[Update]:
        """Yield progress reports and partial results until the task ends.

        ``timeout`` bounds the wait for each update; TimeoutError when it passes.
        """
        return drain_updates(self._updates, self._pump, timeout, f"task {self.task_id}")


def drain_updates(updates: queue.SimpleQueue[Any], pump: Any, timeout: float | None,
                  what: str) -> Iterator[Any]:
    """Yield from ``updates`` until its end mark (None); ``pump`` drives the socket when
    the caller's thread is the I/O thread (an unthreaded client)."""
    while True:
        if pump is not None and updates.empty():
            pump(lambda: not updates.empty(), timeout)
        try:
            u = updates.get(timeout=timeout if pump is None else 0)
        except queue.Empty:
            raise Timeout(f"no update for {what} within {timeout} s") from None
        if u is None:
            updates.put(None)  # the end stays for whoever follows (updates() again)
            return
        yield u


def fail(fut: Future[Any], err: BaseException) -> None:
    """Fail ``fut`` with ``err``, unless it already has its outcome (a result, an error, or
    a cancel by the caller): the first outcome stands."""
    if not fut.done():
        fut.set_exception(err)


__all__ = ["TaskFuture", "Update", "fail"]
