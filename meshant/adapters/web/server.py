"""An HTTP/1.1 server on one asyncio thread, bounded every way its :class:`Limits` say.

One event loop serves every connection: no thread per connection, so a flood of sockets
costs descriptors and a little memory (both capped), never threads. Blocking work an
application needs (a lookup that waits on the queen) runs on a pool of two threads, at
most ``max_pending`` requests queued for it. Each connection's state is one of two:
*waiting* (it has not finished sending a request: evictable, and timed out by
``header_timeout``, ``body_timeout`` and ``idle_timeout``) or *served*. At
``max_connections``, a new connection replaces the oldest waiting one, so connections
that hold a slot without asking anything cannot keep a scraper or a supervisor out; when
every connection is being served, the new one gets 503.

The application is two methods (:class:`App`): which :class:`~.policy.Access` a request
needs, and its answer. The :class:`~.policy.Policy` is applied between the two, before
a body is read.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from meshant.adapters.web.http1 import HttpError, RequestHead, parse_head, render
from meshant.adapters.web.policy import (
    DEFAULT_LIMITS,
    Access,
    Limits,
    Policy,
    security_headers,
)

log = logging.getLogger("meshant.http")
T = TypeVar("T")
ACCEPT_BATCH = 64  # connections accepted per loop turn, at most: the others get turns too
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
REFUSING = 64  # refused connections lingering at once (each reads what came, then closes)
LINGER = 0.25  # seconds a refused connection lingers


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
    goes (at most ``Limits.max_streams`` at once); the connection closes after it."""

    chunks: AsyncGenerator[bytes, None]
    content_type: str = "text/event-stream"
    status: int = 200
    busy: str = "streams are open, the most this server serves"


def json_response(status: int, obj: Any) -> Response:
    return Response(status, json.dumps(obj, default=str).encode())


class Busy(Exception):
    """Too much is already waiting: answered 503 with this message."""


class App(Protocol):
    def need(self, method: str, path: str) -> Access: ...

    async def handle(self, request: Request) -> Response | Stream: ...


@dataclass(eq=False, slots=True)
class _Conn:
    sock: socket.socket
    peer: str
    task: asyncio.Task[None] | None = None
    writer: asyncio.StreamWriter | None = None


@dataclass(slots=True)
class Stats:
    """What the server did: counts since it started."""

    accepted: int = 0
    evicted: int = 0  # waiting connections closed to make room for a new one
    refused: int = 0  # new connections answered 503: every slot busy
    timeouts: int = 0  # connections closed by a header, body, idle or write timeout
    rejected: int = 0  # requests refused by the policy or malformed
    served: int = 0
    accept_pauses: int = 0  # times accepting paused (the accept rate, or no descriptors)
    extra: dict[str, int] = field(default_factory=dict)


class WebServer:
    """Serves ``app`` on ``host:port`` from a thread of its own (``name``), applying
    ``policy`` to every request and ``limits`` to every connection."""

    def __init__(self, app: App, policy: Policy, host: str, port: int, *,
                 limits: Limits = DEFAULT_LIMITS, name: str = "meshant-http") -> None:
        self.app, self.policy, self.limits = app, policy, limits
        self.host, self.port, self.name = host, port, name
        self.stats = Stats()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._conns: dict[_Conn, None] = {}
        self._waiting: dict[_Conn, None] = {}  # insertion order: the oldest first
        self._refusing: set[socket.socket] = set()
        self._streams = 0
        self._pending = 0
        self._tokens = float(max(1.0, limits.accept_rate))
        self._token_at = 0.0
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"{name}-work")
        self._full = render(503, b'{"error": "too many connections: try again shortly"}',
                            [("Content-Type", "application/json")], close=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def connections(self) -> int:
        return len(self._conns)

    # -- life --------------------------------------------------------------------------

    def start(self) -> WebServer:
        """Bind (an OSError says why not) and serve from the server's thread."""
        family, kind, proto, _, addr = socket.getaddrinfo(
            self.host or None, self.port, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(min(1024, max(16, self.limits.max_connections)))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._token_at = loop.time()
        assert self._sock is not None
        loop.add_reader(self._sock, self._accept)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            loop.remove_reader(self._sock)
            self._sock.close()
            tasks = [c.task for c in self._conns if c.task is not None]
            for c in list(self._conns):
                self._drop(c)
            for sock in self._refusing:
                sock.close()
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)

    # -- connections -------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._loop is not None and self._sock is not None
        lim = self.limits
        now = self._loop.time()
        burst = max(1.0, lim.accept_rate)
        self._tokens = min(burst, self._tokens + (now - self._token_at) * lim.accept_rate)
        self._token_at = now
        for _ in range(ACCEPT_BATCH):
            if self._tokens < 1:
                # The kernel's backlog holds the rest until tokens come back: a connect
                # flood costs this thread no more than accept_rate connections a second.
                self._pause((1 - self._tokens) / max(lim.accept_rate, 1e-3))
                return
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_FILES:
                    raise
                log.warning("HTTP: cannot accept (%s): pausing for a second", e.strerror)
                self._pause(1.0)
                return
            self._tokens -= 1
            self._admit(sock, addr)

    def _pause(self, delay: float) -> None:
        assert self._loop is not None and self._sock is not None
        self.stats.accept_pauses += 1
        self._loop.remove_reader(self._sock)
        self._loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        if self._loop is not None and self._stop is not None and not self._stop.is_set():
            assert self._sock is not None
            self._loop.add_reader(self._sock, self._accept)

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        assert self._loop is not None
        self.stats.accepted += 1
        sock.setblocking(False)
        if len(self._conns) >= self.limits.max_connections:
            victim = next(iter(self._waiting), None)
            if victim is None:
                self._refuse(sock)
                return
            self.stats.evicted += 1
            self._drop(victim)
        host, port = addr[0], addr[1]
        conn = _Conn(sock, f"{host}:{port}")
        self._conns[conn] = None
        self._waiting[conn] = None
        conn.task = self._loop.create_task(self._serve(conn))

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 and close a moment later, having read what the client sent by then:
        closed with its request unread, the socket would reset and lose the answer."""
        self.stats.refused += 1
        try:
            sock.send(self._full)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._refusing) >= REFUSING:
            sock.close()  # past that, a flood gets its resets
            return
        self._refusing.add(sock)
        assert self._loop is not None
        self._loop.call_later(LINGER, self._close_refused, sock)

    def _close_refused(self, sock: socket.socket) -> None:
        self._refusing.discard(sock)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        sock.close()

    def _drop(self, conn: _Conn) -> None:
        """Forget ``conn`` and close it now, whatever it was doing."""
        self._forget(conn)
        if conn.writer is not None:
            conn.writer.transport.abort()
        elif conn.task is not None:
            conn.task.cancel()

    def _forget(self, conn: _Conn) -> None:
        self._conns.pop(conn, None)
        self._waiting.pop(conn, None)

    def _mark_waiting(self, conn: _Conn, waiting: bool) -> None:
        self._waiting.pop(conn, None)
        if waiting and conn in self._conns:
            self._waiting[conn] = None  # to the end: the newest waiter

    async def _serve(self, conn: _Conn) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn.sock,
                                                           limit=self.limits.max_head)
        except (OSError, asyncio.CancelledError):
            conn.sock.close()
            self._forget(conn)
            return
        conn.writer = writer
        try:
            await self._requests(conn, reader, writer)
            writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            writer.transport.abort()
        except Exception:
            log.exception("HTTP: serving %s failed", conn.peer)
            writer.transport.abort()
        finally:
            self._forget(conn)

    async def _requests(self, conn: _Conn, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        loop = asyncio.get_running_loop()
        first = True
        while conn in self._conns:
            self._mark_waiting(conn, True)
            got = b""
            try:
                async with asyncio.timeout(lim.header_timeout if first else
                                           lim.idle_timeout) as cm:
                    got = await reader.readexactly(1)
                    if not first:  # idle until now: the head has its own time from here
                        cm.reschedule(loop.time() + lim.header_timeout)
                    got += await reader.readuntil(b"\r\n\r\n")
            except TimeoutError:
                self.stats.timeouts += 1
                if got:
                    await self._error(writer, 408, "the request's head took too long",
                                      close=True)
                return
            except asyncio.LimitOverrunError:
                await self._error(writer, 431, f"the request's head is over {lim.max_head} "
                                               "bytes", close=True)
                return
            except asyncio.IncompleteReadError:
                return  # the client closed
            first = False
            try:
                head = parse_head(got[:-4], lim)
            except HttpError as e:
                await self._error(writer, e.status, e.reason, close=True)
                return
            n = head.content_length
            need = self.app.need("GET" if head.method == "HEAD" else head.method, head.path)
            verdict = self.policy.check(head.method, head.headers, need, head.version)
            if not verdict.ok:
                # A body left unread would be taken for the next request: close instead.
                close = n > 0 or not head.keep_alive
                await self._error(writer, verdict.status, verdict.reason, close=close,
                                  head_only=head.method == "HEAD")
                if close:
                    return
                continue
            if n > lim.max_body:
                await self._error(writer, 413, f"the body is over {lim.max_body} bytes",
                                  close=True)
                return
            body = b""
            if n:
                try:
                    async with asyncio.timeout(lim.body_timeout):
                        body = await reader.readexactly(n)
                except TimeoutError:
                    self.stats.timeouts += 1
                    await self._error(writer, 408, "the request's body took too long",
                                      close=True)
                    return
            self._mark_waiting(conn, False)
            keep = head.keep_alive
            try:
                answer = await self.app.handle(Request(head, body, verdict.rights, conn.peer))
            except Busy as e:
                answer = json_response(503, {"error": str(e)})
            except Exception:
                log.exception("HTTP: %s %s failed", head.method, head.path)
                answer = json_response(500, {"error": "internal error: see the queen's log"})
            self.stats.served += 1
            if isinstance(answer, Stream):
                await self._stream(writer, answer, head.method == "HEAD")
                return
            await self._write(writer, render(
                answer.status, answer.body,
                [("Content-Type", answer.content_type), *answer.headers,
                 *security_headers(answer.content_type.startswith("text/html"))],
                head_only=head.method == "HEAD", close=not keep))
            if not keep:
                return

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        except TimeoutError:
            self.stats.timeouts += 1
            raise ConnectionAbortedError("the client took too long to read") from None

    async def _error(self, writer: asyncio.StreamWriter, status: int, reason: str, *,
                     close: bool, head_only: bool = False) -> None:
        self.stats.rejected += 1
        body = json.dumps({"error": reason}).encode()
        await self._write(writer, render(status, body, [("Content-Type", "application/json"),
                                                        *security_headers()],
                                         close=close, head_only=head_only))

    async def _stream(self, writer: asyncio.StreamWriter, answer: Stream,
                      head_only: bool) -> None:
        chunks = answer.chunks
        if self._streams >= self.limits.max_streams:
            await chunks.aclose()
            await self._error(writer, 503, f"{self.limits.max_streams} {answer.busy}",
                              close=True)
            return
        self._streams += 1
        try:
            await self._write(writer, render(
                answer.status, b"", [("Content-Type", answer.content_type),
                                     *security_headers()],
                close=True, length=False))
            if head_only:
                return
            async for chunk in chunks:
                await self._write(writer, chunk)
        finally:
            self._streams -= 1
            await chunks.aclose()

    # -- for the application -----------------------------------------------------------

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the blocking ``fn(*args)`` on the server's worker threads; raises Busy when
        ``max_pending`` calls already wait there."""
        if self._pending >= self.limits.max_pending:
            raise Busy(f"{self.limits.max_pending} requests are waiting on the queen "
                       "already: try again shortly")
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            self._pending -= 1


__all__ = ["App", "Busy", "Request", "Response", "Stats", "Stream", "WebServer",
           "json_response"]
