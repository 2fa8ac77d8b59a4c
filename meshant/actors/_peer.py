"""What foragers and clients share: the connection to the queen.

One thread owns the sockets: a DEALER to the queen's ROUTER and a SUB to its PUB. It
carries out what the sans-IO :class:`~meshant.core.peers.peer_session.PeerSession` decides (say
hello, beat, reconnect on a fresh DEALER when the queen dies or restarts, follow a
standby's hint to the leader) and what the subclass's own session has to send. Other
threads never touch the sockets: they hand calls to the I/O thread (``call_soon``) and
poke the waker.
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
from meshant.actors._boundary import translated
from meshant.actors._endpoints import (
    _size,
    _size_n,
    check_endpoints,
    default_name,
    pub_endpoint_for,
    resolve_queen,
)
from meshant.actors._finder import QueenFinder
from meshant.actors._waker import Waker
from meshant.actors._zmqio import EVENTS as _EVENTS
from meshant.actors._zmqio import POLLIN as _POLLIN
from meshant.actors._zmqio import recv_frames, send_frames
from meshant.actors.colony_memory import Memory
from meshant.adapters.security import client_socket, load_public, load_secret
from meshant.core.peers import peer_session as ses
from meshant.core.peers.peer_session import PeerSession
from meshant.errors import ConfigError, MeshantError, Refused, TooLarge
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC, MEM_TOPIC, USER_PREFIX, valid_topic

log = logging.getLogger("meshant")

Item = p.Message | list[bytes]  # a message, or frames already encoded
Call = tuple[Callable[..., Any], tuple[Any, ...]]
FLUSH_ROUNDS = 16  # outbox slices sent per loop turn at most (see _flush)


class Peer:
    """A connection to the queen, run by one I/O thread (see the module's docstring)."""

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
        self._calls: deque[Call] = deque()
        self._waker = Waker()
        self._more = False  # the last flush stopped with the pipe still taking more
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
        # A direct client's: the caller's thread reads the socket until a condition holds.
        self.pump: Callable[[Callable[[], bool], float | None], None] | None = None
        self.memory = Memory(self)
        self._handlers: dict[str, Callable[[p.Message], object]] = {
            "welcome": self._on_welcome,
            "error": self._on_error,
            "hb": self._on_queen_hb,  # (the farewell comes this way too)
            "mem.sync": self.memory.on_reply,
        }

    def _settle(self, queen: str | None, name: str | None, colony: str | None,
                discover: bool | None, curve_secret: str | None, queen_key: str | None,
                follow_leader: bool) -> None:
        """The settings that locate, secure and name this peer: the constructor's, or a
        forager's ``configure`` before it starts."""
        if discover is None:
            discover = queen is None and not os.environ.get("MESHANT_QUEEN")
        self.colony = colony or os.environ.get("MESHANT_COLONY") or None
        # CURVE: our keypair, and the queen's public key (pinned, or learnt from discovery).
        curve_secret = curve_secret or os.environ.get("MESHANT_CURVE_SECRET") or None
        queen_key = queen_key or os.environ.get("MESHANT_QUEEN_KEY") or None
        self._curve = load_secret(curve_secret) if curve_secret else None
        pinned = load_public(queen_key) if queen_key else None
        if pinned is not None and self._curve is None:
            raise ConfigError("--queen-key needs --curve-secret: this peer's own key pair")
        if self._curve is not None and pinned is None and not discover:
            raise ConfigError("--curve-secret needs --queen-key (the queen's public key), "
                              "unless the queen is found by discovery")
        self.name = name or default_name(self.role)
        if not p.valid_name(self.name):
            raise ConfigError(f"invalid name {self.name!r}: use letters, digits and '._:@-'")
        # Several endpoints: a leader and its standbys (docs/ha.md), tried in turn.
        self.finder = QueenFinder([] if discover else check_endpoints(resolve_queen(queen)),
                                  name=self.name, colony=self.colony,
                                  curve=self._curve is not None, queen_key=pinned,
                                  follow_leader=follow_leader)
        # The lifecycle with the queen (hello, welcome, liveness, reconnects) is decided
        # by the sans-IO session; this class carries out what it says.
        self._sess = PeerSession(curve=self._curve is not None)

    @property
    def queen(self) -> str:
        """The queen's endpoint as this peer knows it now."""
        return self.finder.queen

    @property
    def queens(self) -> list[str]:
        """The endpoints it was given (a leader and its standbys)."""
        return self.finder.queens

    # -- lifecycle ------------------------------------------------------------------------

    @translated("the peer")
    def _start_io(self, timeout: float | None) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.role} already started")
        self.finder.find(timeout)
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
            raise self.finder.unreachable(timeout)

    @translated("the peer")
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

    def in_io_thread(self) -> bool:
        """Whether the caller is the thread that owns the sockets."""
        return threading.get_ident() == self._io_ident

    def send_message(self, msg: Item) -> None:
        """Queue a message (or its encoded frames) to the queen; safe from any thread."""
        self.call_soon(self._queue, msg)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the I/O thread (socket work from other threads goes
        through here); at once when called from it."""
        if threading.get_ident() == self._io_ident:
            fn(*args)
            return
        self._calls.append((fn, args))
        self._waker.wake()

    def broadcast(self, topic: str, data: Any = None) -> None:
        """Publish ``data`` under ``topic`` to every subscribed agent (one send at the queen)."""
        if not valid_topic(topic):
            raise ConfigError(f"topic {topic!r} is not allowed: use 1-200 characters of "
                              "A-Z a-z 0-9 . _ : / -")
        msg = p.Message("broadcast", {"topic": topic, "data": data}, to="queen")
        try:
            frames = self._encode(msg)
        except p.ProtocolError as e:
            raise p.LocalProtocolError(e.code, f"cannot broadcast on {topic!r}: "
                                       f"{e.message}") from None
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
            raise ConfigError(f"prefix {prefix!r} is not allowed")
        self._subs.append((prefix, fn))
        self.call_soon(self.listen, USER_PREFIX + prefix.encode())

    def _deliver_broadcast(self, fn: Callable[[str, Any, p.Message], Any], topic: str,
                           msg: p.Message) -> None:
        try:
            fn(topic, msg.b.get("data"), msg)
        except Exception:
            log.exception("%s: broadcast callback failed", self.name)

    def listen(self, topic: bytes) -> None:
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
        """The queen refused message ``ref`` as from an unregistered peer."""

    def _on_remote_error(self, msg: p.Message) -> None:
        log.warning("%s: queen says %s: %s", self.name, msg.b["code"], msg.b["message"])

    def _queue(self, item: Item) -> None:
        """(I/O thread) Put ``item`` in line for the queen (the subclass's session)."""
        raise NotImplementedError

    def _outgoing(self, now: float) -> list[Item]:
        """(I/O thread) What to send now, in order."""
        raise NotImplementedError

    def _unsent(self, items: list[Item]) -> None:
        """(I/O thread) The connection could not take these: first in line next time."""
        raise NotImplementedError

    def _sent(self, item: Item, now: float) -> None:
        """(I/O thread) ``item`` left."""

    def _unencodable(self, item: Item, e: p.ProtocolError) -> None:
        kind = item.kind if isinstance(item, p.Message) else "message"
        log.error("%s: cannot send a %s message: %s", self.name, kind, e.message)

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
        sock.connect(self.finder.queen)
        self.finder.connected_to = self.finder.queen
        self._sock = sock
        self._poller.register(sock, zmq.POLLIN)
        return sock

    def _secure(self, sock: zmq.Socket[Any]) -> None:
        key = self.finder.queen_key
        if self._curve is not None and key is not None:
            client_socket(sock, *self._curve, key)

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
        sub.connect(pub_endpoint_for(endpoint, self.finder.queen))
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
        self.finder.close()
        self._stopped.set()

    def _io_closing(self) -> None:
        if self._welcomed.is_set() and self._refusal is None and self._sock is not None:
            self._run_calls()
            self._flush(time.monotonic())  # what was queued before close() still goes out
            try:
                # Tell the queen at once rather than let it wait out our heartbeats.
                self._send_now(p.Message("hb", {"state": "leaving"}, to="queen"))
            except zmq.ZMQError:
                pass

    # -- sending --------------------------------------------------------------------------

    def _say_hello(self, now: float) -> None:
        msg = p.Message("hello", self._hello_body(), frm=self.name, to="queen", ts=time.time())
        self.finder.unanswered = True
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
                raise p.LocalProtocolError(
                    Code.TOO_LARGE, f"{_size(frames)}, over the queen's limit of "
                    f"{_size_n(limit)} (its --max-message), for a {msg.kind} message")
        return frames

    def _send_now(self, msg: Item) -> bool:
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

    def _flush(self, now: float) -> None:
        """Send what the session has for the queen, while the connection takes it."""
        self._more = False
        if not self._welcomed.is_set() or self._sock is None:
            return
        # The session hands out a backlog in slices (and an unsendable result comes back
        # as an error to send too); a turn sends FLUSH_ROUNDS of them at most, so a
        # handler streaming flat out cannot keep the loop from reading the queen.
        for _ in range(FLUSH_ROUNDS):
            items = self._outgoing(now)
            if not items:
                return
            for i, item in enumerate(items):
                try:
                    sent = self._send_now(item)
                except p.ProtocolError as e:
                    # What follows waits behind what replaces it (a batch split back,
                    # a failed result): nothing overtakes it.
                    self._unsent(items[i + 1:])
                    self._unencodable(item, e)
                    break
                if not sent:
                    self._unsent(items[i:])
                    return
                self._sent(item, now)
        self._more = True  # the pipe takes more: the next turn comes without a wait

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
        if isinstance(seq, int):
            self.memory.on_queen_seq(seq)

    def _act(self, now: float) -> None:
        """Carry out what the session decided, in order."""
        sess = self._sess
        finder = self.finder
        for a in sess.take():
            match a:
                case ses.Beat():
                    if self._send_now(p.Message("hb", self._hb_body(), to="queen")):
                        sess.sent(sess.last_send, beat=True)
                case ses.SayHello(fresh_connection=fresh):
                    where = finder.before_hello(fresh)
                    if where is not None:
                        if where == "moved":
                            self._sub_endpoint = ""  # the queen's PUB moved with it
                        self._open_socket()
                    self._say_hello(now)
                case ses.Redirect(leader=leader):
                    refusal = finder.redirect(leader)
                    if refusal is not None:
                        self._refusal = refusal
                        self._stopping.set()
                        self._welcomed.set()
                        return
                case ses.Welcomed(first=first, new_epoch=new_epoch):
                    if self._said_waiting:
                        # Said at the level the waiting was, so a person sees its end.
                        log.warning("%s: connected to the queen at %s", self.name,
                                    finder.queen)
                        self._said_waiting = False
                    elif sess.reconnects:
                        log.info("%s: welcomed by the queen at %s", self.name, finder.queen)
                    self._open_sub(str(sess.welcome.get("pub") or ""))
                    self._welcomed.set()
                    self.memory.on_welcome(new_epoch)
                    self._after_welcome(first)
                case ses.Lost(why=why):
                    log.warning("%s: %s; reconnecting", self.name, why)
                    self._welcomed.clear()
                    self._open_socket()
                    self._queen_lost(now, why)
                case ses.Forgotten():
                    log.info("%s: the queen forgot us; saying hello again", self.name)
                    self._welcomed.clear()
                case ses.Refused(code=code, message=message):
                    self._refusal = Refused(f"the queen refused {self.role} {self.name!r}: "
                                            f"{message}", code=code)
                    self._stopping.set()
                    self._welcomed.set()
                case ses.StillWaiting(waited=waited):
                    self._said_waiting = True
                    where = finder.queen or f"colony {self.colony or 'default'}"
                    log.warning("%s: still waiting for the queen at %s (%.0f s so far): is "
                                "it running, and is the endpoint right? (--queen or "
                                "MESHANT_QUEEN)", self.name, where, waited)

    # -- the loop -------------------------------------------------------------------------

    def _next_wakeup(self) -> float:
        return min(self._sess.next_deadline(self._busy()), self._next_timer())

    def _timers(self, now: float) -> None:
        self._sess.tick(now, self._busy())
        if self._sess.out:
            self._act(now)
        self._on_timers(now)

    def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            fn(*args)

    def _turn(self, events: dict[Any, int]) -> None:
        """One loop turn after a poll: read, run queued calls, timers, flush."""
        sock, sub = self._sock, self._sub
        if sock is not None and sock in events:
            self._receive(sock)
        if sub is not None and sub in events:
            self._receive_pub(sub)
        if self._calls:
            self._run_calls()
        now = time.monotonic()
        self._timers(now)
        self._flush(now)

    def _io_loop(self) -> None:
        poller = self._poller
        poller.register(self._waker.fd, zmq.POLLIN)
        waker_fd = self._waker.fd
        self._sess.start(time.monotonic())
        self._act(time.monotonic())
        while not self._stopping.is_set():
            wait = self._next_wakeup() - time.monotonic()
            if self._welcomed.is_set() and self._pending():
                # The pipe was full: try again soon; or a backlog is still going out.
                wait = 0.0 if self._more else min(wait, 0.05)
            events = dict(poller.poll(int(max(0.0, wait) * 1000)))
            if waker_fd in events:
                self._waker.drain()
            self._turn(events)

    def _pending(self) -> bool:
        """Whether something waits to be sent (the connection could not take it)."""
        return False

    # -- handlers -------------------------------------------------------------------------

    def _on_welcome(self, msg: p.Message) -> None:
        if msg.ref != self._sess.hello_id:
            return  # the answer to an older hello
        self.name = msg.b.get("name", self.name)
        self.finder.unanswered = False
        now = time.monotonic()
        self._sess.on_welcome(msg.ref, msg.b, now)
        self._act(now)

    def _on_error(self, msg: p.Message) -> None:
        b = msg.b
        code = b["code"]
        now = time.monotonic()
        if code == Code.NOT_REGISTERED:
            # The queen does not know us (it restarted, or forgot an idle client):
            # introduce ourselves again, then resend what was refused.
            self._refused_unregistered(msg.ref)
        if msg.ref is not None and msg.ref == self._sess.hello_id:
            self.finder.unanswered = False
        self.finder.error_body = b
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
