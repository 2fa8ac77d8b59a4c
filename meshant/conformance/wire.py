"""The kit's two ends of a connection, over real ZeroMQ sockets: :class:`Peer` (a DEALER
that plays a forager or a client against a queen) and :class:`FakeQueen` (a ROUTER and a
PUB that play the queen against a forager). Both decode everything they receive with the
strict codec, so a malformed message from the peer under test is a finding, not a crash.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import zmq

from meshant import protocol as p
from meshant.conformance.report import CheckFailed
from meshant.protocol.codec import BINARY, JSON
from meshant.protocol.topics import HB_TOPIC

Match = Callable[[p.Message], bool]


def _wait_for(inbox: list[p.Message], pred: Match, timeout: float,
              recv: Callable[[float], p.Message | None], beat: Callable[[float], None],
              step: float, keep: Match = lambda m: True) -> p.Message | None:
    """The first message ``pred`` accepts: one already kept in ``inbox``, else the next
    read within ``timeout`` (reading at most ``step`` seconds at a time, and calling
    ``beat(now)`` between reads to keep this side alive). What else is read is kept in
    ``inbox`` for later (if ``keep`` says so); None when the time is up."""
    for i, m in enumerate(inbox):
        if pred(m):
            return inbox.pop(i)
    end = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        beat(now)
        left = end - now
        if left <= 0:
            return None
        got = recv(min(left, step))
        if got is None:
            continue
        if pred(got):
            return got
        if keep(got):
            inbox.append(got)


def kind_is(kind: str, ref: str | None = None) -> Match:
    return lambda m: m.kind == kind and (ref is None or m.ref == ref)


class Peer:
    """A raw peer of a queen: sends what it is told, beats while it waits, keeps what it
    has not been asked about yet."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, name: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.name = name
        self.inbox: list[p.Message] = []
        self.ids = p.IdMaker(f"{name}-")
        self.hb_interval = 0.0  # set by a welcome: then it beats while it waits
        self.json = False
        self.batches = 0
        self._pending: list[p.Message] = []
        self._last = time.monotonic()

    def send(self, kind: str, body: dict[str, Any] | None = None, *, ref: str | None = None,
             to: str | list[str] = "queen", frm: str | None = None,
             id: str | None = None, extra: dict[str, Any] | None = None) -> p.Message:
        """``extra``: envelope extension keys (``receipt``, ``ttl``: §6a)."""
        msg = p.Message(kind, body, id=id or self.ids(), frm=self.name if frm is None else frm,
                        to=to, ref=ref, v="1.1" if self.json else "2", extra=extra)
        self.send_raw(p.encode_for(msg, JSON if self.json else BINARY))
        return msg

    def send_raw(self, frames: list[Any]) -> None:
        self.sock.send_multipart(frames)
        self._last = time.monotonic()

    def hello(self, role: str, **body: Any) -> p.Message:
        """Say hello; the answer (welcome or error). A welcome starts the heartbeat."""
        full = {"role": role, "name": self.name, "versions": [2], "codecs": ["msgpack"],
                "features": list(p.negotiation.FEATURES), **body}
        if role == "forager":
            full.setdefault("slots", 1)
        sent = self.send("hello", full)
        answer = self.expect(lambda m: m.ref == sent.id, what="an answer to hello")
        if answer.kind == "welcome":
            self.hb_interval = float(answer.b["hb_interval"])
        return answer

    def _recv(self, timeout: float) -> p.Message | None:
        if self._pending:
            return self._pending.pop(0)
        if not self.sock.poll(max(0, int(timeout * 1000))):
            return None
        frames = self.sock.recv_multipart()
        try:
            msg = p.decode_any(frames)[0]
        except p.ProtocolError as e:
            raise CheckFailed(f"{self.name} received a message that does not decode: {e}") from None
        if msg.kind == "task.batch":
            # Items are processed as if sent one by one (§2.4): so they are seen here.
            self.batches += 1
            self._pending = [p.Message(item.pop("kind", "task.result"), item, id=msg.id,
                                       frm=msg.frm, ref=item.get("task"))
                             for item in msg.b["results"]]
            return self._pending.pop(0) if self._pending else None
        if msg.kind == "task.assigns":
            self.batches += 1
            self._pending = [p.Message("task.assign", {k: v for k, v in item.items() if k != "id"},
                                       id=item["id"], frm=msg.frm)
                             for item in msg.b["assigns"]]
            return self._pending.pop(0) if self._pending else None
        return msg

    def expect(self, match: Match | str, timeout: float = 5.0, what: str = "") -> p.Message:
        """The first message (already received or arriving within ``timeout``) that
        ``match`` accepts (a predicate, or a kind name)."""
        pred = kind_is(match) if isinstance(match, str) else match
        got = self.poll(pred, timeout)
        if got is None:
            seen = ", ".join(f"{m.kind}({m.b.get('code', '')})" if m.kind == "error" else m.kind
                             for m in self.inbox[-6:]) or "nothing"
            raise CheckFailed(f"{self.name}: no {what or match} within {timeout:g} s "
                              f"(last received: {seen})")
        return got

    def poll(self, pred: Match, timeout: float) -> p.Message | None:
        def beat(now: float) -> None:
            if self.hb_interval and now - self._last >= self.hb_interval / 2:
                self.send("hb", {})
        return _wait_for(self.inbox, pred, timeout, self._recv, beat,
                         self.hb_interval / 2 if self.hb_interval else timeout)

    def error(self, sent: p.Message, timeout: float = 5.0) -> str:
        """The code of the error that answers ``sent``."""
        m = self.expect(lambda x: x.kind == "error" and x.ref == sent.id, timeout,
                        f"error answering {sent.kind}")
        return str(m.b["code"])

    def close(self) -> None:
        self.sock.close(0)


class FakeQueen:
    """A ROUTER and a PUB on loopback, ports chosen by the system, that the kit drives
    as a queen: it publishes a heartbeat every interval and records what the forager
    under test sends."""

    def __init__(self, ctx: zmq.Context[Any], hb_interval: float) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub_endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.hb_interval = hb_interval
        self.epoch = secrets.token_hex(8)
        self.ids = p.IdMaker("kq-")
        self.identity: bytes | None = None
        self.codec = BINARY
        self.name = ""
        self.log: list[tuple[float, p.Message, int]] = []  # (when, message, blob frames)
        self.inbox: list[p.Message] = []
        self.decode_errors: list[str] = []
        self.bad_from: list[str] = []
        self._beat = 0.0

    def send(self, kind: str, body: dict[str, Any] | None = None, *, ref: str | None = None,
             id: str | None = None) -> p.Message:
        msg = p.Message(kind, body, id=id or self.ids(), frm="queen", to=self.name, ref=ref,
                        ts=time.time(), v="1.1" if self.codec == JSON else "2")
        self.send_raw(p.encode_for(msg, self.codec))
        return msg

    def send_raw(self, frames: list[Any]) -> None:
        assert self.identity is not None
        self.router.send_multipart([self.identity, *frames])

    def beat(self, epoch: str | None = None) -> None:
        hb = p.Message("hb", {"epoch": epoch or self.epoch, "queen": "queen",
                              "interval": self.hb_interval, "mem_seq": 0}, frm="queen",
                       ts=time.time())
        self.pub.send_multipart([HB_TOPIC, *p.binary.encode(hb)])
        self._beat = time.monotonic()

    def _recv(self, timeout: float) -> p.Message | None:
        if not self.router.poll(max(0, int(timeout * 1000))):
            return None
        identity, *frames = self.router.recv_multipart()
        try:
            msg, codec = p.decode_any(frames)
        except p.ProtocolError as e:
            self.decode_errors.append(str(e))
            return None
        if self.identity is None or msg.kind == "hello":
            self.identity, self.codec = identity, codec  # a reconnect takes a fresh identity
        if self.name and msg.kind != "hello" and msg.frm and msg.frm != self.name:
            self.bad_from.append(f"{msg.kind} from {msg.frm!r}")
        self.log.append((time.monotonic(), msg, len(frames) - 1))
        return msg

    def poll(self, pred: Match, timeout: float) -> p.Message | None:
        def beat(now: float) -> None:
            if self.name and now - self._beat >= self.hb_interval:
                self.beat()
        return _wait_for(self.inbox, pred, timeout, self._recv, beat, self.hb_interval / 2,
                         keep=lambda m: m.kind != "hb")

    def expect(self, match: Match | str, timeout: float = 5.0, what: str = "") -> p.Message:
        pred = kind_is(match) if isinstance(match, str) else match
        got = self.poll(pred, timeout)
        if got is None:
            raise CheckFailed(f"no {what or match} from the forager within {timeout:g} s")
        return got

    def drain(self, seconds: float) -> list[p.Message]:
        """Everything (but heartbeats) that arrives in the next ``seconds``."""
        self.poll(lambda m: False, seconds)
        out, self.inbox = self.inbox, []
        return out

    def close(self) -> None:
        self.router.close(0)
        self.pub.close(0)


def json_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
