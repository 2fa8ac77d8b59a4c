"""A whole colony in memory, for tests (as h11's ``ConnectionPair`` is for its own): the
real queen core, and peers that are the real sessions (hello, welcome, heartbeats, the
forager's and the client's own), on the simulator's network with no delay and its
virtual clock. A test sends raw messages on a peer's connection and reads what the peer
received; it lets time pass with ``advance``. No socket, thread or sleep is involved.

Built from the simulator's parts (``meshant.sim``): its queen driver and peers, without
its faults, delays and randomness, and with its invariants still checked at every step.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
from typing import Any

from meshant import protocol as p
from meshant.core.outbox import Record, RecordMemory
from meshant.core.queen import QueenConfig, QueenCore
from meshant.sim.ledger import Ledger
from meshant.sim.peers import SimClient, SimForager, SimPeer
from meshant.sim.queen import SimQueen
from meshant.sim.world import Clock, Conn, Net

SETTINGS: dict[str, Any] = {"hb_interval": 1.0, "hb_misses": 3}


class InMemoryPeer:
    """A peer of the colony, seen from the test: what it received, and raw sends on its
    connection. Its session (``peer``) goes on by itself: it said hello, it beats."""

    def __init__(self, colony: InMemoryColony, peer: SimPeer) -> None:
        self.colony = colony
        self.peer = peer
        self.name = peer.name
        self.inbox: list[p.Message] = []
        self.heard: list[tuple[bytes, p.Message]] = []  # PUB messages

    @property
    def identity(self) -> bytes:
        """The connection's identity at the queen."""
        conn = self.peer.conn
        assert conn is not None
        return conn.identity()

    def send(self, kind: str, body: Any = None, *, ref: str | None = None,
             id: str | None = None, frm: str | None = None,
             extra: dict[str, Any] | None = None) -> p.Message:
        """A raw message on this peer's connection (its session knows nothing of it)."""
        msg = p.Message(kind, body, ref=ref, frm=self.name if frm is None else frm,
                        to="queen", ts=1.0, extra=extra, **({"id": id} if id else {}))
        self.colony.deliver(self.identity, p.binary.encode(msg))
        return msg

    def take(self, kind: str | None = None) -> list[p.Message]:
        """Received messages (of ``kind``), removed from the inbox."""
        got = [m for m in self.inbox if kind is None or m.kind == kind]
        self.inbox = [m for m in self.inbox if m not in got]
        return got

    def one(self, kind: str) -> p.Message:
        got = self.take(kind)
        assert len(got) == 1, (kind, got, self.inbox)
        return got[0]


def _recording(cls: type[SimPeer]) -> type[SimPeer]:
    """``cls`` that also hands every message it receives to its test-side peer."""

    class Recording(cls):  # type: ignore[valid-type,misc]
        seen: InMemoryPeer | None = None
        hello_extra: dict[str, Any] = {}

        def _receive(self, conn: Conn, frames: list[bytes]) -> None:
            if conn is self.conn and self.seen is not None:
                self.seen.inbox.append(p.decode_any(frames)[0])
            super()._receive(conn, frames)

        def _receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
            if self.seen is not None:
                self.seen.heard.append((topic, p.binary.decode(frames)))
            super()._receive_pub(queen, topic, frames)

        def hello_body(self) -> dict[str, Any]:
            return {**super().hello_body(), **self.hello_extra}

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording


RecordingForager = _recording(SimForager)
RecordingClient = _recording(SimClient)


class ManualForager(RecordingForager):  # type: ignore[valid-type,misc]
    """A forager whose runs the test carries out by hand (raw results on its connection):
    an assignment starts nothing by itself."""

    def _begin(self, start: Any) -> None:
        self.handlers.pop(start.ref, None)


class InMemoryColony:
    """A queen core driven by the simulator's queen driver, its peers real sessions:
    ``deliver`` is a message arriving, ``advance`` the clock."""

    def __init__(self, journal: Any = None, **settings: Any) -> None:
        settings = {**SETTINGS, **settings}
        self.clock = Clock()
        self.clock.now = 100.0
        self.ledger = Ledger()
        self.net = Net(self.clock, random.Random(0), lambda text: None, delay=(0.0, 0.0),
                       slow=0.0)
        self.disk = sqlite3.connect(":memory:", isolation_level=None)
        self.queen = SimQueen("queen", QueenConfig(**settings), clock=self.clock, net=self.net,
                              ledger=self.ledger, rng=random.Random(0), disk=self.disk,
                              log=lambda text: None, journal=journal)
        self.net.queens["queen"] = self.queen
        self.journal = journal
        self.records = 0
        self.queen.on_action = self._counted
        self.queen.start()
        self.peers: dict[str, InMemoryPeer] = {}
        self._uids = itertools.count(1).__next__

    def _counted(self, action: Any) -> None:
        if isinstance(action, Record | RecordMemory):
            self.records += 1

    @property
    def core(self) -> QueenCore:
        core = self.queen.core
        assert core is not None
        return core

    @property
    def now(self) -> float:
        return self.clock.now

    # -- peers ----------------------------------------------------------------------------

    def join(self, role: str, name: str, **hello: Any) -> InMemoryPeer:
        """A peer that says hello (its real session) and is welcomed. ``hello``: fields of
        its hello (``features``, ``slots``, ``tools``, ``labels``, ``session``...)."""
        kw: dict[str, Any] = dict(clock=self.clock, net=self.net, ledger=self.ledger,
                                  rng=random.Random(len(self.peers)), queens=["queen"],
                                  log=lambda text: None)
        peer: SimPeer
        if role == "forager":
            slots = int(hello.pop("slots", 1))
            tools = list(hello.pop("tools", ["echo"]))
            labels = dict(hello.pop("labels", {}))
            peer = ManualForager(name, tools, slots, labels, self._uids, **kw)
        else:
            peer = RecordingClient(name, **kw)
        if "features" in hello:
            hello["features"] = list(hello["features"])
        peer.hello_extra = hello  # type: ignore[attr-defined]
        seen = InMemoryPeer(self, peer)
        peer.seen = seen  # type: ignore[attr-defined]
        self.peers[name] = seen
        peer.start()
        self.settle()
        welcome = seen.one("welcome")
        assert welcome is not None
        return seen

    def forager(self, name: str, **hello: Any) -> InMemoryPeer:
        return self.join("forager", name, **hello)

    def client(self, name: str = "client", **hello: Any) -> InMemoryPeer:
        return self.join("client", name, **hello)

    # -- time and messages ----------------------------------------------------------------

    def deliver(self, identity: bytes, frames: list[bytes]) -> None:
        """Raw frames from the connection ``identity``, handled now."""
        self.queen.deliver(identity, frames)
        self.settle()

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
        are stopped for as long: SIGSTOP)."""
        for seen in self.peers.values():
            if seen not in alive:
                seen.peer.pause(dt)
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
                if not b.get("partial"):
                    assert b["task"] not in out, f"two results for {b['task']}"
                    out[b["task"]] = b
            if m.kind not in ("task.batch", "task.result"):
                client.inbox.append(m)
        return out


__all__ = ["InMemoryColony", "InMemoryPeer"]
