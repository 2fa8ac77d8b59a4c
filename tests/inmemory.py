"""A whole colony in memory, for tests (as h11's ``ConnectionPair`` is for its own): the
real queen core, and peers that are the real sessions (hello, welcome, heartbeats, the
forager's and the client's own), on the simulator's network with no delay and its
virtual clock. A test sends raw messages on a peer's connection and reads what the peer
received; it lets time pass with ``advance``. No socket, thread or sleep is involved.

Built from the simulator's parts (``meshant.sim``): its queen driver and peers, without
its faults, delays and randomness, and with its invariants still checked at every step.

What the real sessions do by themselves, that a test sees:

* a peer says hello when it joins, and beats once a second when it has said nothing
  else (a forager running tasks beats every second regardless, listing them);
* a forager's session takes every assignment (a ``ManualForager`` starts no handler:
  the test answers with raw messages) and, unless something about it goes out within
  2 ms, sends ``task.accept`` (so ``advance`` after an assignment implies an accept);
* a peer that hears nothing from the queen for its heartbeat timeout (a pause, a queen
  that forgot it) says hello again, listing what it still runs.

The simulator's invariants hold the test to what a real colony does too: a question's
``request`` is named after the assignment that asks (``<assign id>.q<n>``), as the
simulated handlers name theirs, so that an answer is seen to reach its asker.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from typing import Any

from meshant import protocol as p
from meshant.core.queen.outbox import Record, RecordMemory
from meshant.core.queen.router import QueenConfig, QueenCore
from meshant.sim.ledger import Ledger
from meshant.sim.peers import SimClient, SimForager, SimPeer
from meshant.sim.queen import SimQueen
from meshant.sim.world import Clock, Conn, Net

SETTINGS: dict[str, Any] = {"hb_interval": 1.0, "hb_misses": 3}


class InMemoryPeer:
    """A peer of the colony, seen from the test: what reached its connection, and raw
    sends on it. Its session (``peer``) goes on by itself: it said hello, it beats. A raw
    peer (``InMemoryColony.raw``) has a connection and no session."""

    def __init__(self, colony: InMemoryColony, name: str, peer: SimPeer | None = None,
                 conn: Conn | None = None) -> None:
        self.colony = colony
        self.name = name
        self.peer = peer
        self._conn = conn
        self.inbox: list[p.Message] = []
        self.heard: list[tuple[bytes, p.Message]] = []  # PUB messages

    @property
    def conn(self) -> Conn:
        conn = self.peer.conn if self.peer is not None else self._conn
        assert conn is not None
        return conn

    @property
    def identity(self) -> bytes:
        """The connection's identity at the queen (a new one after a reconnect)."""
        return self.conn.identity()

    def send(self, kind: str, body: Any = None, *, ref: str | None = None,
             id: str | None = None, frm: str | None = None, to: str = "queen",
             extra: dict[str, Any] | None = None) -> p.Message:
        """A raw message on this peer's connection, handled by the queen now."""
        msg = p.Message(kind, body, ref=ref, frm=self.name if frm is None else frm,
                        to=to, ts=1.0, extra=extra, **({"id": id} if id else {}))
        self.send_frames(p.binary.encode(msg))
        return msg

    def send_frames(self, frames: list[bytes]) -> None:
        """Raw frames on this peer's connection (in order after what its session sent)."""
        if isinstance(self.peer, ManualForager):
            self.peer.went_out(frames)
        self.colony.net.send_up(self.conn, frames)
        self.colony.settle()

    def pause(self, seconds: float) -> None:
        """Stop the process (SIGSTOP) for ``seconds``: its session does nothing, what
        reaches its connection waits (and is in ``inbox`` already); raw sends still go,
        as messages it sent before it stopped, arriving late."""
        assert self.peer is not None, "a raw peer has no process to pause"
        self.peer.pause(seconds)

    def take(self, kind: str | None = None) -> list[p.Message]:
        """Received messages (of ``kind``), removed from the inbox."""
        got = [m for m in self.inbox if kind is None or m.kind == kind]
        self.inbox = [m for m in self.inbox if m not in got]
        return got

    def one(self, kind: str) -> p.Message:
        got = self.take(kind)
        assert len(got) == 1, (kind, got, self.inbox)
        return got[0]


class _Recording(SimPeer):
    """A simulated peer that also hands what reaches its connection to the test's view
    (on arrival: a paused process has not read it yet, but it is there), and says the
    test's extra hello fields."""

    seen: InMemoryPeer | None = None
    hello_extra: dict[str, Any] = {}

    def receive(self, conn: Conn, frames: list[bytes]) -> None:
        if conn is self.conn and self.seen is not None:
            self.seen.inbox.append(p.decode_any(frames)[0])
        super().receive(conn, frames)

    def receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        if self.seen is not None:
            self.seen.heard.append((topic, p.binary.decode(frames)))
        super().receive_pub(queen, topic, frames)


class RecordingClient(_Recording, SimClient):
    """A client session that submits nothing by itself: the test's raw submissions are
    unknown to it, so it neither waits for their results nor answers their questions."""


class ManualForager(_Recording, SimForager):
    """A forager whose runs the test carries out by hand, with raw messages on its
    connection: an assignment starts nothing. Its session is kept in step with those
    messages, as if its handlers had sent them (see :meth:`went_out`)."""

    carried: tuple[str, ...] = ()

    def _begin(self, start: Any) -> None:
        pass

    def fresh(self) -> None:
        super().fresh()
        # Assignments this process runs from before (a queen restarted under it): its
        # hello and heartbeats list them; accepted long ago, they imply no accept now.
        for ref in self.carried:
            task, _, attempt = ref.rpartition(".")
            self.fs.assign(ref, {"capability": self.tools[0], "task": task,
                                 "attempt": int(attempt)}, None, self.clock.now)
            self.fs._accepts.pop(ref, None)
        self.fs.take()

    def went_out(self, frames: list[bytes]) -> None:
        """A raw message from the test left on this forager's connection: anything about
        an assignment implies its acceptance (no accept follows), and a final result or
        a reject ends its run (the heartbeats stop listing it), as ``ForagerSession``
        counts what its handlers send."""
        try:
            msg = p.binary.decode(frames)
        except p.ProtocolError:
            return  # (garbage the test sends on purpose)
        body = msg.b if isinstance(msg.b, dict) else {}
        if msg.kind == "task.batch":
            items = [r for r in body.get("results", []) if isinstance(r, dict)]
        else:
            items = [{**body, "ref": msg.ref}]
        fs = self.fs
        for item in items:
            ref = item.get("ref")
            if not isinstance(ref, str):
                continue
            fs._accepts.pop(ref, None)
            if msg.kind == "task.reject" or (
                    msg.kind in ("task.result", "task.batch") and not item.get("partial")
                    and "kind" not in item):
                fs.running.pop(ref, None)


class _RawPeer:
    """A connection with no session behind it (the network's ``Receiver``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: InMemoryPeer | None = None

    def receive(self, conn: Conn, frames: list[bytes]) -> None:
        assert self.seen is not None
        self.seen.inbox.append(p.decode_any(frames)[0])

    def receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        assert self.seen is not None
        self.seen.heard.append((topic, p.binary.decode(frames)))


class InMemoryColony:
    """A queen core driven by the simulator's queen driver, its peers real sessions:
    a peer's ``send`` is a message arriving, ``advance`` the clock. ``journal``: the
    journal the queen writes to and restores from (None: a queen without one)."""

    def __init__(self, journal: Any = None, **settings: Any) -> None:
        settings = {**SETTINGS, **settings}
        self.clock = Clock()
        self.clock.now = 100.0
        self.ledger = Ledger()
        self.net = Net(self.clock, random.Random(0), lambda text: None, delay=(0.0, 0.0),
                       slow=0.0)
        self.queen = SimQueen("queen", QueenConfig(**settings), clock=self.clock, net=self.net,
                              ledger=self.ledger, rng=random.Random(0), disk=None,
                              log=lambda text: None, journal=journal)
        self.queen.read_delay = (0.0, 0.0)  # an SQLite journal answers at once
        self.queen.key_of = self._key_of
        self.net.queens["queen"] = self.queen
        self.journal = journal
        self.records = 0
        self.queen.on_action = self._counted
        self.queen.start()
        self.peers: dict[str, InMemoryPeer] = {}
        self._keys: dict[str, bytes] = {}
        self._uids = itertools.count(1).__next__

    def _counted(self, action: Any) -> None:
        if isinstance(action, Record | RecordMemory):
            self.records += 1

    def _key_of(self, identity: bytes) -> bytes | None:
        for name, key in self._keys.items():
            if self.peers[name].identity == identity:
                return key
        return None

    @property
    def core(self) -> QueenCore:
        core = self.queen.core
        assert core is not None
        return core

    @property
    def now(self) -> float:
        return self.clock.now

    # -- peers ----------------------------------------------------------------------------

    def join(self, role: str, name: str, *, key: bytes | None = None,
             running: Iterable[str] = (), **hello: Any) -> InMemoryPeer:
        """A peer that says hello (its real session) and is welcomed. ``key``: the CURVE
        key its connection authenticated with; ``running``: assignments a forager still
        runs from before (its hello and heartbeats list them); ``hello``: more fields of
        its hello (``features``, ``slots``, ``tools``, ``labels``, ``session``...)."""
        kw: dict[str, Any] = dict(clock=self.clock, net=self.net, ledger=self.ledger,
                                  rng=random.Random(len(self.peers)), queens=["queen"],
                                  log=lambda text: None)
        peer: _Recording
        if role == "forager":
            slots = int(hello.pop("slots", 1))
            tools = list(hello.pop("tools", ["echo"]))
            labels = dict(hello.pop("labels", {}))
            peer = ManualForager(name, tools, slots, labels, self._uids, **kw)
            peer.carried = tuple(running)
        else:
            assert not running, "only a forager runs assignments"
            peer = RecordingClient(name, **kw)
        if "features" in hello:
            hello["features"] = list(hello["features"])
        peer.hello_extra = hello
        seen = InMemoryPeer(self, name, peer)
        peer.seen = seen
        self.peers[name] = seen
        if key is not None:
            self._keys[name] = key
        peer.start()
        self.settle()
        seen.one("welcome")
        return seen

    def forager(self, name: str, **hello: Any) -> InMemoryPeer:
        return self.join("forager", name, **hello)

    def client(self, name: str = "client", **hello: Any) -> InMemoryPeer:
        return self.join("client", name, **hello)

    def raw(self, name: str, *, key: bytes | None = None) -> InMemoryPeer:
        """A connection with no session: nothing is sent on it but what the test sends
        (a hello to a standby, an IACP 1.1 forager, a peer that never says hello)."""
        receiver = _RawPeer(name)
        conn = self.net.connect(receiver, "queen")
        conn.incarnation = self.queen.incarnation  # (its identity is known before it sends)
        seen = InMemoryPeer(self, name, conn=conn)
        receiver.seen = seen
        self.net.subscribe(receiver, "queen")
        self.peers[name] = seen
        if key is not None:
            self._keys[name] = key
        return seen

    # -- time and messages ----------------------------------------------------------------

    def deliver(self, identity: bytes, frames: list[bytes]) -> None:
        """Raw frames on the connection ``identity`` (a peer's), handled now."""
        (seen,) = [s for s in self.peers.values() if s.identity == identity]
        seen.send_frames(frames)

    def settle(self) -> None:
        """Everything due now, and what it causes now."""
        while self.clock.step(self.clock.now):
            pass

    def advance(self, dt: float) -> None:
        """Let ``dt`` seconds pass: ticks, heartbeats, timers, in order."""
        end = self.clock.now + dt
        while self.clock.step(end):
            pass
        self.clock.now = end
        self.settle()

    def pass_time(self, dt: float, *alive: InMemoryPeer) -> None:
        """Let ``dt`` seconds pass while only the ``alive`` peers are heard (the others
        are stopped for as long, SIGSTOP, and may well say hello again as they resume:
        the queen went silent for them)."""
        for seen in self.peers.values():
            if seen not in alive and seen.peer is not None:
                seen.pause(dt)
        self.advance(dt)

    # -- conveniences for forager and client scripts --------------------------------------

    def assigns(self, forager: InMemoryPeer) -> list[dict[str, Any]]:
        """Assignments the forager received, as bodies with their ``id``."""
        out = []
        for m in forager.take():
            if m.kind == "task.assign":
                out.append({**m.b, "id": m.id})
            elif m.kind == "task.assigns":
                out.extend(m.b["assigns"])
            else:
                forager.inbox.append(m)
        return out

    @staticmethod
    def results(client: InMemoryPeer) -> dict[str, dict[str, Any]]:
        """Final results the client received, by task id."""
        out: dict[str, dict[str, Any]] = {}
        for m in client.take():
            items = m.b["results"] if m.kind == "task.batch" else [m.b] if (
                m.kind == "task.result") else []
            for b in items:
                if not b.get("partial") and "kind" not in b:  # (not a batched progress)
                    assert b["task"] not in out, f"two results for {b['task']}"
                    out[b["task"]] = b
            if m.kind not in ("task.batch", "task.result"):
                client.inbox.append(m)
        return out


__all__ = ["InMemoryColony", "InMemoryPeer"]
