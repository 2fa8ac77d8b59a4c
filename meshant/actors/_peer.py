"""What foragers and clients share: the connection to the queen.

One thread owns the sockets: a DEALER to the queen's ROUTER and a SUB to its PUB. It says
hello, keeps the welcome's terms, sends heartbeats, watches the queen's heartbeats, and
reconnects (a fresh DEALER, bounded exponential backoff with jitter) when the queen dies
or restarts. Other threads never touch the sockets: they append to ``_outbox`` (or
``_calls``) and poke the waker.
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

from meshant import protocol as p
from meshant.actors._endpoints import _size, _size_n, pub_endpoint_for
from meshant.actors._finder import QueenFinder
from meshant.actors._waker import Waker
from meshant.actors._zmqio import EVENTS as _EVENTS
from meshant.actors._zmqio import POLLIN as _POLLIN
from meshant.actors._zmqio import recv_frames, send_frames
from meshant.actors.colony_memory import Memory
from meshant.adapters.security import client_socket
from meshant.core import session as ses
from meshant.errors import MeshantError, Refused, TooLarge
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC, MEM_TOPIC, USER_PREFIX, valid_topic

log = logging.getLogger("meshant")


class Peer(QueenFinder):
    role = "peer"

    def __init__(self, queen: str | None, name: str | None,
                 context: zmq.Context[Any] | None, colony: str | None = None,
                 discover: bool | None = None, curve_secret: str | None = None,
                 queen_key: str | None = None, follow_leader: bool = True) -> None:
        self._settle(queen, name, colony, discover, curve_secret, queen_key, follow_leader)
        self._died: MeshantError | None = None
        self._said_waiting = False
        # Proves to the queen that a reconnecting peer is the one that held its name.
        self._session = secrets.token_hex(16)
        self._ctx = context or zmq.Context.instance()
        # Messages, or frames already encoded (a client's submissions, kept for re-sending).
        self._outbox: deque[p.Message | list[bytes]] = deque()
        self._calls: deque[Callable[[], None]] = deque()
        self._waker = Waker()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._welcomed = threading.Event()
        self._refusal: MeshantError | None = None
        self._thread: threading.Thread | None = None
        self._io_ident = -1
        self._poller = zmq.Poller()
        self._sock: zmq.Socket[Any] | None = None
        self._sub: zmq.Socket[Any] | None = None
        self._sub_endpoint = ""
        self._topics: set[bytes] = {HB_TOPIC}
        self._subs: list[tuple[str, Callable[[str, Any, p.Message], Any]]] = []
        self.memory = Memory(self)
        self._handlers: dict[str, Callable[[p.Message], object]] = {
            "welcome": self._on_welcome,
            "error": self._on_error,
            "mem.sync": self.memory.on_reply,
        }

    # -- lifecycle ------------------------------------------------------------------------

    def _start_io(self, timeout: float | None) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.role} already started")
        self._find_queen(timeout)
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
            raise self._unreachable(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the I/O thread and close the sockets (idempotent)."""
        self._stopping.set()
        self._waker.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    @property
    def connected(self) -> bool:
        return self._welcomed.is_set()

    def send_message(self, msg: p.Message | list[bytes]) -> None:
        """Queue a message (or its encoded frames) for the I/O thread; safe from any
        thread."""
        self._outbox.append(msg)
        if threading.get_ident() != self._io_ident:
            # The I/O thread flushes its outbox every turn; only others must wake it.
            self._waker.wake()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the I/O thread (socket work from other threads goes through here)."""
        self._calls.append(fn)
        if threading.get_ident() != self._io_ident:
            self._waker.wake()

    def broadcast(self, topic: str, data: Any = None) -> None:
        """Publish ``data`` under ``topic`` to every subscribed agent (one send at the queen)."""
        if not valid_topic(topic):
            raise ValueError(f"topic {topic!r} is not allowed: use 1-200 characters of "
                             "A-Z a-z 0-9 . _ : / -")
        msg = p.Message("broadcast", {"topic": topic, "data": data}, to="queen")
        try:
            frames = self._encode(msg)
        except p.ProtocolError as e:
            raise ValueError(f"cannot broadcast on {topic!r}: {e.message}") from None
        size = sum(len(f) for f in frames)
        limit = self._sess.max_broadcast
        if size > limit:
            raise TooLarge(f"the broadcast on {topic!r} is {size:,} bytes, over the queen's "
                           f"limit of {limit:,} (its --max-broadcast): send large data as a "
                           "task payload or in colony memory")
        self.send_message(frames)

    def subscribe(self, prefix: str, fn: Callable[[str, Any, p.Message], Any]) -> None:
        """Call ``fn(topic, data, message)`` for each broadcast whose topic starts with
        ``prefix`` ("" for all)."""
        if prefix and not valid_topic(prefix):
            raise ValueError(f"prefix {prefix!r} is not allowed")
        self._subs.append((prefix, fn))
        self.call_soon(lambda: self._subscribe(USER_PREFIX + prefix.encode()))

    def _deliver_broadcast(self, fn: Callable[[str, Any, p.Message], Any], topic: str,
                           msg: p.Message) -> None:
        try:
            fn(topic, msg.b.get("data"), msg)
        except Exception:
            log.exception("%s: broadcast callback failed", self.name)

    def _subscribe(self, topic: bytes) -> None:
        """(I/O thread) Receive PUB messages whose topic starts with ``topic``."""
        if topic not in self._topics:
            self._topics.add(topic)
            if self._sub is not None:
                self._sub.setsockopt(zmq.SUBSCRIBE, topic)

    # -- what subclasses say --------------------------------------------------------------

    def _hello_body(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "versions": [p.binary.VERSION],
                "codecs": ["msgpack"], "features": list(p.negotiation.FEATURES),
                "host": socket.gethostname(),
                "pid": os.getpid(), "session": self._session}

    def _hb_body(self) -> dict[str, Any]:
        return {}

    def _next_timer(self) -> float:
        """When a subclass's own timers need the I/O loop, with nothing to read."""
        return float("inf")

    def _on_timers(self, now: float) -> None:
        pass

    def _busy(self) -> bool:
        """Whether the heartbeat must go every interval (it renews running tasks)."""
        return False

    def _after_welcome(self, first: bool) -> None:
        pass

    def _queen_lost(self, now: float, why: str) -> None:
        pass

    def _on_pub(self, topic: bytes, msg: p.Message) -> None:
        if topic == MEM_TOPIC:
            self.memory.on_update(msg.b)
        elif topic.startswith(USER_PREFIX):
            name = topic[len(USER_PREFIX):].decode("utf-8", "replace")
            for prefix, fn in self._subs:
                if name.startswith(prefix):
                    self._deliver_broadcast(fn, name, msg)

    def _refused_unregistered(self, ref: str | None) -> None:
        pass

    def _on_remote_error(self, msg: p.Message) -> None:
        log.warning("%s: queen says %s: %s", self.name, msg.b["code"], msg.b["message"])

    # -- sockets --------------------------------------------------------------------------

    def _open_socket(self) -> zmq.Socket[Any]:
        """A fresh DEALER (so a fresh identity on the queen's ROUTER), connected."""
        old = self._sock
        if old is not None:
            self._poller.unregister(old)
            old.close(0)
        sock: zmq.Socket[Any] = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        # ZMTP pings find a dead TCP peer even when nothing else is being sent. Rare: the
        # queen's own heartbeat tells us it is alive (we reconnect when it stops), and
        # each ping costs the queen's I/O thread a read and a write per peer.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 10_000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 30_000)
        self._secure(sock)
        sock.connect(self.queen)
        self._connected_to = self.queen
        self._sock = sock
        self._poller.register(sock, zmq.POLLIN)
        return sock

    def _secure(self, sock: zmq.Socket[Any]) -> None:
        if self._curve is not None and self._queen_key is not None:
            client_socket(sock, *self._curve, self._queen_key)

    def _open_sub(self, endpoint: str) -> None:
        if not endpoint or endpoint == self._sub_endpoint:
            return
        if self._sub is not None:
            self._poller.unregister(self._sub)
            self._sub.close(0)
        sub: zmq.Socket[Any] = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        for t in self._topics:
            sub.setsockopt(zmq.SUBSCRIBE, t)
        self._secure(sub)
        sub.connect(pub_endpoint_for(endpoint, self.queen))
        self._sub = sub
        self._sub_endpoint = endpoint
        self._poller.register(sub, zmq.POLLIN)

    def _close_sockets(self) -> None:
        for s in (self._sock, self._sub):
            if s is not None:
                try:
                    self._poller.unregister(s)
                except KeyError:
                    pass
                s.close()
        self._sock = self._sub = None

    def _io_main(self) -> None:
        self._io_ident = threading.get_ident()
        self._open_socket()
        try:
            self._io_loop()
        except Exception as e:
            log.exception("%s %s: I/O thread failed", self.role, self.name)
            self._io_died(e)
        finally:
            self._teardown()
            self._welcomed.set()  # nobody waits forever for a welcome that cannot come

    def _io_died(self, e: BaseException) -> None:
        """The I/O thread is gone: remember why, so callers are told instead of waiting."""
        self._died = MeshantError(f"the {self.role}'s I/O thread failed: "
                                  f"{type(e).__name__}: {e}", code=Code.IO_FAILED)

    def _teardown(self) -> None:
        """Say goodbye, close the sockets, the waker and discovery (in the owning thread)."""
        self._io_closing()
        self._close_sockets()
        self._waker.close()
        if self._follower is not None:
            self._follower.close()
        self._stopped.set()

    def _io_closing(self) -> None:
        if self._welcomed.is_set() and self._refusal is None and self._sock is not None:
            self._flush(self._outbox)  # what was queued before close() still goes out
            try:
                # Tell the queen at once rather than let it wait out our heartbeats.
                self._send_now(p.Message("hb", {"state": "leaving"}, to="queen"))
            except zmq.ZMQError:
                pass

    # -- sending --------------------------------------------------------------------------

    def _say_hello(self, now: float) -> None:
        msg = p.Message("hello", self._hello_body(), frm=self.name, to="queen", ts=time.time())
        self._unanswered = True
        self._send_now(msg)
        self._sess.hello_sent(msg.id, now)

    def _encode(self, msg: p.Message) -> list[bytes]:
        """The message's frames; ProtocolError ``too-large`` if one is over the queen's
        limit (naming both sizes), or if the body cannot be encoded."""
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = time.time()
        if "blobs" not in self._sess.features:  # not negotiated, not used (spec §5)
            msg.body = p.inline_blobs(msg.body)
        frames = p.binary.encode(msg)
        limit = self.max_message
        for f in frames:
            if len(f) > limit:
                raise p.ProtocolError(
                    Code.TOO_LARGE, f"{_size(frames)}, over the queen's limit of "
                    f"{_size_n(limit)} (its --max-message), for a {msg.kind} message")
        return frames

    def _send_now(self, msg: p.Message | list[bytes]) -> bool:
        """Send at once; False if the socket cannot take it now (then nothing was sent).
        Raises ProtocolError for a message that cannot be encoded or is too large."""
        frames = msg if isinstance(msg, list) else self._encode(msg)
        assert self._sock is not None
        try:
            send_frames(self._sock, frames)
        except zmq.Again:
            return False  # the pipe to the queen is full: the queen is gone or stalled
        self._sess.last_send = time.monotonic()
        return True

    def _flush(self, outbox: deque[p.Message | list[bytes]]) -> None:
        while outbox:
            msg = outbox.popleft()
            try:
                sent = self._send_now(msg)
            except p.ProtocolError as e:
                self._unsendable(msg, e)
                continue
            if not sent:
                outbox.appendleft(msg)
                return

    def _unsendable(self, msg: p.Message | list[bytes], e: p.ProtocolError) -> None:
        kind = msg.kind if isinstance(msg, p.Message) else "message"
        log.error("%s: cannot send a %s message: %s", self.name, kind, e.message)

    # -- receiving ------------------------------------------------------------------------

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        """Read and dispatch what the DEALER holds, without blocking."""
        handlers = self._handlers
        events: Callable[[int], int] = sock.getsockopt  # type: ignore[assignment]
        sess = self._sess
        now = time.monotonic()
        for _ in range(1000):
            if self._sock is not sock or not events(_EVENTS) & _POLLIN:
                break  # (a handler moved us to a fresh connection: the old one is closed)
            frames = recv_frames(sock)
            try:
                msg = p.binary.decode(frames)
            except p.ProtocolError as e:
                log.warning("%s: bad message from the queen: %s", self.name, e)
                continue
            sess.heard(now)
            h = handlers.get(msg.kind)
            if h is not None:
                h(msg)

    def _receive_pub(self, sub: zmq.Socket[Any]) -> None:
        events: Callable[[int], int] = sub.getsockopt  # type: ignore[assignment]
        for _ in range(1000):
            if not events(_EVENTS) & _POLLIN:
                break
            frames = recv_frames(sub)
            if len(frames) < 2:
                continue
            topic = frames[0]
            try:
                msg = p.binary.decode(frames[1:])
            except p.ProtocolError as e:
                log.warning("%s: bad broadcast from the queen: %s", self.name, e)
                continue
            if topic == HB_TOPIC:
                self._on_queen_hb(msg)
            else:
                self._on_pub(topic, msg)

    def _on_queen_hb(self, msg: p.Message) -> None:
        sess = self._sess
        if not sess.active:
            return
        now = time.monotonic()
        sess.on_queen_beat(msg.b.get("epoch"), now)
        if sess.out:
            self._act(now)
            return
        seq = msg.b.get("mem_seq")
        if isinstance(seq, int) and self.memory._enabled:
            self.memory.on_queen_seq(seq)

    def _act(self, now: float) -> None:
        """Carry out what the session decided, in order."""
        sess = self._sess
        for a in sess.take():
            cls = a.__class__
            if cls is ses.Beat:
                if self._send_now(p.Message("hb", self._hb_body(), to="queen")):
                    sess.sent(sess.last_send, beat=True)
            elif cls is ses.SayHello:
                self._before_hello(a.fresh_connection)  # type: ignore[union-attr]
                self._say_hello(now)
            elif cls is ses.Redirect:
                if not self._redirect(a.leader):  # type: ignore[union-attr]
                    return
            elif cls is ses.Welcomed:
                if self._said_waiting:
                    # Said at the level the waiting was, so a person sees the end of it.
                    log.warning("%s: connected to the queen at %s", self.name, self.queen)
                    self._said_waiting = False
                elif sess.reconnects:
                    log.info("%s: welcomed by the queen at %s", self.name, self.queen)
                self._open_sub(str(sess.welcome.get("pub") or ""))
                self._welcomed.set()
                self.memory.on_welcome(a.new_epoch)  # type: ignore[union-attr]
                self._after_welcome(a.first)  # type: ignore[union-attr]
            elif cls is ses.Lost:
                log.warning("%s: %s; reconnecting", self.name, a.why)  # type: ignore[union-attr]
                self._welcomed.clear()
                self._open_socket()
                self._queen_lost(now, a.why)  # type: ignore[union-attr]
            elif cls is ses.Forgotten:
                log.info("%s: the queen forgot us; saying hello again", self.name)
                self._welcomed.clear()
            elif cls is ses.Refused:
                self._refusal = Refused(f"the queen refused {self.role} {self.name!r}: "
                                        f"{a.message}", code=a.code)  # type: ignore[union-attr]
                self._stopping.set()
                self._welcomed.set()
            elif cls is ses.StillWaiting:
                self._said_waiting = True
                where = self.queen or f"colony {self.colony or 'default'}"
                log.warning("%s: still waiting for the queen at %s (%.0f s so far): is it "
                            "running, and is the endpoint right? (--queen or MESHANT_QUEEN)",
                            self.name, where, a.waited)  # type: ignore[union-attr]

    # -- the loop -------------------------------------------------------------------------

    def _next_wakeup(self) -> float:
        return min(self._sess.next_deadline(self._busy()), self._next_timer())

    def _timers(self, now: float) -> None:
        self._sess.tick(now, self._busy())
        if self._sess.out:
            self._act(now)
        self._on_timers(now)

    def _turn(self, events: dict[Any, int]) -> None:
        """One loop turn after a poll: read, run queued calls, flush, timers."""
        sock, sub = self._sock, self._sub
        if sock is not None and sock in events:
            self._receive(sock)
        if sub is not None and sub in events:
            self._receive_pub(sub)
        calls = self._calls
        while calls:
            calls.popleft()()
        if self._outbox and self._welcomed.is_set():
            self._flush(self._outbox)
        self._timers(time.monotonic())

    def _io_loop(self) -> None:
        poller = self._poller
        poller.register(self._waker.fd, zmq.POLLIN)
        waker_fd = self._waker.fd
        self._sess.start(time.monotonic())
        self._act(time.monotonic())
        while not self._stopping.is_set():
            wait = self._next_wakeup() - time.monotonic()
            if self._outbox and self._welcomed.is_set():
                wait = min(wait, 0.05)  # the pipe was full: try again soon
            events = dict(poller.poll(int(max(0.0, wait) * 1000)))
            if waker_fd in events:
                self._waker.drain()
            self._turn(events)

    # -- handlers -------------------------------------------------------------------------

    def _on_welcome(self, msg: p.Message) -> None:
        if msg.ref != self._sess.hello_id:
            return  # the answer to an older hello
        self.name = msg.b.get("name", self.name)
        self._unanswered = False
        now = time.monotonic()
        self._sess.on_welcome(msg.ref, msg.b, now)
        self._act(now)

    def _on_error(self, msg: p.Message) -> None:
        b = msg.b
        code = b["code"]
        if code == Code.NOT_REGISTERED:
            # The queen does not know us (it restarted, or forgot an idle client):
            # introduce ourselves again, then resend what was refused.
            self._refused_unregistered(msg.ref)
        now = time.monotonic()
        if msg.ref is not None and msg.ref == self._sess.hello_id:
            self._unanswered = False
        self._error_body = b
        if self._sess.on_error(msg.ref, code, b["message"], b.get("retry_after"), now,
                               b.get("leader")):
            if code == Code.NAME_TAKEN and not self._sess.out:
                log.info("%s: name still held; asking again in %s s", self.name,
                         b.get("retry_after"))
            self._act(now)
            return
        if self.memory.on_error(msg):
            return
        self._on_remote_error(msg)

    # -- the session's state, for subclasses and callers ----------------------------------

    @property
    def welcome(self) -> dict[str, Any]:
        """The queen's welcome: the negotiated terms (empty until welcomed)."""
        return self._sess.welcome

    @property
    def features(self) -> frozenset[str]:
        return self._sess.features

    @property
    def epoch(self) -> str:
        """The queen's epoch: a new one means it restarted."""
        return self._sess.epoch

    @property
    def reconnects(self) -> int:
        """How many times this peer lost its queen and reconnected."""
        return self._sess.reconnects

    @property
    def max_message(self) -> int:
        """The queen's largest message (its welcome says; 64 MiB until then): checked
        before sending, so an oversized message fails clearly and never reaches libzmq's
        own limit, which would silently drop the connection."""
        return self._sess.max_message

    # -- public state, read-only (for embedding code and the CLI) -------------------------

    @property
    def refusal(self) -> MeshantError | None:
        """Why the queen refused this peer for good (name taken, key not allowed...), or None."""
        return self._refusal

    @property
    def stopping(self) -> bool:
        """True once this peer was told to stop (or was refused, or drained)."""
        return self._stopping.is_set()

    def wait_welcomed(self, timeout: float | None = None) -> bool:
        """Wait until the queen welcomed this peer (or refused it: check ``refusal``)."""
        return self._welcomed.wait(timeout)
