"""A peer's session with its queen, sans-IO: the lifecycle as a table, driven by what
the queen says and by the time; what to do comes back as typed actions.

States (``TRANSITIONS`` is the whole lifecycle; every change goes through ``_move``)::

    hello ──welcome──► active ──silence / new epoch / forgotten──► hello
      │                  │
      └─refusal─► refused └──close──► closed

* ``hello``: saying hello, again after a backoff until answered. ``rate-limited`` and
  ``name-taken`` (once, when its holder would be declared offline by then, said at once
  with ``NameHeld``) are waited out; any other refusal is final.
* ``active``: welcomed. The queen's silence for ``hb_interval × hb_misses``, or a new
  epoch on its heartbeat, means it is gone or restarted: reconnect (a fresh connection)
  and hello again. ``not-registered`` means it forgot us: hello again on this connection.

The driver (``meshant.actors._peer.Peer``) owns the sockets; it calls the ``on_*``
methods and ``tick``, then carries out the actions ``take()`` returns, in order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from meshant.core.nodes.heartbeat import HeartbeatMonitor
from meshant.core.policy import Backoff
from meshant.protocol.codes import Code

NAME_WAIT = 60.0  # the longest a restarted peer waits for its old self to be declared offline
WAIT_SAID_FIRST = 2.0  # when a peer waiting for its queen first says so


class State(StrEnum):
    HELLO = "hello"
    ACTIVE = "active"
    REFUSED = "refused"
    CLOSED = "closed"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.HELLO: frozenset({State.HELLO, State.ACTIVE, State.REFUSED, State.CLOSED}),
    State.ACTIVE: frozenset({State.HELLO, State.CLOSED}),
    State.REFUSED: frozenset({State.CLOSED}),
    State.CLOSED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class SayHello:
    """Send a hello now (and report its id with ``hello_sent``)."""

    fresh_connection: bool = False  # open a new connection first


@dataclass(frozen=True, slots=True)
class Welcomed:
    """The queen welcomed us: ``first`` time ever, or back; ``new_epoch`` if it restarted."""

    first: bool
    new_epoch: bool


@dataclass(frozen=True, slots=True)
class Lost:
    """The queen is gone or restarted: open a fresh connection and say hello again."""

    why: str


@dataclass(frozen=True, slots=True)
class Forgotten:
    """The queen no longer knows us (it said ``not-registered``): hello again."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A final refusal: stop, and tell the caller ``code`` and ``message``."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Beat:
    """Send a heartbeat now (nothing else went out for an interval)."""


@dataclass(frozen=True, slots=True)
class StillWaiting:
    """Tell the person: still no queen after ``waited`` seconds."""

    waited: float


@dataclass(frozen=True, slots=True)
class NameHeld:
    """Tell the person: the queen says our name is held (``message``); we ask once more
    in ``retry_after`` seconds, when a dead holder (an earlier life of ours) would have
    been declared offline."""

    message: str
    retry_after: float


@dataclass(frozen=True, slots=True)
class Redirect:
    """The queen is a standby: say hello to ``leader`` next (empty: to the next queen
    endpoint this peer knows)."""

    leader: str


Action = (SayHello | Welcomed | Lost | Forgotten | Refused | Beat | StillWaiting | NameHeld
          | Redirect)

# Reconnecting: the first hello retry within 0.25 s, doubling up to 5 s, jittered so a
# colony of peers does not come back in lock-step.
HELLO_BACKOFF = Backoff(base=0.25, cap=5.0)


class PeerSession:
    """One peer's lifecycle with its queen. ``now`` is the driver's monotonic clock."""

    def __init__(self, *, curve: bool = False, rng: random.Random | None = None) -> None:
        self.state = State.HELLO
        self.curve = curve
        self.welcome: dict[str, Any] = {}
        self.epoch = ""
        self.features: frozenset[str] = frozenset()
        self.hb_interval = 1.0
        self.max_message = 64 * 1024 * 1024
        self.max_broadcast = 128 * 1024
        self.reconnects = 0
        self.hello_id = ""
        self.monitor: HeartbeatMonitor | None = None
        self.last_send = 0.0
        self.last_beat = 0.0
        self._attempt = 0
        self._next_hello = 0.0
        self._name_retried = False
        self._wait_since = 0.0
        self._next_wait_say = 0.0
        self._backoff = Backoff(HELLO_BACKOFF.base, HELLO_BACKOFF.cap,
                                rng or random.Random())
        self.out: list[Action] = []

    # -- plumbing -------------------------------------------------------------------------

    def _move(self, state: State) -> None:
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal session transition {self.state} -> {state}")
        self.state = state

    def take(self) -> list[Action]:
        out, self.out = self.out, []
        return out

    @property
    def active(self) -> bool:
        return self.state is State.ACTIVE

    # -- events in ------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """The driver connected: say hello."""
        self._waiting(now)
        self.out.append(SayHello())

    def hello_sent(self, hello_id: str, now: float) -> None:
        """The driver sent a hello with this id: expect its answer, retry after a while."""
        self.hello_id = hello_id
        self._next_hello = now + self._retry_delay()
        self._attempt += 1

    def _retry_delay(self) -> float:
        # Equal jitter: at least half the ceiling, so a retry never comes at once.
        return self._backoff.ceiling(self._attempt) * self._backoff.rng.uniform(0.5, 1.0)

    def sent(self, now: float, beat: bool = False) -> None:
        """Anything went to the queen (any message counts as a sign of life)."""
        self.last_send = now
        if beat:
            self.last_beat = now

    def heard(self, now: float) -> None:
        """Anything came from the queen on the request socket."""
        if self.monitor is not None:
            self.monitor.beat("queen", now)

    def on_welcome(self, ref: str | None, body: dict[str, Any], now: float) -> None:
        if ref != self.hello_id or self.state is not State.HELLO:
            return  # the answer to an older hello
        first = not self.welcome
        new_epoch = body["epoch"] != self.epoch
        self.welcome = body
        self.features = frozenset(body.get("features", ()))
        self.epoch = body["epoch"]
        self.hb_interval = float(body["hb_interval"])
        limit = body.get("max_message")
        if isinstance(limit, int) and limit > 0:
            self.max_message = limit
        limit = body.get("max_broadcast")
        if isinstance(limit, int) and limit > 0:
            self.max_broadcast = limit
        self._attempt = 0
        self._name_retried = False
        self.monitor = HeartbeatMonitor(self.hb_interval, int(body["hb_misses"]))
        self.monitor.add("queen", now)
        self._move(State.ACTIVE)
        self.out.append(Welcomed(first, new_epoch and not first))

    def on_error(self, ref: str | None, code: str, message: str, retry_after: Any,
                 now: float, leader: Any = None) -> bool:
        """An ``error`` from the queen: True if it was about the session (handled here).
        ``leader``: a ``not-leader`` error's hint, the leading queen's endpoint."""
        if code == Code.NOT_LEADER:
            hint = leader if isinstance(leader, str) else ""
            if self.state is State.ACTIVE:
                self.out.append(Redirect(hint))
                self._lose(now, f"the queen is a standby now ({message})")
            elif self.state is State.HELLO and ref is not None and ref == self.hello_id:
                # A live queen answered: try the leader (or the next queen) soon, without
                # the backoff that is for queens that do not answer at all.
                self.out.append(Redirect(hint))
                self.hello_id = ""
                self._attempt = 0
                self._next_hello = now + self._backoff.rng.uniform(0.1, 0.3)
            return True
        if code == Code.NOT_REGISTERED:
            if self.state is State.ACTIVE:
                self._move(State.HELLO)
                self._attempt = 0
                self._waiting(now)
                self.out.append(Forgotten())
                self.out.append(SayHello())
            return True
        if ref is None or ref != self.hello_id or self.state is not State.HELLO:
            return False
        if code == Code.RATE_LIMITED and isinstance(retry_after, int | float):
            self._next_hello = now + float(retry_after)
            self.hello_id = ""
            return True
        if code == Code.NAME_TAKEN and isinstance(retry_after, int | float) and (
                not self._name_retried and retry_after <= NAME_WAIT):
            # The name's holder (perhaps our own previous life) may be dead but not yet
            # declared offline: ask once more when it would be. A live holder still has
            # it then, and that second refusal is final.
            self._name_retried = True
            self._next_hello = now + float(retry_after)
            self.hello_id = ""
            # The queen answered: "still waiting for the queen" would mislead meanwhile.
            self._next_wait_say = self._next_hello + WAIT_SAID_FIRST
            self.out.append(NameHeld(message, float(retry_after)))
            return True
        self._move(State.REFUSED)
        self.out.append(Refused(code, message))
        return True

    def on_queen_beat(self, epoch: Any, now: float) -> None:
        """The queen's heartbeat on PUB."""
        if self.state is not State.ACTIVE or self.monitor is None:
            return
        if epoch and epoch != self.epoch:
            # A queen that stops says goodbye with its epoch marked ".stopped".
            self._lose(now, "the queen stopped" if str(epoch).endswith(".stopped")
                       else f"the queen restarted (epoch {epoch})")
            return
        self.monitor.beat("queen", now)

    def moved(self, now: float) -> None:
        """The queen is somewhere else now (discovery said): reconnect there."""
        if self.state in (State.HELLO, State.ACTIVE):
            self._lose(now, "the queen moved")

    def close(self) -> None:
        if self.state is not State.CLOSED:
            self._move(State.CLOSED)

    # -- time -----------------------------------------------------------------------------

    def tick(self, now: float, busy: bool = False) -> None:
        """Timers: hello retries and waiting notes, the queen's silence, our heartbeat.
        ``busy``: tasks are running, so the heartbeat (which lists them) goes every
        interval even when other messages keep the connection busy."""
        if self.state is State.HELLO:
            if now >= self._next_wait_say:
                waited = now - self._wait_since
                self.out.append(StillWaiting(waited))
                self._next_wait_say = now + min(60.0, max(WAIT_SAID_FIRST, waited))
            if now >= self._next_hello:
                # A CURVE handshake the queen refused is not retried by libzmq: a fresh
                # connection is (the key may be authorized by now).
                self.out.append(SayHello(fresh_connection=self.curve and self._attempt > 0))
            return
        if self.state is not State.ACTIVE:
            return
        mon = self.monitor
        if mon is not None and mon.check(now):
            self._lose(now, f"no sign of life from the queen for {mon.timeout:g} s")
            return
        if now >= self.next_beat(busy):
            self.out.append(Beat())

    def next_beat(self, busy: bool = False) -> float:
        return (self.last_beat if busy else self.last_send) + self.hb_interval

    def next_deadline(self, busy: bool = False) -> float:
        """When ``tick`` next has something to do, with nothing arriving meanwhile."""
        if self.state is State.HELLO:
            return min(self._next_hello, self._next_wait_say)
        if self.state is not State.ACTIVE:
            return float("inf")
        t = self.next_beat(busy)
        if self.monitor is not None:
            d = self.monitor.next_deadline()
            if d is not None:
                t = min(t, d)
        return t

    # -- internals ------------------------------------------------------------------------

    def _waiting(self, now: float) -> None:
        self._wait_since = now
        self._next_wait_say = now + WAIT_SAID_FIRST

    def _lose(self, now: float, why: str) -> None:
        self._move(State.HELLO)
        self.monitor = None
        self.reconnects += 1
        self._attempt = 0
        self._waiting(now)
        self.out.append(Lost(why))
        self.out.append(SayHello())


__all__ = ["TRANSITIONS", "Action", "Beat", "Forgotten", "Lost", "NameHeld", "PeerSession",
           "Redirect", "Refused", "SayHello", "State", "StillWaiting", "Welcomed"]
