"""What foragers and clients share: the connection to the queen.

One thread owns the sockets: a DEALER to the queen's ROUTER and a SUB to its PUB. What
goes over them, and when, is the sans-IO :class:`~meshant.core.peers.link.PeerLink`'s
(the same link the simulator drives): this class is its :class:`~meshant.core.peers.
link.Port` — it opens connections, sends frames, reads the clock, and tells the person
and the caller what the link says. Other threads never touch the sockets: they hand
calls to the I/O thread (``call_soon``) and poke the waker.
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
from meshant.core.peers.link import Item, PeerLink, Role
from meshant.core.peers.peer_session import PeerSession
from meshant.errors import ConfigError, MeshantError, Refused, TooLarge
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC, USER_PREFIX, valid_topic

log = logging.getLogger("meshant")

Call = tuple[Callable[..., Any], tuple[Any, ...]]
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_UNWELCOMED = PeerSession()  # (read only: the terms a peer has before any welcome)


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
        self._link: PeerLink | None = None  # made with the role's session (_make_link)

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

    def _make_link(self, role: Role) -> PeerLink:
        """The link to the queen, driving ``role`` (this peer's session), with this peer
        as its port."""
        self._link = PeerLink(role, _Port(self), self.name, self.finder.choice,
                              curve=self._curve is not None, memory=self.memory)
        return self._link

    @property
    def link(self) -> PeerLink:
        if self._link is None:
            raise RuntimeError(f"{self.role} {self.name!r} has not started")
        return self._link

    def _peer_session(self) -> PeerSession:
        """The session with the queen (before the link exists: one not yet welcomed,
        whose terms are the defaults)."""
        return self._link.sess if self._link is not None else _UNWELCOMED

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
        limit = self._peer_session().max_broadcast
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

    def _about(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(), "session": self._session}

    def _after_turn(self) -> None:
        """(I/O thread) After the link handled an event: the role's own actions."""

    def _queue(self, item: Item) -> None:
        """(I/O thread) Put ``item`` in line for the queen (the subclass's session)."""
        raise NotImplementedError


        # -- sockets --------------------------------------------------------------------------

    def _open_socket(self, endpoint: str) -> zmq.Socket[Any]:
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
        sock.connect(endpoint)
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
                self.link.send_now(p.Message("hb", {"state": "leaving"}, to="queen"))
            except (zmq.ZMQError, p.ProtocolError):
                pass

    # -- sending --------------------------------------------------------------------------

    def _encode(self, msg: p.Message) -> list[bytes]:
        """The message's frames (see :meth:`PeerLink.encode`)."""
        return self.link.encode(msg)

    def _flush(self, now: float) -> None:
        """Send what the session has for the queen, while the connection takes it."""
        if self._welcomed.is_set() and self._sock is not None:
            self.link.flush(now)
        else:
            self.link.more = False

    # -- receiving ------------------------------------------------------------------------

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        """Read and dispatch what the DEALER holds, without blocking."""
        events: Callable[[int], int] = sock.getsockopt  # type: ignore[assignment]
        link = self.link
        now = time.monotonic()
        for i in range(1000):
            # (The first is there: the poll saw it. Asking EVENTS costs 1.5 µs.)
            if i and (self._sock is not sock or not events(_EVENTS) & _POLLIN):
                break  # (a handler moved us to a fresh connection: the old one is closed)
            link.receive(recv_frames(sock), now)
            self._after_turn()

    def _receive_pub(self, sub: zmq.Socket[Any]) -> None:
        events: Callable[[int], int] = sub.getsockopt  # type: ignore[assignment]
        link = self.link
        for i in range(1000):
            if i and not events(_EVENTS) & _POLLIN:
                break  # (the first is there: the poll saw it)
            frames = recv_frames(sub)
            if len(frames) < 2:
                continue
            link.receive_pub(frames[0], frames[1:], time.monotonic())

    # -- the loop -------------------------------------------------------------------------

    def _timers(self, now: float) -> None:
        self.link.tick(now)
        self._after_turn()

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
        # What the messages and calls produced (an inline handler's result, a client's
        # submission) goes out before the timers run, off a round trip's path; what the
        # timers produce goes in the second flush.
        self._flush(now)
        self._timers(now)
        self._flush(now)

    def _io_loop(self) -> None:
        poller = self._poller
        poller.register(self._waker.fd, zmq.POLLIN)
        waker_fd = self._waker.fd
        link = self.link
        link.start(time.monotonic())
        while not self._stopping.is_set():
            wait = link.next_wakeup() - time.monotonic()
            if self._welcomed.is_set() and link.role.pending:
                # The pipe was full: try again soon; or a backlog is still going out.
                wait = 0.0 if link.more else min(wait, 0.05)
            events = dict(poller.poll(int(max(0.0, wait) * 1000)))
            if waker_fd in events:
                self._waker.drain()
            self._turn(events)

    # -- the session's state, for subclasses and callers ----------------------------------

    @property
    def welcome(self) -> dict[str, Any]:
        """The queen's welcome: the negotiated terms (empty until welcomed)."""
        return self._peer_session().welcome

    @property
    def features(self) -> frozenset[str]:
        return self._peer_session().features

    @property
    def epoch(self) -> str:
        """The queen's epoch: a new one means it restarted."""
        return self._peer_session().epoch

    @property
    def reconnects(self) -> int:
        """How many times this peer lost its queen and reconnected."""
        return self._peer_session().reconnects

    @property
    def max_message(self) -> int:
        """The queen's largest message (its welcome says; 64 MiB until then): checked
        before sending, so an oversized message fails clearly and never reaches libzmq's
        own limit, which would silently drop the connection."""
        return self._peer_session().max_message

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


class _Port:
    """The link's port (:class:`~meshant.core.peers.link.Port`) for a peer: what only
    this driver does — its sockets, its clock, its log and its caller."""

    __slots__ = ("peer",)

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def send(self, frames: list[bytes], item: Item) -> bool:
        assert self.peer._sock is not None
        try:
            send_frames(self.peer._sock, frames)
        except zmq.Again:
            return False  # the pipe to the queen is full: the queen is gone or stalled
        return True

    def wall(self) -> float:
        return time.time()

    def about(self) -> dict[str, Any]:
        return self.peer._about()

    def open(self, endpoint: str, why: str) -> None:
        if why == "moved":
            self.peer._sub_endpoint = ""  # the queen's PUB moved with it
        self.peer._open_socket(endpoint)

    def moved(self) -> str | None:
        return self.peer.finder.moved()

    def lost(self, why: str) -> None:
        log.warning("%s: %s; reconnecting", self.peer.name, why)
        self.peer._welcomed.clear()

    def welcomed(self, first: bool, new_epoch: bool, pub: str) -> None:
        if self.peer._said_waiting:
            # Said at the level the waiting was, so a person sees its end.
            log.warning("%s: connected to the queen at %s", self.peer.name, self.peer.finder.queen)
            self.peer._said_waiting = False
        elif self.peer.link.sess.reconnects:
            log.info("%s: welcomed by the queen at %s", self.peer.name, self.peer.finder.queen)
        self.peer._open_sub(pub)
        self.peer._welcomed.set()

    def forgotten(self) -> None:
        log.info("%s: the queen forgot us; saying hello again", self.peer.name)
        self.peer._welcomed.clear()

    def refused(self, code: str, message: str, body: dict[str, Any]) -> None:
        if code == Code.NOT_LEADER:
            self.peer._refusal = Refused(message, code=code, **{
                k: body.get(k) for k in ("role", "term", "leader", "queen")})
        else:
            self.peer._refusal = Refused(f"the queen refused {self.peer.role} {self.peer.name!r}: "
                                    f"{message}", code=code)
        self.peer._stopping.set()
        self.peer._welcomed.set()

    def waiting(self, waited: float) -> None:
        self.peer._said_waiting = True
        where = self.peer.finder.queen or f"colony {self.peer.colony or 'default'}"
        log.warning("%s: still waiting for the queen at %s (%.0f s so far): is it running, "
                    "and is the endpoint right? (--queen or MESHANT_QUEEN)", self.peer.name, where,
                    waited)

    def broadcast(self, topic: str, msg: p.Message) -> None:
        for prefix, fn in self.peer._subs:
            if topic.startswith(prefix):
                self.peer._deliver_broadcast(fn, topic, msg)

    def log(self, level: str, text: str) -> None:
        log.log(_LEVELS.get(level, logging.WARNING), "%s", text)

