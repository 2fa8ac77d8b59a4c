"""An HTTP/1.1 server on one asyncio thread, bounded every way its :class:`Limits` say.

One event loop serves every connection: no thread per connection, so a flood of sockets
costs descriptors and a little memory (both capped), never threads. A connection that
has not sent a whole request is a socket and a buffer read by a selector callback, with
no task, transport or stream of its own: idle and half-sent connections cost the
server's thread a few microseconds each. A complete request gets a task, which the
application's answer runs in; blocking work the application needs (a lookup that waits
on the queen) goes to a pool of two threads, at most ``max_pending`` queued for it.

A connection that has not finished sending a request is *waiting*: timed by
``header_timeout``, ``body_timeout`` and ``idle_timeout`` (one sweep of the waiting
connections a fraction of a second), and evictable. At ``max_connections``, a new
connection replaces the oldest waiting one, so connections that hold a slot without
asking anything cannot keep a scraper or a supervisor out; when every connection is
being answered, the new one gets 503. New connections are accepted at most
``accept_rate`` a second; the kernel's backlog holds the rest.

The application is two methods (:class:`~.app.App`): which :class:`~.policy.Access` a
request needs, and its answer. The :class:`~.policy.Policy` is applied between the two,
before a body is read.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshant.adapters.web.app import App, Busy, Request, Response, Stream, json_response
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
RECV = 65536
PAUSE = 0.05  # seconds accepting pauses at least, once past the accept rate
REFUSING = 64  # closed connections lingering at once (each reads what came, then closes)
LINGER = 0.25  # seconds a closed connection lingers
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(eq=False, slots=True)
class _Conn:
    sock: socket.socket
    peer: str
    deadline: float  # of what it is waiting for (the loop's clock)
    buf: bytearray = field(default_factory=bytearray)
    head: RequestHead | None = None  # parsed, its body still coming
    rights: Access = Access.PUBLIC
    body: int = 0  # the body's length
    idle: bool = False  # kept alive, waiting for the next request's first byte
    reading: bool = False  # registered with the selector
    task: asyncio.Task[None] | None = None  # answering a request


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
        self._lingering: set[socket.socket] = set()
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
        self._sweep()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            loop.remove_reader(self._sock)
            self._sock.close()
            tasks = [c.task for c in self._conns if c.task is not None]
            for c in list(self._conns):
                self._drop(c)
            for sock in self._lingering:
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
                # Waking for each token would cost more than the accepts: wait for a few.
                self._pause(max(PAUSE, (1 - self._tokens) / max(lim.accept_rate, 1e-3)))
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
                self.stats.refused += 1
                self._send_and_close(sock, self._full)
                return
            self.stats.evicted += 1
            self._drop(victim)
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}",
                     self._loop.time() + self.limits.header_timeout)
        self._conns[conn] = None
        self._wait(conn)

    def _wait(self, conn: _Conn) -> None:
        """``conn`` waits for (the rest of) a request: read, timed, evictable."""
        assert self._loop is not None
        self._waiting.pop(conn, None)
        self._waiting[conn] = None  # the newest waiter
        if not conn.reading:
            self._loop.add_reader(conn.sock, self._on_read, conn)
            conn.reading = True

    def _unwait(self, conn: _Conn) -> None:
        self._waiting.pop(conn, None)
        if conn.reading:
            assert self._loop is not None
            self._loop.remove_reader(conn.sock)
            conn.reading = False

    def _sweep(self) -> None:
        """Close the waiting connections whose time ran out."""
        assert self._loop is not None
        lim = self.limits
        now = self._loop.time()
        for conn in [c for c in self._waiting if c.deadline <= now]:
            self.stats.timeouts += 1
            if conn.buf or conn.head is not None:  # part of a request came: say why
                self._fail(conn, 408, "the request's " + ("head" if conn.head is None
                                                          else "body") + " took too long")
            else:
                self._drop(conn)
        if self._stop is not None and not self._stop.is_set():
            every = min(lim.header_timeout, lim.body_timeout, lim.idle_timeout) / 4
            self._loop.call_later(min(0.25, every), self._sweep)

    def _on_read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)  # the client closed
            return
        if conn.idle:  # idle until now: the head has its own time from here
            assert self._loop is not None
            conn.idle = False
            conn.deadline = self._loop.time() + self.limits.header_timeout
        conn.buf += data
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Parse what ``conn`` sent; once a request is whole, answer it in a task."""
        assert self._loop is not None
        lim = self.limits
        if conn.head is None:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > lim.max_head:
                    self._fail(conn, 431, f"the request's head is over {lim.max_head} bytes")
                return
            raw = bytes(conn.buf[:end])
            del conn.buf[:end + 4]
            try:
                head = parse_head(raw, lim)
            except HttpError as e:
                self._fail(conn, e.status, e.reason)
                return
            need = self.app.need("GET" if head.method == "HEAD" else head.method, head.path)
            verdict = self.policy.check(head.method, head.headers, need, head.version)
            n = head.content_length
            if not verdict.ok:
                # A body left unread would be taken for the next request: close instead.
                close = n > 0 or not head.keep_alive
                self._answer(conn, head, b"", Access.PUBLIC,
                             refusal=(verdict.status, verdict.reason, close))
                return
            if n > lim.max_body:
                self._fail(conn, 413, f"the body is over {lim.max_body} bytes")
                return
            conn.head, conn.rights, conn.body = head, verdict.rights, n
            conn.deadline = self._loop.time() + lim.body_timeout
        if len(conn.buf) < conn.body:
            return
        body = bytes(conn.buf[:conn.body])
        del conn.buf[:conn.body]
        head, conn.head = conn.head, None
        self._answer(conn, head, body, conn.rights)

    def _answer(self, conn: _Conn, head: RequestHead, body: bytes, rights: Access,
                refusal: tuple[int, str, bool] | None = None) -> None:
        assert self._loop is not None
        self._unwait(conn)
        conn.task = self._loop.create_task(self._respond(conn, head, body, rights, refusal))

    async def _respond(self, conn: _Conn, head: RequestHead, body: bytes, rights: Access,
                       refusal: tuple[int, str, bool] | None) -> None:
        head_only = head.method == "HEAD"
        keep = head.keep_alive
        try:
            if refusal is not None:
                status, reason, close = refusal
                keep = keep and not close
                self.stats.rejected += 1
                await self._write(conn, _error(status, reason, close=not keep,
                                               head_only=head_only))
            else:
                answer = await self._call(Request(head, body, rights, conn.peer))
                if isinstance(answer, Stream):
                    await self._stream(conn, answer, head_only)
                    conn.task = None
                    self._close(conn)
                    return
                await self._write(conn, render(
                    answer.status, answer.body,
                    [("Content-Type", answer.content_type), *answer.headers,
                     *security_headers(answer.content_type.startswith("text/html"))],
                    head_only=head_only, close=not keep))
        except (OSError, TimeoutError):
            conn.task = None
            self._drop(conn)
            return
        conn.task = None
        if not keep or conn not in self._conns:
            self._close(conn)
            return
        assert self._loop is not None
        conn.idle = not conn.buf
        conn.deadline = self._loop.time() + (self.limits.idle_timeout if conn.idle
                                             else self.limits.header_timeout)
        self._wait(conn)
        if conn.buf:
            self._advance(conn)  # a request that came while this one was answered

    async def _call(self, request: Request) -> Response | Stream:
        self.stats.served += 1
        try:
            return await self.app.handle(request)
        except Busy as e:
            return json_response(503, {"error": str(e)})
        except Exception:
            log.exception("HTTP: %s %s failed", request.head.method, request.head.path)
            return json_response(500, {"error": "internal error: see the server's log"})

    async def _write(self, conn: _Conn, data: bytes) -> None:
        assert self._loop is not None
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await self._loop.sock_sendall(conn.sock, data)
        except TimeoutError:
            self.stats.timeouts += 1  # a client that does not read its answer
            raise

    async def _stream(self, conn: _Conn, answer: Stream, head_only: bool) -> None:
        chunks = answer.chunks
        try:
            if self._streams >= self.limits.max_streams:
                self.stats.rejected += 1
                await self._write(conn, _error(503, f"{self.limits.max_streams} "
                                                    f"{answer.busy}", close=True))
                return
            self._streams += 1
            try:
                await self._write(conn, render(
                    answer.status, b"", [("Content-Type", answer.content_type),
                                         *security_headers()], close=True, length=False))
                if not head_only:
                    async for chunk in chunks:
                        await self._write(conn, chunk)
            finally:
                self._streams -= 1
        finally:
            await chunks.aclose()

    def _fail(self, conn: _Conn, status: int, reason: str) -> None:
        """Answer a request that cannot be served, and close."""
        self.stats.rejected += 1
        self._forget(conn)
        self._send_and_close(conn.sock, _error(status, reason, close=True))

    def _send_and_close(self, sock: socket.socket, data: bytes) -> None:
        """Send a short answer (best effort: never blocks) and close gracefully."""
        try:
            sock.send(data)
        except OSError:
            pass
        self._linger(sock)

    def _close(self, conn: _Conn) -> None:
        """Close after a whole answer."""
        self._forget(conn)
        self._linger(conn.sock)

    def _linger(self, sock: socket.socket) -> None:
        """Close a moment later, having read what the client sent by then: a socket
        closed with data unread resets, and the client may lose the answer."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= REFUSING:
            sock.close()  # past that, a flood gets its resets
            return
        assert self._loop is not None
        self._lingering.add(sock)
        self._loop.call_later(LINGER, self._close_lingering, sock)

    def _close_lingering(self, sock: socket.socket) -> None:
        self._lingering.discard(sock)
        try:
            while sock.recv(RECV):
                pass
        except OSError:
            pass
        sock.close()

    def _drop(self, conn: _Conn) -> None:
        """Forget ``conn`` and close it now, whatever it was doing."""
        self._forget(conn)
        task, conn.task = conn.task, None
        if task is not None and not task.done():
            task.cancel()
            # Closed once the task has let go of it (a task cancelled before it ran
            # never reaches its own clean-up).
            task.add_done_callback(lambda _: conn.sock.close())
        else:
            conn.sock.close()

    def _forget(self, conn: _Conn) -> None:
        self._conns.pop(conn, None)
        self._unwait(conn)

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


def _error(status: int, reason: str, *, close: bool, head_only: bool = False) -> bytes:
    return render(status, json.dumps({"error": reason}).encode(),
                  [("Content-Type", "application/json"), *security_headers()],
                  close=close, head_only=head_only)


__all__ = ["App", "Busy", "Request", "Response", "Stats", "Stream", "WebServer",
           "json_response"]
