"""The same policy and limits for an ASGI application (a Starlette app of the official
``a2a-sdk`` or ``mcp`` SDKs, served by uvicorn): :class:`Guard` wraps the app, a plain
ASGI callable that needs no web framework.

A refused request never reaches the app: it is answered 400, 401 or 403 with a one-line
reason (a WebSocket is closed with code 1008 before it is accepted). A body over
``max_body`` is answered 413, one slower than ``body_timeout`` 408. The connection-level
limits are the server's to apply: :func:`uvicorn_options` turns :class:`Limits` into
uvicorn's settings.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from meshant.adapters.web.policy import (
    DEFAULT_LIMITS,
    Access,
    Limits,
    Policy,
    security_headers,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RIGHTS_KEY = "meshant.rights"  # the scope key that carries what the request may do


def default_need(method: str, path: str) -> Access:
    """Reads for GET, HEAD and OPTIONS, actions for the rest."""
    return Access.READ if method in ("GET", "HEAD", "OPTIONS") else Access.ACT


def scope_headers(scope: Scope) -> dict[str, str] | None:
    """The scope's headers by lower-case name (repeats joined by ', '); None when a
    header that must be single (Host, Origin, Authorization, Content-Length) repeats."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1").strip()
        if name in out:
            if name in ("host", "origin", "authorization", "content-length"):
                return None
            value = out[name] + ", " + value
        out[name] = value
    return out


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Guard:
    """ASGI middleware applying ``policy`` (Host, Origin, token) and the body limits of
    ``limits`` before ``app``. ``need`` says what a request needs by method and path.
    What its credentials grant is put in the scope under ``"meshant.rights"``."""

    def __init__(self, app: ASGIApp, policy: Policy, limits: Limits = DEFAULT_LIMITS, *,
                 need: Callable[[str, str], Access] = default_need) -> None:
        self.app, self.policy, self.limits, self.need = app, policy, limits, need

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        method = scope.get("method", "GET")
        headers = scope_headers(scope)
        if headers is None:
            await self._refuse(kind, receive, send, 400, "a header that must be single "
                                                         "was sent twice")
            return
        verdict = self.policy.check(method, headers, self.need(method, scope.get("path", "/")),
                                    "HTTP/" + scope.get("http_version", "1.1"))
        if not verdict.ok:
            await self._refuse(kind, receive, send, verdict.status, verdict.reason)
            return
        scope = {**scope, RIGHTS_KEY: verdict.rights}
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        cl = headers.get("content-length")
        if cl is not None and (not cl.isdigit() or int(cl) > self.limits.max_body):
            await _answer(send, 413, f"the body is over {self.limits.max_body} bytes")
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._bounded(receive), tracked)
        except _Refused as e:
            if started:
                raise  # too late to answer: the server closes the connection
            await _answer(send, e.status, e.reason)

    def _bounded(self, receive: Receive) -> Receive:
        """``receive`` that counts the body and times it: past ``max_body`` bytes or
        ``body_timeout`` seconds from the first read, the app's read raises."""
        limits = self.limits
        size = 0
        done = False
        deadline: float | None = None

        async def wrapped() -> Message:
            nonlocal size, done, deadline
            if done:
                return await receive()
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + limits.body_timeout
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise _Refused(408, "the request's body took too long") from None
            if message.get("type") == "http.request":
                size += len(message.get("body", b""))
                if size > limits.max_body:
                    raise _Refused(413, f"the body is over {limits.max_body} bytes")
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        return wrapped

    @staticmethod
    async def _refuse(kind: str, receive: Receive, send: Send, status: int,
                      reason: str) -> None:
        if kind == "websocket":
            await receive()  # websocket.connect
            # Closed before accepting: the server answers the handshake 403.
            await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
            return
        await _answer(send, status, reason)


async def _answer(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"error": reason}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in security_headers()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that apply ``limits`` to connections:
    their number (503 beyond), the idle keep-alive and the size of a request's head.
    uvicorn has no timeout for a head that arrives slowly: put such a gateway behind a
    proxy that has one, or on loopback only."""
    return {"limit_concurrency": limits.max_connections,
            "backlog": min(1024, max(16, limits.max_connections)),
            "timeout_keep_alive": max(1, round(limits.idle_timeout)),
            "h11_max_incomplete_event_size": limits.max_head}


__all__ = ["RIGHTS_KEY", "Guard", "default_need", "scope_headers", "uvicorn_options"]
