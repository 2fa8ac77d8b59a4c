"""A peer's link to its queen, sans-IO: the one driver logic every forager and client
runs, whoever owns the sockets.

The link holds the :class:`~meshant.core.peers.peer_session.PeerSession` (hello,
welcome, liveness) and the role's own session (a
:class:`~meshant.core.peers.forager_session.ForagerSession` or a
:class:`~meshant.core.peers.client_session.ClientSession`, through :class:`Role`), and
does what used to be written once per driver:

* **in**: a frame from the queen is decoded and goes where it belongs — the welcome and
  session errors to the peer session, colony memory to its replica, everything else to
  the role's session; the queen's heartbeats and broadcasts from PUB likewise;
* **out**: what a session has for the queen is encoded (the sender, the time, blobs
  inlined when not negotiated, the queen's size limit), sent while the connection takes
  it, in slices, a turn's rounds bounded; what the connection cannot take goes back
  first in line; what cannot be encoded is replaced by what the role says (a failed
  result, a batch split back) and nothing overtakes it;
* **the session's decisions** (say hello, beat, reconnect, follow a standby's hint, the
  welcome, a refusal) become calls on the driver's :class:`Port`.

The actors (:mod:`meshant.actors._peer`) and the simulator (:mod:`meshant.sim.peers`)
are two ports: sockets and threads, or a simulated network and clock. A fix here reaches
both. Time is passed in; nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from meshant import protocol as p
from meshant.core.peers import peer_session as ses
from meshant.core.peers.choice import QueenChoice
from meshant.core.peers.peer_session import PeerSession
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC, MEM_TOPIC, USER_PREFIX

Item = p.Message | list[bytes]  # a message, or frames already encoded (a submission)
FLUSH_ROUNDS = 16  # slices of a session's outbox sent per turn at most (see flush)
FLUSH_MAX = 512  # messages taken from a session's outbox per slice


class Role(Protocol):
    """What the link needs of a role's session (forager or client)."""

    role: str
    beat_now: bool  # say so at once (a forager that starts draining)

    def hello_fields(self) -> dict[str, Any]: ...

    def hb_body(self) -> dict[str, Any]: ...

    @property
    def busy(self) -> bool:
        """Tasks run: the heartbeat, which renews their leases, goes every interval."""

    @property
    def pending(self) -> bool:
        """Something waits in the outbox for the queen."""

    def next_deadline(self) -> float: ...

    def send(self, item: Item) -> None:
        """Put ``item`` in line for the queen, after what waits."""

    def tick(self, now: float, patience: float, welcomed: bool) -> None: ...

    def negotiated(self, features: frozenset[str], max_message: int) -> None:
        """The terms of the welcome: what may be batched, how large a message may be."""

    def flush(self, now: float, limit: int) -> list[Item]: ...

    def sent(self, item: Item, now: float) -> None: ...

    def unsent(self, items: list[Item]) -> None: ...

    def unencodable(self, item: Item, code: str, message: str) -> str | None: ...

    def on_welcome(self, first: bool, welcome: dict[str, Any]) -> None:
        """Welcomed (again, unless ``first``): what waits goes again."""

    def on_lost(self, now: float, why: str) -> None:
        """The queen is gone or restarted."""

    def on_forgotten(self, ref: str | None) -> None:
        """The queen refused message ``ref`` as from a peer it does not know."""

    def on_message(self, msg: p.Message, now: float) -> str | None:
        """A message from the queen for this role; a line to log, if any."""

    def on_error(self, msg: p.Message, now: float) -> str | None:
        """An ``error`` about something the role sent; a line to log, if any."""


class Memory(Protocol):
    """Colony memory as a peer keeps it (``meshant.actors.colony_memory.Memory``, or the
    simulator's replica)."""

    def on_welcome(self, new_epoch: bool) -> None: ...

    def on_update(self, update: dict[str, Any]) -> None: ...

    def on_queen_seq(self, seq: int) -> None: ...

    def on_reply(self, msg: p.Message) -> bool: ...

    def on_error(self, msg: p.Message) -> bool: ...


class Port(Protocol):
    """What the driver does for the link: its connection, its clock's wall time, and
    what only it can tell a person or a caller."""

    def send(self, frames: list[bytes], item: Item) -> bool:
        """Send now; False when the connection cannot take it (nothing was sent)."""

    def wall(self) -> float:
        """The wall-clock time, for a message's (informative) ``ts``."""

    def about(self) -> dict[str, Any]:
        """What the hello says of this process: ``host``, ``pid``, ``session``."""

    def open(self, endpoint: str, why: str) -> None:
        """Open a fresh connection to ``endpoint`` (closing the one before): ``why`` is
        "start", "lost" (the queen is gone or restarted), "fresh" (asked for, or another
        queen), or "moved" (discovery says the queen moved: its PUB moved with it)."""

    def moved(self) -> str | None:
        """Where discovery says the queen is now, if it moved (else None)."""

    def lost(self, why: str) -> None:
        """The queen is gone or restarted (a fresh connection and a hello follow)."""

    def welcomed(self, first: bool, new_epoch: bool, pub: str) -> None:
        """The queen welcomed us: listen to its PUB at ``pub``."""

    def forgotten(self) -> None:
        """The queen no longer knows us: the hello that follows registers us again."""

    def refused(self, code: str, message: str, body: dict[str, Any]) -> None:
        """A final refusal: stop, and tell the caller (``body``: the queen's error)."""

    def waiting(self, waited: float) -> None:
        """Still no queen after ``waited`` seconds: tell the person."""

    def broadcast(self, topic: str, msg: p.Message) -> None:
        """A broadcast on a topic this peer listens to."""

    def log(self, level: str, text: str) -> None:
        """A line for the person running this peer (``info``, ``warning``, ``error``)."""


class PeerLink:
    """One peer's link to its queen (see the module's docstring)."""

    def __init__(self, role: Role, port: Port, name: str, choice: QueenChoice, *,
                 curve: bool = False, rng: random.Random | None = None,
                 memory: Memory | None = None, flush_limit: int = FLUSH_MAX) -> None:
        self.role = role
        self.port = port
        self.name = name
        self.choice = choice
        self.memory = memory
        self.flush_limit = flush_limit
        self.sess = PeerSession(curve=curve, rng=rng)
        # Whether the last flush stopped with the connection still taking more: the next
        # turn should come at once (a backlog goes out slice by slice).
        self.more = False
        # Shown every message from the queen before it is handled (the simulator's
        # invariants look at what arrives).
        self.observe: Callable[[p.Message], None] | None = None
        self._handlers: dict[str, Callable[[p.Message, float], None]] = {
            "welcome": self._on_welcome,
            "error": self._on_error,
            "hb": self._on_farewell,
            "mem.sync": self._on_memory,
        }

    # -- what drivers read ----------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.sess.active

    @property
    def features(self) -> frozenset[str]:
        return self.sess.features

    @property
    def max_message(self) -> int:
        return self.sess.max_message

    def next_wakeup(self) -> float:
        """When ``tick`` next has something to do, with nothing arriving meanwhile."""
        return min(self.sess.next_deadline(self.role.busy), self.role.next_deadline())

    def patience(self) -> float:
        """How long a silent queen is waited for (its heartbeat timeout)."""
        mon = self.sess.monitor
        return mon.timeout if mon is not None else 5 * self.sess.hb_interval

    # -- encoding -------------------------------------------------------------------------

    def encode(self, msg: p.Message) -> list[bytes]:
        """The message's frames; ProtocolError ``too-large`` if one is over the queen's
        limit (naming both sizes), or if the body cannot be encoded."""
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = self.port.wall()
        if "blobs" not in self.sess.features:  # not negotiated, not used (spec §5)
            msg.body = p.inline_blobs(msg.body)
        frames = p.binary.encode(msg)
        limit = self.sess.max_message
        for f in frames:
            if len(f) > limit:
                raise p.LocalProtocolError(
                    Code.TOO_LARGE, f"{size(max(len(x) for x in frames))}, over the queen's "
                    f"limit of {size(limit)} (its --max-message), for a {msg.kind} message")
        return frames

    def send_now(self, msg: Item) -> bool:
        """Send at once, ahead of any outbox; False if the connection cannot take it.
        Raises ProtocolError for a message that cannot be encoded or is too large."""
        frames = msg if isinstance(msg, list) else self.encode(msg)
        if not self.port.send(frames, msg):
            return False
        self.sess.last_send = self._now
        return True

    # -- events in ------------------------------------------------------------------------

    _now = 0.0  # the time of the event being handled (the driver's monotonic clock)

    def start(self, now: float) -> None:
        """The driver is ready: a connection opens and the first hello goes."""
        self._now = now
        self._open("start")
        self.sess.start(now)
        self.act(now)

    def _open(self, why: str) -> None:
        self.port.open(self.choice.queen, why)
        self.choice.connected()

    def receive(self, frames: list[bytes], now: float) -> None:
        """A message from the queen on the request connection."""
        self._now = now
        try:
            msg = p.binary.decode(frames)
        except p.ProtocolError as e:
            self.port.log("warning", f"{self.name}: bad message from the queen: {e}")
            return
        self.sess.heard(now)
        if self.observe is not None:
            self.observe(msg)
        h = self._handlers.get(msg.kind)
        if h is not None:
            h(msg, now)
            return
        line = self.role.on_message(msg, now)
        if line is not None:
            self.port.log("warning", f"{self.name}: {line}")
        if self.role.beat_now:
            self.role.beat_now = False
            if self.sess.active:
                self._beat()

    def receive_pub(self, topic: bytes, frames: list[bytes], now: float) -> None:
        """A message from the queen's PUB under ``topic``."""
        self._now = now
        try:
            msg = p.binary.decode(frames)
        except p.ProtocolError as e:
            self.port.log("warning", f"{self.name}: bad broadcast from the queen: {e}")
            return
        if topic == HB_TOPIC:
            self._on_queen_beat(msg, now)
        elif topic == MEM_TOPIC:
            if self.memory is not None:
                self.memory.on_update(msg.b)
        elif topic.startswith(USER_PREFIX):
            name = topic[len(USER_PREFIX):].decode("utf-8", "replace")
            self.port.broadcast(name, msg)

    def tick(self, now: float) -> None:
        """Timers: the session's (hello retries, the queen's silence, our heartbeat) and
        the role's (implied accepts, re-sending, retries)."""
        self._now = now
        self.sess.tick(now, self.role.busy)
        if self.sess.out:
            self.act(now)
        self.role.tick(now, self.patience(), self.sess.active)

    def moved(self, now: float) -> None:
        """The queen is somewhere else now (discovery said): reconnect there."""
        self._now = now
        self.sess.moved(now)
        self.act(now)

    # -- the queen's messages -------------------------------------------------------------

    def _on_welcome(self, msg: p.Message, now: float) -> None:
        if msg.ref != self.sess.hello_id:
            return  # the answer to an older hello
        self.name = msg.b.get("name", self.name)
        self.choice.unanswered = False
        self.sess.on_welcome(msg.ref, msg.b, now)
        self.act(now)

    def _on_error(self, msg: p.Message, now: float) -> None:
        b = msg.b
        code = b["code"]
        if code == Code.NOT_REGISTERED:
            # The queen does not know us (it restarted, or forgot an idle client):
            # introduce ourselves again, then send again what was refused.
            self.role.on_forgotten(msg.ref)
        if msg.ref is not None and msg.ref == self.sess.hello_id:
            self.choice.unanswered = False
        self.choice.error_body = b
        if self.sess.on_error(msg.ref, code, b["message"], b.get("retry_after"), now,
                              b.get("leader")):
            self.act(now)
            return
        if self.memory is not None and self.memory.on_error(msg):
            return
        line = self.role.on_error(msg, now)
        if line is not None:
            self.port.log("warning", f"{self.name}: {line}")

    def _on_farewell(self, msg: p.Message, now: float) -> None:
        # The queen's farewell heartbeat, sent to each peer directly as well as on PUB.
        self._on_queen_beat(msg, now)

    def _on_queen_beat(self, msg: p.Message, now: float) -> None:
        sess = self.sess
        if not sess.active:
            return
        sess.on_queen_beat(msg.b.get("epoch"), now)
        if sess.out:
            self.act(now)
            return
        seq = msg.b.get("mem_seq")
        if isinstance(seq, int) and self.memory is not None:
            self.memory.on_queen_seq(seq)

    def _on_memory(self, msg: p.Message, now: float) -> None:
        if self.memory is not None:
            self.memory.on_reply(msg)

    # -- the session's decisions ----------------------------------------------------------

    def hello(self) -> p.Message:
        """The hello this peer says: its role, what it speaks, and the role's fields."""
        body: dict[str, Any] = {"role": self.role.role, "name": self.name,
                                "versions": [p.binary.VERSION], "codecs": ["msgpack"],
                                "features": list(p.negotiation.FEATURES),
                                **self.port.about(), **self.role.hello_fields()}
        return p.Message("hello", body, frm=self.name, to="queen", ts=self.port.wall())

    def _beat(self) -> None:
        # Sent or not (a full pipe: the queen reads nothing of ours now anyway), the next
        # beat is due an interval from now — else a full pipe would be tried flat out.
        self.send_now(p.Message("hb", self.role.hb_body(), to="queen"))
        self.sess.sent(self._now, beat=True)

    def act(self, now: float) -> None:
        """Carry out what the peer session decided, in order."""
        self._now = now
        sess, port = self.sess, self.port
        for a in sess.take():
            match a:
                case ses.Beat():
                    self._beat()
                case ses.SayHello(fresh_connection=fresh):
                    before = self.choice.queen
                    why = self.choice.before_hello(fresh, port.moved())
                    if why is not None:
                        if why != "moved" and self.choice.queen != before:
                            port.log("info", f"{self.name}: trying the queen at "
                                     f"{self.choice.queen}")
                        self._open(why)
                    hello = self.hello()
                    self.choice.unanswered = True
                    self.send_now(hello)
                    sess.hello_sent(hello.id, now)
                case ses.Redirect(leader=leader):
                    choice = self.choice
                    if not choice.redirect(leader):
                        # Not following leaders: the standby's answer is a refusal.
                        b = choice.error_body
                        port.refused(Code.NOT_LEADER, str(b.get("message", "a standby "
                                                                 "queen")), b)
                        return
                    if choice.queen != choice.connected_to:
                        port.log("info", f"{self.name}: trying the queen at {choice.queen}")
                case ses.Welcomed(first=first, new_epoch=new_epoch):
                    port.welcomed(first, new_epoch, str(sess.welcome.get("pub") or ""))
                    if self.memory is not None:
                        self.memory.on_welcome(new_epoch)
                    self.role.negotiated(sess.features, sess.max_message)
                    self.role.on_welcome(first, sess.welcome)
                case ses.Lost(why=why):
                    port.lost(why)
                    self._open("lost")
                    self.role.on_lost(now, why)
                case ses.Forgotten():
                    port.forgotten()
                case ses.Refused(code=code, message=message):
                    port.refused(code, message, self.choice.error_body)
                case ses.NameHeld(message=message, retry_after=retry_after):
                    # Said at once: the queen is there, the name is the trouble.
                    port.log("warning", f"{self.name}: {message}. Asking once more in "
                             f"{max(1.0, retry_after):.0f} s, in case the holder is an "
                             f"earlier life of this {self.role.role}, dead but not yet "
                             "declared offline")
                case ses.StillWaiting(waited=waited):
                    port.waiting(waited)

    # -- sending --------------------------------------------------------------------------

    def flush(self, now: float) -> bool:
        """Send what the role's session has for the queen, while the connection takes
        it. The session hands out its backlog in slices (and an unsendable result comes
        back as an error to send too); a turn sends FLUSH_ROUNDS of them at most, so a
        handler streaming flat out cannot keep the driver from reading the queen.
        Returns whether the connection still takes more (then the next turn should come
        at once)."""
        self._now = now
        self.more = False
        if not self.sess.active:
            return False
        role, port = self.role, self.port
        for _ in range(FLUSH_ROUNDS):
            items = role.flush(now, self.flush_limit)
            if not items:
                return False
            for i, item in enumerate(items):
                try:
                    frames = item if isinstance(item, list) else self.encode(item)
                except p.ProtocolError as e:
                    # What follows waits behind what replaces it (a batch split back,
                    # a failed result): nothing overtakes it.
                    role.unsent(items[i + 1:])
                    self._unencodable(item, e)
                    break
                if not port.send(frames, item):
                    role.unsent(items[i:])
                    return False
                self.sess.last_send = now
                role.sent(item, now)
        self.more = True
        return True

    def _unencodable(self, item: Item, e: p.ProtocolError) -> None:
        line = self.role.unencodable(item, e.code, e.message)
        if line is not None:
            self.port.log("warning", f"{self.name}: {line}")


def size(n: int) -> str:
    """A size as a person reads it."""
    return f"{n:,} bytes" if n < 1024 * 1024 else f"{n:,} bytes ({n / 1048576:.1f} MiB)"


__all__ = ["FLUSH_MAX", "FLUSH_ROUNDS", "Item", "Memory", "PeerLink", "Port", "Role", "size"]
