"""What foragers and clients share: one I/O thread owning a DEALER, hello/welcome, heartbeats.

Other threads never touch the socket: they append to ``_outbox`` and poke the waker.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from . import protocol as p
from ._waker import Waker
from .errors import MeshantError, QueenUnreachable, Refused

log = logging.getLogger("meshant")

FEATURES = ["batch", "progress", "blobs"]
HELLO_RETRY = 2.0
# Plain ints: pyzmq's enum flags cost microseconds per operation on the hot path.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def default_name(role: str) -> str:
    return f"{role}-{socket.gethostname().split('.')[0]}-{os.getpid()}-{secrets.token_hex(2)}"


def resolve_queen(queen: str | None) -> str:
    """The queen endpoint: the argument, else ``$MESHANT_QUEEN``, else the default."""
    return queen or os.environ.get("MESHANT_QUEEN") or "tcp://127.0.0.1:5670"


class Peer:
    role = "peer"

    def __init__(self, queen: str | None, name: str | None,
                 context: zmq.Context[Any] | None) -> None:
        self.queen = resolve_queen(queen)
        self.name = name or default_name(self.role)
        if not p.valid_name(self.name):
            raise ValueError(f"invalid name {self.name!r}: use letters, digits and '._:@-'")
        self.welcome: dict[str, Any] = {}
        self.features: frozenset[str] = frozenset()
        self._ctx = context or zmq.Context.instance()
        self._outbox: deque[p.Message] = deque()
        self._waker = Waker()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._welcomed = threading.Event()
        self._refusal: MeshantError | None = None
        self._thread: threading.Thread | None = None
        self._hello_id = ""
        self._last_send = 0.0
        self._next_hello = 0.0
        self._io_ident = -1
        self._last_hb = 0.0
        self._hb_interval = 1.0
        self._handlers: dict[str, Callable[[p.Message], None]] = {
            "welcome": self._on_welcome,
            "error": self._on_error,
        }

    # -- lifecycle ------------------------------------------------------------------------

    def _start_io(self, timeout: float | None) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.role} already started")
        self._stopped.clear()
        self._thread = threading.Thread(target=self._io_main, name=f"meshant-{self.role}",
                                        daemon=True)
        self._thread.start()
        if timeout is None:
            return
        if not self._welcomed.wait(timeout) or self._refusal is not None:
            err = self._refusal
            self.close()
            if err is not None:
                raise err
            raise QueenUnreachable(
                f"no answer from the queen at {self.queen} within {timeout:g} s: is it "
                "running, and is the endpoint right? (set --queen or MESHANT_QUEEN)")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the I/O thread and close the socket (idempotent)."""
        self._stopping.set()
        self._waker.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    @property
    def connected(self) -> bool:
        return self._welcomed.is_set()

    def send_message(self, msg: p.Message) -> None:
        """Queue a message for the I/O thread; safe from any thread."""
        self._outbox.append(msg)
        if threading.get_ident() != self._io_ident:
            # The I/O thread flushes its outbox every turn; only others must wake it.
            self._waker.wake()

    # -- the I/O thread -------------------------------------------------------------------

    def _hello_body(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "versions": [p.binary.VERSION],
                "codecs": ["msgpack"], "features": FEATURES, "host": socket.gethostname(),
                "pid": os.getpid()}

    def _hb_body(self) -> dict[str, Any]:
        return {}

    def _next_timer(self) -> float:
        """When the I/O loop must wake up next, with nothing to read."""
        return self._next_hb()

    def _on_timers(self, now: float) -> None:
        pass

    def _next_hb(self) -> float:
        """When the next heartbeat is due: any message counts, so idle peers only."""
        return self._last_send + self._hb_interval

    def _open_socket(self) -> zmq.Socket[Any]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.connect(self.queen)
        self._sock = sock
        return sock

    def _io_main(self) -> None:
        self._io_ident = threading.get_ident()
        sock = self._open_socket()
        try:
            self._io_loop(sock)
        except Exception:
            log.exception("%s %s: I/O thread failed", self.role, self.name)
        finally:
            self._io_closing(sock)
            sock.close()
            self._waker.close()
            self._stopped.set()
            self._welcomed.set()  # nobody waits forever for a welcome that cannot come

    def _io_closing(self, sock: zmq.Socket[Any]) -> None:
        if self._welcomed.is_set() and self._refusal is None:
            try:
                # Tell the queen at once rather than let it wait out our heartbeats.
                self._send_now(p.Message("hb", {"state": "leaving"}, to="queen"))
            except zmq.ZMQError:
                pass

    def _say_hello(self) -> None:
        msg = p.Message("hello", self._hello_body(), frm=self.name, to="queen", ts=time.time())
        self._hello_id = msg.id
        self._next_hello = time.monotonic() + HELLO_RETRY
        self._send_now(msg)

    def _send_now(self, msg: p.Message) -> None:
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = time.time()
        frames = p.binary.encode(msg)
        if len(frames) == 1:
            self._sock.send(frames[0])
        else:
            # Large blob frames go out zero-copy; small frames are cheaper copied.
            send = self._sock.send
            last = len(frames) - 1
            for i, f in enumerate(frames):
                send(f, zmq.SNDMORE if i < last else 0, copy=len(f) < 65536)
        self._last_send = time.monotonic()

    def _next_wakeup(self) -> float:
        return self._next_timer() if self._welcomed.is_set() else self._next_hello

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        """Read and dispatch what the socket holds, without blocking."""
        handlers = self._handlers
        recv = sock.recv_multipart
        events = sock.getsockopt
        for _ in range(1000):
            if not events(_EVENTS) & _POLLIN:
                break
            frames = recv()
            try:
                msg = p.binary.decode(frames)
            except p.ProtocolError as e:
                log.warning("%s: bad message from the queen: %s", self.name, e)
                continue
            h = handlers.get(msg.kind)
            if h is not None:
                h(msg)

    def _timers(self, now: float) -> None:
        if not self._welcomed.is_set():
            if now >= self._next_hello:
                self._say_hello()
            return
        self._on_timers(now)
        if now >= self._next_hb():
            self._send_now(p.Message("hb", self._hb_body(), to="queen"))
            self._last_hb = self._last_send

    def _io_loop(self, sock: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        self._say_hello()
        outbox = self._outbox
        while not self._stopping.is_set():
            wait = self._next_wakeup() - time.monotonic()
            events = dict(poller.poll(max(0.0, wait) * 1000))
            if sock in events:
                self._receive(sock)
            if self._waker.fd in events:
                self._waker.drain()
            if outbox and self._welcomed.is_set():
                self._flush(outbox)
            self._timers(time.monotonic())

    def _flush(self, outbox: deque[p.Message]) -> None:
        while outbox:
            self._send_now(outbox.popleft())

    def _on_welcome(self, msg: p.Message) -> None:
        if msg.ref != self._hello_id:
            return
        self.welcome = msg.b
        self.name = msg.b.get("name", self.name)
        self.features = frozenset(msg.b.get("features", ()))
        self._hb_interval = float(msg.b["hb_interval"])
        self._welcomed.set()
        self._after_welcome()

    def _after_welcome(self) -> None:
        pass

    def _on_error(self, msg: p.Message) -> None:
        code = msg.b["code"]
        if code == "not-registered":
            # The queen does not know us (it restarted, or forgot an idle client):
            # introduce ourselves again, then resend what was refused.
            self._refused_unregistered(msg.ref)
            if self._welcomed.is_set():
                log.info("%s: the queen forgot us; saying hello again", self.name)
                self._welcomed.clear()
                self._say_hello()
            return
        if msg.ref is not None and msg.ref == self._hello_id:
            self._refusal = Refused(f"the queen refused {self.role} {self.name!r}: "
                                    f"{msg.b['message']}", code=code)
            self._stopping.set()
            self._welcomed.set()
            return
        self._on_remote_error(msg)

    def _refused_unregistered(self, ref: str | None) -> None:
        pass

    def _on_remote_error(self, msg: p.Message) -> None:
        log.warning("%s: queen says %s: %s", self.name, msg.b["code"], msg.b["message"])
