"""Serving a gateway's ASGI app over HTTP the way every meshant HTTP surface is served:
behind the shared policy (:class:`~meshant.adapters.web.asgi.Guard`: Host, Origin, body
limits), with the caller named by a bearer token (:class:`CallerGate`), by uvicorn on a
socket bound here (loopback unless told otherwise).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace

from meshant.adapters.web.asgi import ASGIApp, Guard, Receive, Scope, Send, uvicorn_options
from meshant.adapters.web.policy import Access, Flags, Limits, Policy, bearer, security_headers
from meshant.gateways.colony import Callers

CALLER_KEY = "meshant.caller"  # the scope key of the Caller a request acts as


class CallerGate:
    """ASGI middleware: the bearer token names the caller (put in the scope under
    ``"meshant.caller"``); an unknown token, or none where anonymous callers are refused,
    is answered 401 before the app."""

    def __init__(self, app: ASGIApp, callers: Callers, *, realm: str = "meshant") -> None:
        self.app, self.callers, self.realm = app, callers, realm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        auth = None
        for k, v in scope.get("headers", ()):
            if k.lower() == b"authorization":
                auth = v.decode("latin-1")
        token = bearer(auth)
        caller = self.callers.resolve(token)
        if caller is None:
            why = ("a valid token is needed: send 'Authorization: Bearer TOKEN' with a token "
                   "the gateway was given (--token or --token-file)") if token or \
                self.callers.tokens else "anonymous callers are refused"
            body = json.dumps({"error": why}).encode()
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()),
                       (b"www-authenticate", f'Bearer realm="{self.realm}"'.encode())]
            headers += [(k.lower().encode(), v.encode()) for k, v in security_headers()]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app({**scope, CALLER_KEY: caller}, receive, send)


def guarded(app: ASGIApp, host: str, callers: Callers, limits: Limits,
            allow_hosts: tuple[str, ...] = ()) -> ASGIApp:
    """``app`` behind the shared policy (Host, Origin, body limits) and the token gate.
    Every request passes the Guard's token rule (the gate names the caller instead)."""
    policy = Policy(host, allow_hosts=allow_hosts,
                    flags=Flags(allow_host="--allow-host", token="--token",
                                read_token="--token"))
    return Guard(CallerGate(app, callers), policy, limits,
                 need=lambda method, path: Access.PUBLIC)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off only on sockets whose proto says
    # TCP, and an accepted socket inherits it. Left on, every response on a kept-alive
    # connection waits out the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(min(1024, 128))
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


async def serve(app: ASGIApp, sock: socket.socket, limits: Limits,
                started: Callable[[], Awaitable[None] | None] | None = None) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until SIGINT or SIGTERM (uvicorn's own
    handlers: it stops taking connections, lets running requests end, then returns)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=3, **uvicorn_options(limits))
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        if started is not None:
            out = started()
            if asyncio.iscoroutine(out):
                await out

    waiter = asyncio.get_running_loop().create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        waiter.cancel()


def gateway_limits(max_body: int) -> Limits:
    from meshant.observe.server import default_limits

    return replace(default_limits(), max_body=max_body)


__all__ = ["CALLER_KEY", "CallerGate", "bind", "gateway_limits", "guarded", "serve", "url_of"]
