"""A file descriptor any thread can poke to wake an I/O loop out of ``zmq.Poller.poll``."""

from __future__ import annotations

import os
import threading


class Waker:
    """eventfd-backed (a pipe where eventfd is missing); ``wake`` is safe from any thread.

    ``wake`` after ``close`` does nothing: a closed descriptor's number is soon reused by
    someone else's socket, and writing into that would corrupt it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._pending = False
        if hasattr(os, "eventfd"):
            self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._wfd = self.fd
            self._evfd = True
        else:  # pragma: no cover - non-Linux
            self.fd, self._wfd = os.pipe()
            os.set_blocking(self.fd, False)
            os.set_blocking(self._wfd, False)
            self._evfd = False

    def wake(self) -> None:
        if self._pending:
            # A wake is on its way and the loop has not drained it yet: whatever the
            # caller queued before calling is seen in the turn after that drain. Saves
            # a lock and a syscall per call while the loop is busy (a burst of submits).
            return
        with self._lock:
            if self._closed:
                return
            self._pending = True
            try:
                if self._evfd:
                    os.eventfd_write(self._wfd, 1)
                else:  # pragma: no cover
                    os.write(self._wfd, b"x")
            except (BlockingIOError, OSError):
                pass  # already pending: the loop wakes either way

    def drain(self) -> None:
        """Consume the wakes; the caller then looks at everything queued. (Read first,
        then clear: a wake skipped in between was queued before this turn looks.)"""
        try:
            if self._evfd:
                os.eventfd_read(self.fd)
            else:  # pragma: no cover
                os.read(self.fd, 4096)
        except (BlockingIOError, OSError):
            pass
        self._pending = False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in {self.fd, self._wfd}:
                try:
                    os.close(fd)
                except OSError:
                    pass
