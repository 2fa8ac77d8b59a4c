"""The threads a forager runs its handlers in.

Like ``concurrent.futures.ThreadPoolExecutor`` with one difference that matters to an
agent host: the threads are daemons. Python joins an executor's threads at exit, so one
handler that never returns (a hung model call, a handler that ignores its cancel) would
keep the whole forager process from exiting on Ctrl-C or SIGTERM. Here stopping returns
at once; the queen reissues what was running.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("meshant.forager")

_STOP = object()


class Workers:
    """``size`` daemon threads taking calls from one queue, in order."""

    def __init__(self, size: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
                         for i in range(size)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a free thread; RuntimeError once shut down."""
        if self._closed:
            raise RuntimeError("the workers are shut down")
        self._calls.put((fn, args))

    def shutdown(self) -> None:
        """Take no more calls and drop the queued ones; running calls are left to end
        (or to die with the process)."""
        self._closed = True
        try:
            while True:
                self._calls.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._calls.put(_STOP)

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:  # the callers report their own errors; this is a last guard
                log.exception("a forager worker call failed")


__all__ = ["Workers"]
