"""``meshant conformance queen``: the kit plays foragers and clients against a queen.

Every peer is a raw DEALER (:class:`~meshant.conformance.wire.Peer`) with a fresh name
and every task a capability no one else serves (``conformance.<run>.<n>``), so the kit
can run against a live colony without taking or disturbing its work. The task checks
are :mod:`meshant.conformance.queen_tasks_kit`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import zmq

from meshant.conformance.cases import DECODE_CASES, JSON_CASES
from meshant.conformance.queen_converse_kit import ConverseChecks
from meshant.conformance.queen_tasks_kit import TaskChecks
from meshant.conformance.report import CheckFailed, Report, require
from meshant.conformance.wire import Peer, json_line, kind_is


class QueenKit(TaskChecks, ConverseChecks):
    """One run against one queen endpoint."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0,
                 echo: Callable[[str], None] | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.report = Report("queen", endpoint, echo=echo)
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.run_id = secrets.token_hex(3)
        self.peers: list[Peer] = []
        self.n = 0

    def run(self) -> Report:
        r = self.report
        try:
            ok = r.run("q.welcome", self._welcome)
            for cid, fn in (
                ("q.not-registered", self._not_registered), ("q.refusals", self._refusals),
                ("q.name-taken", self._name_taken), ("q.rate-limited", self._rate_limited),
                ("q.decode-errors", self._decode_errors),
                ("q.queen-errors", self._queen_errors), ("q.lifecycle", self._lifecycle),
                ("q.bad-answer", self._bad_answer), ("q.not-yours", self._not_yours),
                ("q.duplicate-task", self._duplicate_task),
                ("q.handler-error", self._handler_error), ("q.rejected", self._rejected),
                ("q.no-forager", self._no_forager), ("q.deadline", self._deadline),
                ("q.cancel", self._cancel), ("q.delayed", self._delayed),
                ("q.schedules", self._schedules), ("q.exhausted", self._exhausted),
                ("q.fencing", self._fencing), ("q.batch", self._batch),
                ("q.features", self._features), ("q.services", self._services),
                ("q.questions", self._questions), ("q.attach", self._attach),
                ("q.steps", self._steps),
                ("q.inbox", self._inbox), ("q.graphs", self._graphs),
                ("q.graph-cancel", self._graph_cancel), ("q.legacy", self._legacy),
            ):
                if ok:
                    r.run(cid, fn)
                else:
                    r.add(cid, "SKIP", "needs a queen that passes q.welcome")
            return r
        finally:
            for peer in self.peers:
                try:
                    if peer.hb_interval:
                        peer.send("hb", {"state": "leaving"})  # leave politely, at once
                except zmq.ZMQError:
                    pass
                peer.close()
            self.ctx.term()

    # -- helpers --------------------------------------------------------------------------

    def name(self, role: str) -> str:
        self.n += 1
        return f"conf-{self.run_id}-{role}{self.n}"

    def cap(self) -> str:
        self.n += 1
        return f"conformance.{self.run_id}.{self.n}"

    def raw(self, role: str = "peer") -> Peer:
        peer = Peer(self.ctx, self.endpoint, self.name(role))
        self.peers.append(peer)
        return peer

    def join(self, role: str, **hello: Any) -> Peer:
        """A registered peer (a welcome, or the check fails)."""
        peer = self.raw(role)
        answer = peer.hello(role, **hello)
        require(answer.kind == "welcome", f"hello as {role} refused: {answer.b}")
        return peer

    def forager(self, tools: list[str], **hello: Any) -> Peer:
        return self.join("forager", tools=tools, **hello)

    def client(self, **hello: Any) -> Peer:
        return self.join("client", **hello)

    # -- negotiation ----------------------------------------------------------------------

    def _welcome(self) -> str:
        peer = self.raw("client")
        asked = ["batch", "progress"]
        sent = peer.send("hello", {"role": "client", "name": peer.name, "versions": [2, 9],
                                   "codecs": ["msgpack"], "features": asked})
        w = peer.expect(lambda m: m.ref == sent.id, self.timeout, "an answer to hello")
        require(w.kind == "welcome", f"answered {w.kind} {w.b}")
        b = w.b
        require(b["version"] == 2, f"version {b['version']}, expected 2 (the highest common)")
        require(set(b["features"]) <= set(asked), f"features {b['features']} not ⊆ {asked}")
        require(b.get("name", peer.name) == peer.name, f"registered as {b.get('name')!r}")
        require(b["hb_interval"] > 0 and b["hb_misses"] >= 1 and b["assign_timeout"] > 0,
                f"terms {b}")
        peer.hb_interval = float(b["hb_interval"])
        self.hb_interval = peer.hb_interval
        return (f"epoch {b['epoch']}, hb {b['hb_interval']} s × {b['hb_misses']}, "
                f"assign_timeout {b['assign_timeout']} s, features {b['features']}")

    def _not_registered(self) -> str:
        peer = self.raw()
        for kind, body in (("task.submit", {"capability": self.cap()}), ("status.query", None),
                           ("hb", {})):
            code = peer.error(peer.send(kind, body), self.timeout)
            require(code == "not-registered", f"{kind} before hello: {code}")
        return ""

    def _refusals(self) -> str:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("role", {"role": "queen-bee"}, "role-refused"),
            ("reserved name", {"name": "queen"}, "bad-name"),
            ("name with a space", {"name": "bad name"}, "bad-name"),
            ("versions", {"versions": [99]}, "no-common-version"),
            ("codecs", {"codecs": ["json"]}, "no-common-codec"),
            ("slots 0", {"role": "forager", "slots": 0}, "bad-hello"),
            ("slots over 10000", {"role": "forager", "slots": 10_001}, "bad-hello"),
            ("an empty tool name", {"role": "forager", "tools": [""]}, "bad-hello"),
        ]
        for what, change, code in cases:
            peer = self.raw()
            body = {"role": "client", "name": peer.name, "versions": [2],
                    "codecs": ["msgpack"], **change}
            got = peer.error(peer.send("hello", body), self.timeout)
            require(got == code, f"hello with bad {what}: {got}, expected {code}")
            again = peer.send("status.query")  # a refusal registers nothing
            require(peer.error(again, self.timeout) == "not-registered",
                    f"a refused hello ({what}) registered the peer")
        return f"{len(cases)} refusals"

    def _name_taken(self) -> str:
        first = self.client(session=secrets.token_hex(8))
        other = self.raw()
        sent = other.send("hello", {"role": "client", "name": first.name, "versions": [2],
                                    "session": secrets.token_hex(8)})
        m = other.expect(lambda x: x.ref == sent.id, self.timeout, "an answer to hello")
        require(m.kind == "error" and m.b["code"] == "name-taken", f"answered {m.kind} {m.b}")
        require(isinstance(m.b.get("retry_after"), int | float), "name-taken without retry_after")
        return ""

    def _rate_limited(self) -> str:
        peer = self.raw("client")
        body = {"role": "client", "name": peer.name, "versions": [2]}
        sent = [peer.send("hello", body) for _ in range(30)]
        ids = {s.id for s in sent}
        answers = [peer.expect(lambda m: m.ref in ids, self.timeout, "an answer to hello")
                   for _ in sent]
        limited = [m for m in answers if m.kind == "error" and m.b["code"] == "rate-limited"]
        require(limited, "30 hellos at once on one connection were all welcomed")
        retry = limited[0].b.get("retry_after")
        require(isinstance(retry, int | float) and retry > 0, f"retry_after is {retry!r}")
        return f"{len(limited)} of 30 refused, retry_after {retry} s"

    def _decode_errors(self) -> str:
        peer = self.client()
        checked = 0
        for desc, frames, code in DECODE_CASES:
            if not frames:
                continue  # ZeroMQ cannot send a message of no frames
            peer.send_raw(frames)
            m = peer.expect(kind_is("error"), self.timeout, f"an error for {desc!r}")
            require(m.b["code"] == code, f"{desc}: {m.b['code']}, expected {code}")
            checked += 1
        for desc, line, code in JSON_CASES:
            peer.send_raw([line])
            m = peer.expect(kind_is("error"), self.timeout, f"an error for {desc!r}")
            require(m.b["code"] == code, f"{desc}: {m.b['code']}, expected {code}")
            checked += 1
        peer.send("status.query")
        peer.expect(lambda m: m.kind == "status.reply",
                    self.timeout, "status.reply after the malformed messages")
        return f"{checked} malformed messages, each refused with its code"

    def _queen_errors(self) -> str:
        c = self.client()
        checks = [
            (c.send("status.query", frm="someone-else"), "bad-from"),
            (c.send("welcome", {"version": 2, "features": [], "hb_interval": 1.0,
                                "hb_misses": 1, "assign_timeout": 1.0, "epoch": "x"}),
             "unsupported"),
            # No recipient at all (one not connected has its message kept: spec §6a).
            (c.send("note", {"text": "hi"}, to=[]), "unknown-recipient"),
            (c.send("task.status", {"task": f"no-such-task-{self.run_id}"}), "unknown-task"),
            (c.send("task.submit", {"capability": self.cap(), "priority": 100}), "bad-value"),
            (c.send("task.submit", {"capability": self.cap(), "max_attempts": 0}), "bad-value"),
            (c.send("task.submit", {"capability": self.cap(), "timeout": -1}), "bad-value"),
        ]
        for sent, code in checks:
            got = c.error(sent, self.timeout)
            require(got == code, f"{sent.kind} ({sent.b or sent.frm}): {got}, expected {code}")
        f = self.forager([self.cap()])
        sent = f.send("task.result", {"status": "ok", "result": 1}, ref=f"nope-{self.run_id}.1")
        m = f.expect(lambda x: x.kind == "error" and x.ref == sent.id, self.timeout)
        require(m.b["code"] == "unknown-task", f"a result for an unknown assign: {m.b}")
        return f"{len(checks) + 1} errors"

    def _services(self) -> str:
        cap = self.cap()
        f = self.forager([cap])
        c = self.client()
        c.send("status.query")
        st = c.expect("status.reply", self.timeout)
        names = [x.get("name") for x in st.b["foragers"]]
        require(f.name in names, f"status.reply does not list {f.name}")
        c.send("tool.query", {"tool": cap})
        tr = c.expect("tool.reply", self.timeout)
        require(tr.b["tool"] == cap and [x["name"] for x in tr.b["foragers"]] == [f.name],
                f"tool.reply {tr.b}")
        key = f"conformance/{self.run_id}"
        sent = c.send("mem.sync", {"op": "set", "key": key, "value": [1, 2]})
        ok = c.expect(lambda m: m.ref == sent.id, self.timeout, "an answer to mem.sync set")
        require(ok.kind == "mem.sync" and ok.b["op"] == "ok" and isinstance(ok.b.get("seq"), int),
                f"mem.sync set answered {ok.kind} {ok.b}")
        sent = c.send("mem.sync", {"op": "snapshot"})
        snap = c.expect(lambda m: m.ref == sent.id, self.timeout, "a snapshot")
        require(snap.b.get("items", {}).get(key) == [1, 2], "the snapshot lacks the key set")
        sent = c.send("mem.sync", {"op": "delete", "key": key})
        c.expect(lambda m: m.ref == sent.id, self.timeout, "an answer to mem.sync delete")
        return ""

    def _legacy(self) -> str:
        cap = self.cap()
        peer = self.raw("legacy")
        peer.json = True

        def send(kind: str, body: dict[str, Any] | None = None, ref: str | None = None) -> None:
            env: dict[str, Any] = {"v": "1.1", "id": peer.ids(), "from": peer.name,
                                   "to": "queen", "kind": kind}
            if ref is not None:
                env["ref"] = ref
            env["ts"] = int(time.time())
            if body is not None:
                env["body"] = body
            peer.send_raw([json_line(env)])

        send("hb", {"slots": 1, "tools": [cap]})
        c = self.client()
        deadline = time.monotonic() + self.timeout
        while True:  # the hb registers it; nothing answers that, so ask the queen
            c.send("tool.query", {"tool": cap})
            if c.expect("tool.reply", self.timeout).b["foragers"]:
                break
            if time.monotonic() > deadline:
                raise CheckFailed("an IACP 1.1 hb did not register the forager")
            time.sleep(0.05)
        sub = c.send("task.submit", {"capability": cap, "payload": "legacy"})
        if not peer.sock.poll(int(self.timeout * 1000)):
            raise CheckFailed("no task.assign for the IACP 1.1 forager")
        raw = peer.sock.recv_multipart()
        require(len(raw) == 1 and raw[0][:1] == b"{", "the assign is not one JSON frame")
        a = json.loads(raw[0])
        require(a.get("v", "").startswith("1.") and a.get("kind") == "task.assign",
                f"not a 1.1 task.assign: {a}")
        require(a["body"].get("node") == sub.id and a["body"].get("payload") == "legacy",
                f"task.assign body {a['body']}")
        send("task.accept", ref=a["id"])
        send("task.result", {"status": "ok", "result": "done"}, ref=a["id"])
        final = self.final(c, sub.id)
        require(final.b.get("result") == "done", f"final {final.b}")
        send("hb", {"slots": 1, "tools": [cap], "state": "leaving"})
        return "registered by hb, assigned and answered in JSON"


def check_queen(endpoint: str, *, timeout: float = 5.0,
                echo: Callable[[str], None] | None = None) -> Report:
    """Play foragers and clients against the queen at ``endpoint`` (a ZeroMQ endpoint of
    its ROUTER), waiting at most ``timeout`` seconds for each answer. Fresh names and
    capabilities keep a live colony's work apart. ``echo`` receives each verdict line; the
    :class:`Report` holds one outcome per queen check."""
    return QueenKit(endpoint, timeout=timeout, echo=echo).run()


__all__ = ["QueenKit", "check_queen"]
