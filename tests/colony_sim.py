"""A whole colony in memory: a QueenCore, scripted peers and a fake clock (like h11's
ConnectionPair). Every message goes through the real codec both ways, so what the
peers see is what they would read off a socket; no socket, thread or sleep is involved.
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.actors._reads import answer
from meshant.core.queen import (
    GraphRecord,
    Publish,
    QueenConfig,
    QueenCore,
    Read,
    Record,
    RecordMemory,
    Remember,
    Send,
)
from meshant.storage.commit import commit
from meshant.storage.journal import Journal


class SimPeer:
    """One peer: what it sent is decoded by the queen core, what it received is kept."""

    def __init__(self, colony: SimColony, name: str, identity: bytes) -> None:
        self.colony = colony
        self.name = name
        self.identity = identity
        self.inbox: list[p.Message] = []
        self.heard: list[tuple[bytes, p.Message]] = []  # PUB messages

    def send(self, kind: str, body: Any = None, *, ref: str | None = None,
             id: str | None = None, frm: str | None = None) -> p.Message:
        msg = p.Message(kind, body, ref=ref, frm=self.name if frm is None else frm,
                        to="queen", ts=1.0, **({"id": id} if id else {}))
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


class SimColony:
    """A QueenCore driven by hand: ``deliver`` is a message arriving, ``advance`` the clock."""

    def __init__(self, journal: Journal | None = None, **settings: Any) -> None:
        settings.setdefault("hb_interval", 1.0)
        settings.setdefault("hb_misses", 3)
        self.now = 100.0
        self.journal = journal
        self.core = QueenCore(QueenConfig(**settings), epoch="epoch-1", wall_offset=1e9,
                              restored=journal.restored() if journal else None, now=self.now)
        self.peers: dict[bytes, SimPeer] = {}
        self.records = 0

    def join(self, role: str, name: str, **hello: Any) -> SimPeer:
        peer = SimPeer(self, name, f"id-{name}-{len(self.peers)}".encode())
        self.peers[peer.identity] = peer
        body = {"role": role, "name": name, "versions": [2], "codecs": ["msgpack"],
                "features": list(hello.pop("features", p.negotiation.FEATURES)), **hello}
        if role == "forager":
            body.setdefault("slots", 1)
            body.setdefault("tools", ["echo"])
        peer.send("hello", body)
        peer.one("welcome")
        return peer

    def forager(self, name: str, **hello: Any) -> SimPeer:
        return self.join("forager", name, **hello)

    def client(self, name: str = "client", **hello: Any) -> SimPeer:
        return self.join("client", name, **hello)

    def deliver(self, identity: bytes, frames: list[bytes]) -> None:
        self.core.receive([identity, *frames], None, self.now)
        self.settle()

    def advance(self, dt: float) -> None:
        """Let ``dt`` seconds pass in small steps, as the driver's ticks would."""
        end = self.now + dt
        while self.now < end:
            self.now = min(end, self.now + 0.05)
            self.core.tick(self.now)
            self.settle()

    def pass_time(self, dt: float, *alive: SimPeer) -> None:
        """Let ``dt`` seconds pass while the ``alive`` peers heartbeat each half second."""
        end = self.now + dt
        while self.now < end:
            self.advance(min(0.5, end - self.now))
            for peer in alive:
                peer.send("hb", {})

    def settle(self) -> None:
        """End the turn and carry out what the core decided."""
        core = self.core
        core.end_turn(self.now)
        reads = []
        for a in core.take():
            if isinstance(a, Send):
                peer = self.peers.get(a.identity)
                if peer is not None:
                    frames = p.encode_for(a.msg, a.codec)
                    peer.inbox.append(p.decode_any(frames)[0])
            elif isinstance(a, Publish):
                msg = p.binary.decode(a.frames)
                for peer in self.peers.values():
                    peer.heard.append((a.topic, msg))
            elif isinstance(a, Record | RecordMemory | Remember | GraphRecord):
                self.records += isinstance(a, Record | RecordMemory)
                if self.journal is not None:
                    commit(self.journal, a, 1e9)
            elif isinstance(a, Read):
                reads.append(a)
        for r in reads:
            if r.token == 0:
                core.fetched_names(answer(self.journal, r))
            else:
                core.fetched(r.token, answer(self.journal, r), self.now)
        if reads:
            self.settle()

    # -- conveniences for forager and client scripts ----------------------------------

    def assigns(self, forager: SimPeer) -> list[dict[str, Any]]:
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
    def results(client: SimPeer) -> dict[str, dict[str, Any]]:
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
