"""What an application served by :class:`~.server.WebServer` sees: a request that passed
the policy, and the answer it gives — a whole response or a stream."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from meshant.adapters.web.http1 import RequestHead
from meshant.adapters.web.policy import Access


@dataclass(frozen=True, slots=True)
class Request:
    """A request that passed the policy, with what its credentials grant."""

    head: RequestHead
    body: bytes
    rights: Access
    peer: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Stream:
    """An answer written chunk by chunk as ``chunks`` yields, until it ends or the client
    goes (at most ``Limits.max_streams`` at once; ``busy`` says so past that); the
    connection closes after it."""

    chunks: AsyncGenerator[bytes, None]
    content_type: str = "text/event-stream"
    status: int = 200
    busy: str = "streams are open, the most this server serves"


def json_response(status: int, obj: Any) -> Response:
    return Response(status, json.dumps(obj, default=str).encode())


class Busy(Exception):
    """Too much is already waiting: answered 503 with this message."""


class App(Protocol):
    """What a request needs (by method and path), and its answer."""

    def need(self, method: str, path: str) -> Access: ...

    async def handle(self, request: Request) -> Response | Stream: ...


__all__ = ["App", "Busy", "Request", "Response", "Stream", "json_response"]
