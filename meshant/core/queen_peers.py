"""The queen core's handling of peers joining and beating: hello (negotiation,
authorisation, name takeover, adoption), heartbeats, IACP 1.1 registration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshant import protocol as p
from meshant.core.queen_state import (
    HELLO_RATE,
    LEGACY_HB_INTERVAL,
    NAME_TAKEN,
    NOT_ALLOWED,
    RATE_LIMITED,
    TOO_MANY_PEERS,
    QueenState,
)
from meshant.core.registry import ACTIVE, DRAINING, Node
from meshant.protocol.codec import JSON
from meshant.protocol.codes import Code


class PeerHandlers(QueenState):
    """The queen core's handling of peers joining and beating: hello (negotiation,"""

    if TYPE_CHECKING:
        def _inbox_hello(self, node: Node, now: float) -> None: ...

    def _on_hello(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                  now: float) -> None:
        if self._allow(b"hello:" + identity, now, HELLO_RATE):
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED,
                           f"more than {HELLO_RATE:g} hellos per second from this connection",
                           msg.id, retry_after=1.0)
            return
        body = msg.b
        fallback = f"{body.get('role', 'peer')}-{identity.hex()[:8]}"
        decision = p.negotiate(body, self.terms, fallback)
        if isinstance(decision, p.Refusal):
            self._error_to(identity, codec, decision.code, decision.reason, msg.id)
            return
        if self.authorized is not None:
            why = self.authorized.check(self._key, decision.name, decision.role)
            if why is not None:
                self.counters["refused_keys"] += 1
                self._error_to(identity, codec, NOT_ALLOWED, why, msg.id)
                return
        session = str(body.get("session", ""))
        if self.registry.name_taken(decision.name, identity, now, session):
            self.counters["protocol_errors"] += 1
            held = self.registry.by_name[decision.name]
            # When the holder stops beating it is declared offline and the name is free:
            # a restarted peer may wait that long instead of giving up.
            left = max(0.0, held.last_seen + (held.timeout or self.registry.timeout) - now)
            self._error_to(identity, codec, NAME_TAKEN,
                           f"the name {decision.name!r} is held by a live peer; choose another",
                           msg.id, retry_after=round(left + 0.05, 3))
            return
        if node is None and self.registry.full():
            self._error_to(identity, codec, TOO_MANY_PEERS, "the queen has no room for more "
                           "peers", msg.id)
            return
        new = Node(name=decision.name, identity=identity, role=decision.role, codec=codec,
                   slots=decision.slots, tools=frozenset(decision.tools),
                   labels=decision.labels, host=str(body.get("host", "")),
                   pid=int(body.get("pid", 0)), version=decision.version,
                   features=frozenset(decision.features), session=session, key=self._key)
        # The same peer again: on this connection, or reconnected on a fresh one.
        previous: Node | None = node
        if previous is None:
            same = self.registry.by_name.get(decision.name)
            if same is not None and session and same.session == session:
                previous = same
                self.registry.remove(same, now)
        self.registry.add(new, now)
        if decision.role == "forager":
            running = list(body.get("running", []))
            if previous is not None and previous.role == "forager":
                self.scheduler.forager_rejoined(previous, new, running, now)
            if self.scheduler.held:
                self.scheduler.adopt(new, running, now)
            self.scheduler.forager_joined(new)
            stale = [r for r in running if isinstance(r, str) and r not in new.in_flight]
        elif previous is not None and previous.identity != identity:
            self.scheduler.client_moved(previous.identity, identity)
            self.graphs.client_moved(previous.identity, identity)
        self._send(new, p.Message("welcome", decision.body(self.terms), ref=msg.id))
        if decision.role == "forager":
            # Assignments it still runs that this queen no longer holds (it restarted
            # without them, or gave them to another forager): stop them there.
            for ref in stale:
                self._send(new, p.Message("task.cancel", {"task": ref.rpartition(".")[0]},
                                          ref=ref))
        self._inbox_hello(new, now)  # what was kept for this name (queen_converse)

    def _on_hb(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
               now: float) -> None:
        body = msg.b
        if node is None:
            # An IACP 1.1 forager registers with its first heartbeat.
            self._register_legacy(identity, msg, now)
            return
        if body.get("state") == "draining" and node.state == ACTIVE:
            node.state = DRAINING
        if body.get("state") == "leaving":
            self.registry.remove(node, now)
            if node.role == "forager":
                self.scheduler.forager_lost(node, now, "forager left")
            return
        if "load" in body and isinstance(body["load"], int | float):
            node.load = float(body["load"])
        running = body.get("running")
        if running:
            self.scheduler.renew(node, running, now)

    def _register_legacy(self, identity: bytes, msg: p.Message, now: float) -> None:
        body = msg.b
        name = msg.frm
        if not p.valid_name(name):
            self._error_to(identity, JSON, Code.BAD_NAME, f"name {name!r} is not allowed", msg.id)
            return
        if self.registry.name_taken(name, identity, now):
            self._error_to(identity, JSON, NAME_TAKEN,
                           f"the name {name!r} is held by a live peer", msg.id)
            return
        if self.authorized is not None:
            why = self.authorized.check(self._key, name, "forager")
            if why is not None:
                self.counters["refused_keys"] += 1
                self._error_to(identity, JSON, NOT_ALLOWED, why, msg.id)
                return
        slots = body.get("slots", 1)
        tools = body.get("tools", [])
        if not isinstance(slots, int) or slots < 1 or not all(isinstance(t, str) for t in tools):
            self._error_to(identity, JSON, Code.BAD_HELLO,
                           "hb body needs slots >= 1 and a list of tool names", msg.id)
            return
        # IACP 1.1 had partial results and no hello to negotiate them in (spec §8).
        new = Node(name=name, identity=identity, role="forager", codec=JSON, slots=slots,
                   key=self._key, features=frozenset({"progress"}),
                   tools=frozenset(tools), labels=dict(body.get("labels") or {}),
                   version=msg.v)
        # 1.1 peers beat every 10 s; give them the same number of misses at that pace.
        new.timeout = max(self.registry.timeout, LEGACY_HB_INTERVAL * self.registry.hb_misses)
        self.registry.add(new, now)
        self.scheduler.forager_joined(new)
        self._inbox_hello(new, now)  # a 1.1 agent's durable inbox too (queen_converse)

