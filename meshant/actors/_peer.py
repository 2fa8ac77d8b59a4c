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
import random
import re
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from meshant import protocol as p
from meshant.actors._waker import Waker
from meshant.actors._zmqio import EVENTS as _EVENTS
from meshant.actors._zmqio import POLLIN as _POLLIN
from meshant.actors._zmqio import recv_frames, send_frames
from meshant.actors.colony_memory import Memory
from meshant.core.heartbeat import HeartbeatMonitor
from meshant.edges.security import client_socket, load_public, load_secret
from meshant.errors import ConfigError, MeshantError, QueenUnreachable, Refused
from meshant.protocol.topics import HB_TOPIC, MEM_TOPIC, USER_PREFIX, valid_topic

log = logging.getLogger("meshant")

FEATURES = ["batch", "progress", "blobs", "mem.sync", "broadcast"]
BACKOFF_FIRST = 0.25
BACKOFF_CAP = 5.0
NAME_WAIT = 60.0  # the longest a restarted peer waits for its old self to be declared offline



def default_name(role: str) -> str:
    return f"{role}-{socket.gethostname().split('.')[0]}-{os.getpid()}-{secrets.token_hex(2)}"


def resolve_queen(queen: str | None) -> str:
    """The queen endpoint: the argument, else ``$MESHANT_QUEEN``, else the default."""
    return queen or os.environ.get("MESHANT_QUEEN") or "tcp://127.0.0.1:5670"


_ENDPOINT_RE = re.compile(
    r"^(?:(?:tcp|ws|wss)://(?:\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?:\d{1,5}|\*)(?:/\S*)?"
    r"|(?:ipc|inproc)://\S+|(?:pgm|epgm|udp|vmci)://\S+)$")


def check_endpoint(endpoint: str, what: str = "queen endpoint") -> str:
    """``endpoint`` if it is a ZeroMQ endpoint this peer can connect to, else ConfigError
    naming what is wrong (libzmq would only say "Invalid argument", from another thread)."""
    if not isinstance(endpoint, str) or not _ENDPOINT_RE.match(endpoint):
        raise ConfigError(
            f"{what} {endpoint!r} is not a ZeroMQ endpoint: use tcp://HOST:PORT (e.g. "
            "tcp://127.0.0.1:5670), ipc:///path/to/socket or inproc://name")
    if endpoint.startswith(("tcp://", "ws://", "wss://")):
        port = endpoint.rsplit(":", 1)[1].split("/", 1)[0]
        if port != "*" and not 0 < int(port) < 65536:
            raise ConfigError(f"{what} {endpoint!r}: the port must be 1-65535")
    return endpoint


def pub_endpoint_for(pub: str, queen: str) -> str:
    """The PUB endpoint to connect to: a wildcard host is replaced by the queen's host."""
    scheme, _, rest = pub.partition("://")
    if scheme != "tcp":
        return pub
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::", ""):
        qhost = queen.partition("://")[2].rpartition(":")[0]
        return f"tcp://{qhost}:{port}" if qhost else pub
    return pub


def _size_n(n: int) -> str:
    return f"{n:,} bytes" if n < 1024 * 1024 else f"{n:,} bytes ({n / 1048576:.1f} MiB)"


def _size(frames: list[bytes]) -> str:
    return _size_n(max(len(f) for f in frames))


def backoff(attempt: int) -> float:
    """Delay before reconnect attempt ``attempt`` (0-based): exponential, capped, jittered."""
    return min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** attempt) * random.uniform(0.5, 1.0)


class Peer:
    role = "peer"

    def __init__(self, queen: str | None, name: str | None,
                 context: zmq.Context[Any] | None, colony: str | None = None,
                 discover: bool | None = None, curve_secret: str | None = None,
                 queen_key: str | None = None) -> None:
        if discover is None:
            discover = queen is None and not os.environ.get("MESHANT_QUEEN")
        self.colony = colony or os.environ.get("MESHANT_COLONY") or None
        self._follower: Any = None
        self.queen = "" if discover else check_endpoint(resolve_queen(queen))
        # CURVE: our keypair, and the queen's public key (pinned, or learnt from discovery).
        curve_secret = curve_secret or os.environ.get("MESHANT_CURVE_SECRET") or None
        queen_key = queen_key or os.environ.get("MESHANT_QUEEN_KEY") or None
        self._curve = load_secret(curve_secret) if curve_secret else None
        self._queen_key = load_public(queen_key) if queen_key else None
        if self._queen_key is not None and self._curve is None:
            raise ValueError("--queen-key needs --curve-secret: this peer's own key pair")
        if self._curve is not None and self._queen_key is None and not discover:
            raise ValueError("--curve-secret needs --queen-key (the queen's public key), "
                             "unless the queen is found by discovery")
        self.name = name or default_name(self.role)
        if not p.valid_name(self.name):
            raise ValueError(f"invalid name {self.name!r}: use letters, digits and '._:@-'")
        self.welcome: dict[str, Any] = {}
        self.features: frozenset[str] = frozenset()
        self.epoch = ""
        self.reconnects = 0
        # The queen's largest message (its welcome says; 64 MiB until then): checked here,
        # before sending, so an oversized message fails clearly and never reaches libzmq's
        # own limit, which would silently drop the connection.
        self.max_message = 64 * 1024 * 1024
        self._died: MeshantError | None = None
        self._wait_since = 0.0
        self._next_wait_log = 0.0
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
        self._hello_id = ""
        self._hello_attempt = 0
        self._name_retried = False
        self._last_send = 0.0
        self._next_hello = 0.0
        self._io_ident = -1
        self._last_hb = 0.0
        self._hb_interval = 1.0
        self._queen_mon: HeartbeatMonitor | None = None
        self._poller = zmq.Poller()
        self._sock: zmq.Socket[Any] | None = None
        self._sub: zmq.Socket[Any] | None = None
        self._sub_endpoint = ""
        self._topics: set[bytes] = {HB_TOPIC}
        self._subs: list[tuple[str, Callable[[str, Any, p.Message], Any]]] = []
        self.memory = Memory(self)
        self._handlers: dict[str, Callable[[p.Message], None]] = {
            "welcome": self._on_welcome,
            "error": self._on_error,
            "mem.sync": self.memory.on_reply,
        }

    # -- lifecycle ------------------------------------------------------------------------

    def _find_queen(self, timeout: float | None) -> None:
        """Discovery mode: wait (here, not in the I/O loop) for the colony's queen."""
        if self.queen:
            return
        from meshant.edges.discovery import Follower, env_interfaces

        if self._follower is None:
            self._follower = Follower(self.colony, env_interfaces())
        try:
            rec = self._follower.first(timeout if timeout is not None else 3600.0)
            self._check_queen_key(rec)
        except MeshantError:
            self._follower.close()
            self._follower = None
            raise
        self.queen = rec.router
        log.info("%s: found queen %r of colony %r at %s", self.name, rec.name, rec.colony,
                 rec.router)

    def _check_queen_key(self, rec: Any) -> None:
        """A discovered queen must prove the key we pinned; one with another key is refused."""
        if self._curve is None:
            return
        advertised = rec.curve.encode() if rec.curve else None
        if self._queen_key is None:
            if advertised is None:
                raise MeshantError(f"the queen at {rec.router} advertises no CURVE key, but "
                                   "this peer has one: give --queen-key", code="bad-key")
            self._queen_key = advertised  # trust on first use, from the TXT record
        elif advertised != self._queen_key:
            raise MeshantError(
                f"refusing the queen of colony {rec.colony!r} at {rec.router}: it advertises "
                f"the CURVE key {rec.curve or '(none)'}, not the pinned --queen-key "
                "(a rogue or reconfigured queen)", code="wrong-queen-key")

    def _follow_queen(self) -> None:
        """(I/O thread) A discovering peer follows its queen to a new address."""
        if self._follower is None:
            return
        rec = self._follower.current()
        if rec is not None and rec.router != self.queen:
            try:
                self._check_queen_key(rec)
            except MeshantError as e:
                log.error("%s: %s", self.name, e)
                return
            log.info("%s: the queen moved to %s", self.name, rec.router)
            self.queen = rec.router
            self._sub_endpoint = ""
            self._open_socket()
            self._say_hello()

    def _start_io(self, timeout: float | None) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.role} already started")
        self._find_queen(timeout)
        self._stopped.clear()
        self._waiting(time.monotonic())
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

    def _unreachable(self, timeout: float) -> QueenUnreachable:
        hint = ("is it running, and is the endpoint right? (set --queen or MESHANT_QUEEN)")
        if self._curve is not None:
            hint = ("CURVE is on: a wrong --queen-key, or a key the queen has not authorized, "
                    "looks exactly like this (the handshake fails silently); check both, "
                    "and that the queen is running")
        return QueenUnreachable(
            f"no answer from the queen at {self.queen} within {timeout:g} s: {hint}")

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
        self.send_message(p.Message("broadcast", {"topic": topic, "data": data}, to="queen"))

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
                "codecs": ["msgpack"], "features": FEATURES, "host": socket.gethostname(),
                "pid": os.getpid(), "session": self._session}

    def _hb_body(self) -> dict[str, Any]:
        return {}

    def _next_timer(self) -> float:
        """When the I/O loop must wake up next, with nothing to read."""
        t = self._next_hb()
        if self._queen_mon is not None:
            d = self._queen_mon.next_deadline()
            if d is not None:
                t = min(t, d)
        return t

    def _on_timers(self, now: float) -> None:
        pass

    def _next_hb(self) -> float:
        """When the next heartbeat is due: any message counts, so idle peers only."""
        return self._last_send + self._hb_interval

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
        sock = self._ctx.socket(zmq.DEALER)
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
        sub = self._ctx.socket(zmq.SUB)
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
                                  f"{type(e).__name__}: {e}", code="io-failed")

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

    def _say_hello(self) -> None:
        msg = p.Message("hello", self._hello_body(), frm=self.name, to="queen", ts=time.time())
        self._hello_id = msg.id
        self._next_hello = time.monotonic() + backoff(self._hello_attempt)
        self._hello_attempt += 1
        self._send_now(msg)

    def _encode(self, msg: p.Message) -> list[bytes]:
        """The message's frames; ProtocolError ``too-large`` if one is over the queen's
        limit (naming both sizes), or if the body cannot be encoded."""
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = time.time()
        frames = p.binary.encode(msg)
        limit = self.max_message
        for f in frames:
            if len(f) > limit:
                raise p.ProtocolError(
                    p.errors.TOO_LARGE, f"the {msg.kind} message is {_size(frames)}, over the "
                    f"queen's limit of {_size_n(limit)} (its --max-message)")
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
        self._last_send = time.monotonic()
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
        events = sock.getsockopt
        mon = self._queen_mon
        for _ in range(1000):
            if not events(_EVENTS) & _POLLIN:
                break
            frames = recv_frames(sock)
            try:
                msg = p.binary.decode(frames)
            except p.ProtocolError as e:
                log.warning("%s: bad message from the queen: %s", self.name, e)
                continue
            if mon is not None:
                mon.beat("queen", time.monotonic())
            h = handlers.get(msg.kind)
            if h is not None:
                h(msg)

    def _receive_pub(self, sub: zmq.Socket[Any]) -> None:
        events = sub.getsockopt
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
        epoch = msg.b.get("epoch")
        if not self._welcomed.is_set() or self._queen_mon is None:
            return
        if epoch and epoch != self.epoch:
            self._lose_queen(time.monotonic(), f"the queen restarted (epoch {epoch})")
            return
        self._queen_mon.beat("queen", time.monotonic())
        seq = msg.b.get("mem_seq")
        if isinstance(seq, int) and self.memory._enabled:
            self.memory.on_queen_seq(seq)

    def _waiting(self, now: float) -> None:
        """Start counting how long we wait for the queen (said at growing intervals)."""
        self._wait_since = now
        self._next_wait_log = now + 2.0

    def _say_waiting(self, now: float) -> None:
        waited = now - self._wait_since
        where = self.queen or f"colony {self.colony or 'default'}"
        log.warning("%s: still waiting for the queen at %s (%.0f s so far): is it running, "
                    "and is the endpoint right? (--queen or MESHANT_QUEEN)", self.name,
                    where, waited)
        self._next_wait_log = now + min(60.0, max(2.0, waited))

    def _lose_queen(self, now: float, why: str) -> None:
        """The queen is dead or restarted: reconnect on a fresh DEALER and hello again."""
        log.warning("%s: %s; reconnecting", self.name, why)
        self._waiting(now)
        self._welcomed.clear()
        self._queen_mon = None
        self.reconnects += 1
        self._hello_attempt = 0
        self._open_socket()
        self._queen_lost(now, why)
        self._say_hello()

    # -- the loop -------------------------------------------------------------------------

    def _next_wakeup(self) -> float:
        if self._welcomed.is_set():
            return self._next_timer()
        return min(self._next_hello, self._next_wait_log)

    def _timers(self, now: float) -> None:
        if not self._welcomed.is_set():
            if now >= self._next_wait_log and self._refusal is None:
                self._say_waiting(now)
            if now >= self._next_hello and self._refusal is None:
                moved = self._follower.current() if self._follower is not None else None
                if moved is not None and moved.router != self.queen:
                    self._follow_queen()
                else:
                    if self._curve is not None and self._hello_attempt > 0:
                        # A CURVE handshake the queen refused is not retried by libzmq:
                        # a fresh connection is (the key may be authorized by now).
                        self._open_socket()
                    self._say_hello()
            self._on_timers(now)
            return
        mon = self._queen_mon
        if mon is not None and mon.check(now):
            self._lose_queen(now, f"no sign of life from the queen for "
                             f"{mon.timeout:g} s")
            return
        self._on_timers(now)
        if now >= self._next_hb() and self._send_now(
                p.Message("hb", self._hb_body(), to="queen")):
            self._last_hb = self._last_send

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
        self._say_hello()
        while not self._stopping.is_set():
            wait = self._next_wakeup() - time.monotonic()
            if self._outbox and self._welcomed.is_set():
                wait = min(wait, 0.05)  # the pipe was full: try again soon
            events = dict(poller.poll(max(0.0, wait) * 1000))
            if waker_fd in events:
                self._waker.drain()
            self._turn(events)

    # -- handlers -------------------------------------------------------------------------

    def _on_welcome(self, msg: p.Message) -> None:
        if msg.ref != self._hello_id:
            return  # the answer to an older hello
        b = msg.b
        first = not self.welcome
        new_epoch = b["epoch"] != self.epoch
        self.welcome = b
        self.name = b.get("name", self.name)
        self.features = frozenset(b.get("features", ()))
        self.epoch = b["epoch"]
        self._hb_interval = float(b["hb_interval"])
        limit = b.get("max_message")
        if isinstance(limit, int) and limit > 0:
            self.max_message = limit
        if self.reconnects or self._hello_attempt > 1:
            log.info("%s: welcomed by the queen at %s", self.name, self.queen)
        self._hello_attempt = 0
        self._name_retried = False
        now = time.monotonic()
        self._queen_mon = HeartbeatMonitor(self._hb_interval, int(b["hb_misses"]))
        self._queen_mon.add("queen", now)
        self._open_sub(str(b.get("pub") or ""))
        self._welcomed.set()
        self.memory.on_welcome(new_epoch and not first)
        self._after_welcome(first)

    def _on_error(self, msg: p.Message) -> None:
        code = msg.b["code"]
        if code == "not-registered":
            # The queen does not know us (it restarted, or forgot an idle client):
            # introduce ourselves again, then resend what was refused.
            self._refused_unregistered(msg.ref)
            if self._welcomed.is_set():
                log.info("%s: the queen forgot us; saying hello again", self.name)
                self._welcomed.clear()
                self._hello_attempt = 0
                self._say_hello()
            return
        if msg.ref is not None and msg.ref == self._hello_id:
            retry = msg.b.get("retry_after")
            if code == "rate-limited" and isinstance(retry, int | float):
                self._next_hello = time.monotonic() + float(retry)
                self._hello_id = ""
                return
            if code == "name-taken" and isinstance(retry, int | float) and (
                    not self._name_retried and retry <= NAME_WAIT):
                # The name's holder (perhaps our own previous life) may be dead but not yet
                # declared offline: ask once more when it would be. A live holder still
                # has it then, and that second refusal is final.
                self._name_retried = True
                log.info("%s: name still held; asking again in %.1f s", self.name, retry)
                self._next_hello = time.monotonic() + float(retry)
                self._hello_id = ""
                return
            self._refusal = Refused(f"the queen refused {self.role} {self.name!r}: "
                                    f"{msg.b['message']}", code=code)
            self._stopping.set()
            self._welcomed.set()
            return
        if self.memory.on_error(msg):
            return
        self._on_remote_error(msg)

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
