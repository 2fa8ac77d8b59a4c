"""Where ZeroMQ's own errors stop: every public entry point of the actors that can touch a
socket in the caller's thread is wrapped in :func:`translated`, so a caller sees a
:class:`~meshant.errors.MeshantError` (with the errno in ``detail``), never a
``zmq.ZMQError`` (as httpcore's ``map_exceptions`` does for its transports)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import zmq

from meshant.errors import ConfigError, MeshantError
from meshant.protocol.codes import Code

P = ParamSpec("P")
R = TypeVar("R")


def translate(e: zmq.ZMQError, what: str) -> MeshantError:
    """The MeshantError a ZeroMQ error stands for."""
    if isinstance(e, zmq.ContextTerminated):
        return MeshantError(f"{what}: its ZeroMQ context was terminated", code=Code.CLOSED)
    if e.errno in (zmq.EADDRINUSE, zmq.EADDRNOTAVAIL, zmq.EPROTONOSUPPORT, zmq.EINVAL):
        return ConfigError(f"{what}: {e.strerror}", errno=e.errno)
    return MeshantError(f"{what}: {e.strerror}", code=Code.IO_FAILED, errno=e.errno)


def translated(what: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: ZeroMQ errors raised by the call become MeshantErrors about ``what``."""
    def deco(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except zmq.ZMQError as e:
                raise translate(e, what) from None
        return call
    return deco


__all__ = ["translate", "translated"]
