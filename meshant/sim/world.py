"""The simulated world: a virtual clock, the events due on it, each process's own view
of time, and the network between the colony's processes. Nothing here sleeps or reads a
clock; a seed fixes every choice.

The network is what ZeroMQ gives the colony, reduced to what matters to its promises:

* a connection (a peer's DEALER to a queen's ROUTER) delivers in order in each direction,
  each message after a delay; a message in flight when the connection breaks (the queen
  dies, the peer opens a fresh one, a partition) is lost; a peer's pipe holds at most
  ``up_hwm`` messages not yet delivered (a send beyond says "not now", as a DEALER at its
  high-water mark does);
* the queen's PUB reaches every subscriber of that queen in order, dropping what a slow
  subscriber has not taken past the high-water mark;
* a partition cuts one peer off from one queen (both ways) for a while; it breaks the
  connection under it, as a TCP connection that times out: libzmq reconnects by itself
  afterwards, and the queen's ROUTER sees the peer under a new identity.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

Event = Callable[[], None]


class Clock:
    """Virtual time and the events due on it, in order (ties in the order scheduled)."""

    skew = 0.0  # (the world's own wall clock is exact)

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self.steps = 0

    def at(self, when: float, fn: Event) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def after(self, delay: float, fn: Event) -> None:
        self.at(self.now + delay, fn)

    def step(self, until: float) -> bool:
        """Run the next event due by ``until``; False when there is none."""
        if not self._heap or self._heap[0][0] > until:
            return False
        when, _, fn = heapq.heappop(self._heap)
        self.now = when
        self.steps += 1
        fn()
        return True

    def next_at(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")


class ProcessClock:
    """One process's view of time: its monotonic clock runs at ``rate`` of virtual time
    from ``offset`` (drift), and its wall clock is off by ``skew``. What the process
    schedules is in its own time, turned into virtual time on the way in."""

    __slots__ = ("offset", "rate", "skew", "world")

    def __init__(self, world: Clock, rate: float = 1.0, offset: float = 0.0,
                 skew: float = 0.0) -> None:
        self.world = world
        self.rate = rate
        self.offset = offset
        self.skew = skew

    @property
    def now(self) -> float:
        return self.world.now * self.rate + self.offset

    @property
    def steps(self) -> int:
        return self.world.steps

    def at(self, when: float, fn: Event) -> None:
        # The virtual time at which this clock reads ``when`` or later: rounding must
        # never wake a process a hair before its deadline (it would wait for it again).
        v = (when - self.offset) / self.rate
        while v * self.rate + self.offset < when:
            v = math.nextafter(v, math.inf)
        self.world.at(v, fn)

    def after(self, delay: float, fn: Event) -> None:
        self.world.after(delay / self.rate, fn)


class Endpoint(Protocol):
    """A queen as the network sees it: it takes frames from a connection."""

    name: str
    up: bool
    incarnation: int

    def deliver(self, identity: bytes, frames: list[bytes]) -> None: ...


class Receiver(Protocol):
    """A peer as the network sees it."""

    name: str

    def receive(self, conn: Conn, frames: list[bytes]) -> None: ...

    def receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None: ...


@dataclass(eq=False)
class Conn:
    """One connection from a peer to a queen's endpoint."""

    peer: Receiver
    queen: str
    number: int
    open: bool = True
    incarnation: int = -1  # the queen's life it reached: a new one is a new pipe
    resets: int = 0  # the TCP connection under it broke and libzmq reconnected
    up_free: float = 0.0  # when the pipe to the queen is next free (FIFO)
    down_free: float = 0.0
    up_queued: int = 0  # sent to the queen, not yet delivered (nor lost)

    def identity(self) -> bytes:
        """The ROUTER identity the queen sees: new for a fresh connection, and new when
        the queen restarted or the connection under it broke (libzmq reconnects, and a
        ROUTER names each pipe afresh)."""
        return f"{self.peer.name}#{self.number}@{self.incarnation}.{self.resets}".encode()


@dataclass
class Net:
    """Connections, subscriptions and partitions between peers and queens."""

    clock: Clock
    rng: random.Random
    log: Callable[[str], None]
    queens: dict[str, Endpoint] = field(default_factory=dict)
    delay: tuple[float, float] = (0.0002, 0.002)
    slow: float = 0.02  # how often a message takes a slow path (50-250 ms)
    pub_hwm: int = 1000
    up_hwm: int = 1_000_000
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _by_identity: dict[tuple[str, bytes], Conn] = field(default_factory=dict)
    _subs: dict[str, dict[Receiver, float]] = field(default_factory=dict)
    _pub_queued: dict[tuple[str, Receiver], int] = field(default_factory=dict)
    _cut: dict[tuple[str, str], float] = field(default_factory=dict)
    lost: int = 0
    late: list[tuple[Conn, list[bytes]]] = field(default_factory=list)

    def _delay(self) -> float:
        lo, hi = self.delay
        d = self.rng.uniform(lo, hi)
        if self.rng.random() < self.slow:
            d += self.rng.uniform(0.05, 0.25)
        return d

    def cut(self, peer: str, queen: str) -> bool:
        until = self._cut.get((peer, queen))
        return until is not None and self.clock.now < until

    def partition(self, peer: str, queen: str, seconds: float) -> None:
        self._cut[(peer, queen)] = self.clock.now + seconds
        for conn in list(self._by_identity.values()):
            if conn.peer.name == peer and conn.queen == queen:
                conn.resets += 1  # what is in flight on it is lost
                conn.up_free = conn.down_free = 0.0

    # -- connections ----------------------------------------------------------------------

    def connect(self, peer: Receiver, queen: str) -> Conn:
        return Conn(peer, queen, next(self._numbers))

    def close(self, conn: Conn) -> None:
        conn.open = False  # what is in flight on it is lost

    def send_up(self, conn: Conn, frames: list[bytes], *, keep_late: bool = False) -> bool:
        """A peer sends to its queen; False if its pipe is full (nothing was sent)."""
        q = self.queens.get(conn.queen)
        if conn.up_queued >= self.up_hwm:
            return False
        if not conn.open or q is None or not q.up or self.cut(conn.peer.name, conn.queen):
            self.lost += 1
            return True
        if conn.incarnation != q.incarnation:
            conn.incarnation = q.incarnation  # reconnected by itself to the queen's new life
            conn.up_free = conn.down_free = 0.0
        self._by_identity[(conn.queen, conn.identity())] = conn
        when = max(conn.up_free, self.clock.now + self._delay())
        conn.up_free = when
        incarnation, resets = conn.incarnation, conn.resets
        if keep_late:
            self.late.append((conn, frames))

        conn.up_queued += 1

        def arrive() -> None:
            conn.up_queued -= 1
            if (conn.open and q.up and q.incarnation == incarnation and conn.resets == resets
                    and not self.cut(conn.peer.name, conn.queen)):
                q.deliver(conn.identity(), frames)
            else:
                self.lost += 1
        self.clock.at(when, arrive)
        return True

    def send_down(self, queen: str, identity: bytes, frames: list[bytes]) -> bool:
        """A queen sends to the connection of ``identity``; False if there is none (a
        ROUTER with ROUTER_MANDATORY refuses a send to an unknown peer)."""
        conn = self._by_identity.get((queen, identity))
        q = self.queens[queen]
        if conn is None or not conn.open or conn.identity() != identity:
            return False
        if self.cut(conn.peer.name, queen):
            self.lost += 1
            return True
        when = max(conn.down_free, self.clock.now + self._delay())
        conn.down_free = when
        incarnation, resets = q.incarnation, conn.resets

        def arrive() -> None:
            if conn.open and q.up and q.incarnation == incarnation and (
                    conn.resets == resets) and not self.cut(conn.peer.name, queen):
                conn.peer.receive(conn, frames)
            else:
                self.lost += 1
        self.clock.at(when, arrive)
        return True

    def replay_late(self) -> None:
        """Deliver again, late, a message a peer sent a while ago (a duplicate)."""
        if not self.late:
            return
        conn, frames = self.late.pop(self.rng.randrange(len(self.late)))
        self.send_up(conn, frames)

    # -- PUB/SUB --------------------------------------------------------------------------

    def subscribe(self, peer: Receiver, queen: str) -> None:
        for subs in self._subs.values():
            subs.pop(peer, None)
        self._subs.setdefault(queen, {})[peer] = 0.0

    def unsubscribe(self, peer: Receiver) -> None:
        for subs in self._subs.values():
            subs.pop(peer, None)

    def publish(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        subs = self._subs.get(queen)
        if not subs:
            return
        q = self.queens[queen]
        incarnation = q.incarnation
        for peer, free in list(subs.items()):
            key = (queen, peer)
            queued = self._pub_queued.get(key, 0)
            if queued >= self.pub_hwm or self.cut(peer.name, queen):
                self.lost += 1  # PUB drops what a subscriber cannot take
                continue
            when = max(free, self.clock.now + self._delay())
            subs[peer] = when
            self._pub_queued[key] = queued + 1

            def arrive(peer: Receiver = peer, key: tuple[str, Receiver] = key) -> None:
                self._pub_queued[key] -= 1
                still = self._subs.get(queen, {})
                if peer in still and q.incarnation == incarnation and q.up:
                    peer.receive_pub(queen, topic, frames)
            self.clock.at(when, arrive)


def garbage(rng: random.Random, size: int) -> list[bytes]:
    """Frames of random bytes (a hostile or broken peer)."""
    n = rng.randint(1, 3)
    return [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, size))) for _ in range(n)]


__all__ = ["Clock", "Conn", "Endpoint", "Event", "Net", "ProcessClock", "Receiver", "garbage"]
