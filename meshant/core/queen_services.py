"""The queen core's services besides tasks: status and tool queries, directed messages,
broadcasts, colony memory, the dead-letter queue, drain and halt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshant import protocol as p
from meshant.core.memory import MemoryError_
from meshant.core.queen_state import (
    BAD_TOPIC,
    UNKNOWN_RECIPIENT,
    UNKNOWN_TASK,
    Publish,
    QueenState,
)
from meshant.core.registry import DRAINING, Node
from meshant.core.rights import reserved
from meshant.protocol.codes import Code
from meshant.protocol.topics import TOPIC_MAX, USER_PREFIX, valid_topic


class ServiceHandlers(QueenState):
    """The queen core's services besides tasks: status and tool queries, directed messages,"""

    if TYPE_CHECKING:  # rights and inboxes are queen_converse's
        def _forbidden(self, identity: bytes, node: Node, codec: str, operation: str,
                       msg: p.Message, owner: bool = False) -> bool: ...
        def _keep(self, identity: bytes, node: Node, msg: p.Message, codec: str,
                  missing: list[str], now: float) -> bool: ...

    def _on_status(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        self._send(node, p.Message("status.reply", self.status(now), ref=msg.id))

    def _on_tool_query(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                       now: float) -> None:
        assert node is not None
        tool = msg.b["tool"]
        foragers = [{"name": n.name, "slots": n.slots, "in_flight": len(n.in_flight),
                     "labels": n.labels, "state": n.state}
                    for n in self.registry.serving(tool)]
        self._send(node, p.Message("tool.reply", {"tool": tool, "foragers": foragers},
                                   ref=msg.id))

    def _on_directed(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                     now: float) -> None:
        assert node is not None
        names = msg.recipients
        missing = [n for n in names if n not in self.registry.by_name]
        if not names or not all(isinstance(n, str) and n for n in names):
            self._error_to(identity, codec, UNKNOWN_RECIPIENT,
                           f"no recipient named in {names!r}", msg.id)
            return
        # Names not connected: kept in their durable inboxes (queen_converse).
        if missing and not self._keep(identity, node, msg, codec, missing, now):
            return
        receipt = bool(msg.extra and msg.extra.get("receipt"))
        for name in names:
            target = self.registry.by_name.get(name)
            if target is None:
                continue
            out = p.Message(msg.kind, msg.body, id=msg.id, frm=node.name, to=name, ts=msg.ts,
                            ref=msg.ref, extra=msg.extra)
            self._send(target, out)
            if receipt:
                self._send(node, p.Message("msg.receipt", {
                    "message": msg.id, "to": name, "status": "delivered",
                    "at": self._wall(now)}))

    def _on_broadcast(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                      now: float) -> None:
        assert node is not None
        if self._not_negotiated(identity, node, msg, codec, "broadcast"):
            return
        topic = msg.b["topic"]
        if not valid_topic(topic):
            self._error_to(identity, codec, BAD_TOPIC, f"topic {topic[:40]!r} is not allowed: "
                           f"use 1-{TOPIC_MAX} characters of A-Z a-z 0-9 . _ : / -", msg.id)
            return
        out = p.Message("broadcast", msg.body, id=msg.id, frm=node.name, ts=msg.ts)
        frames = p.binary.encode(out)
        size = sum(len(f) for f in frames)
        limit = self.config.max_broadcast
        if size > limit:
            self._error_to(identity, codec, Code.TOO_LARGE,
                           f"the broadcast is {size:,} bytes, over the queen's limit of "
                           f"{limit:,} (--max-broadcast): send large data as a "
                           "task payload or in colony memory", msg.id)
            return
        # One send on PUB reaches every subscriber; "u." keeps user topics apart from ours.
        self.out.append(Publish(USER_PREFIX + topic.encode(), frames))
        self.counters["broadcasts"] += 1

    def _on_memory(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        if self._not_negotiated(identity, node, msg, codec, "mem.sync"):
            return
        b = msg.b
        op = b.get("op")
        if op in ("set", "delete") and reserved(b.get("key")) and self._forbidden(
                identity, node, codec, "mem.reserved", msg):
            return
        try:
            if op == "snapshot":
                self._send(node, p.Message("mem.sync", self.memory.snapshot(), ref=msg.id))
                return
            if op == "set":
                ttl = b.get("ttl")
                update: dict[str, Any] | None = self.memory.set(
                    b.get("key"), b.get("value"), now,  # type: ignore[arg-type]
                                         float(ttl) if ttl is not None else None)
            elif op == "delete":
                update = self.memory.delete(b.get("key"))  # type: ignore[arg-type]
            else:
                self._error_to(identity, codec, Code.BAD_VALUE,
                               "mem.sync op must be set, delete or snapshot", msg.id)
                return
        except MemoryError_ as e:
            self._error_to(identity, codec, e.code, e.message, msg.id)
            return
        if update is not None:
            self._publish_mem(update)
        self._send(node, p.Message("mem.sync", {"op": "ok", "seq": self.memory.seq},
                                   ref=msg.id))

    def _not_negotiated(self, identity: bytes, node: Node, msg: p.Message, codec: str,
                        feature: str) -> bool:
        """A feature not negotiated is not used (spec §5): refuse its messages."""
        if feature in node.features:
            return False
        self.counters["protocol_errors"] += 1
        self._error_to(identity, codec, Code.UNSUPPORTED, f"this peer did not negotiate "
                       f"{feature!r} in its hello: no {msg.kind} messages", msg.id)
        return True

    def _on_dlq(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                now: float) -> None:
        assert node is not None
        b = msg.b
        op = b["op"]
        if op in ("retry", "purge") and self._forbidden(identity, node, codec, f"dlq.{op}", msg):
            return
        dlq = self.scheduler.dlq
        one = b.get("task")
        wanted: list[str] = list(dlq) if b.get("all") else [one] if isinstance(one, str) else []
        missing = [t for t in wanted if t not in dlq]
        if op in ("show", "retry", "purge") and (not wanted or missing):
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"no dead letter {', '.join(map(str, missing)) or '(none given)'}",
                           msg.id)
            return
        if op in ("list", "show"):
            chosen = wanted if op == "show" else list(dlq)
            items = [{"task": t.id, "capability": t.capability, "error": (t.final or {}).get(
                "error"), "attempts": t.attempt, "client": t.client_name,
                "payload": t.payload if op == "show" else None} for t in
                (dlq[i] for i in chosen)]
            self._send(node, p.Message("dlq.reply", {"op": op, "items": items}, ref=msg.id))
            return
        if op == "retry":
            new = [self.scheduler.dlq_retry(t, identity, node.name, now).id for t in wanted]
            self._send(node, p.Message("dlq.reply", {"op": op, "tasks": new}, ref=msg.id))
            return
        if op == "purge":
            for t in wanted:
                self.scheduler.dlq_purge(t)
            self._send(node, p.Message("dlq.reply", {"op": op, "tasks": wanted}, ref=msg.id))
            return
        self._error_to(identity, codec, Code.BAD_VALUE, "dlq op must be list, show, retry or purge",
                       msg.id)

    def _on_control(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                    now: float) -> None:
        """ctl.drain / ctl.halt for a forager, from a client (or the CLI)."""
        assert node is not None
        if self._forbidden(identity, node, codec, msg.kind, msg):
            return
        names = msg.recipients
        targets = [self.registry.by_name.get(n) for n in names]
        if not names or any(t is None or t.role != "forager" for t in targets):
            self._error_to(identity, codec, UNKNOWN_RECIPIENT,
                           f"no live forager named {', '.join(names) or '(none given)'}",
                           msg.id)
            return
        for target in targets:
            assert target is not None
            self._send(target, p.Message(msg.kind, msg.body, frm=node.name))
            if msg.kind == "ctl.drain":
                target.state = DRAINING  # assign nothing more to it, at once
            else:
                self.registry.remove(target, now)
                self.scheduler.forager_lost(target, now, "forager halted")
        self.counters[msg.kind.replace(".", "_")] += 1

    # -- output ---------------------------------------------------------------------------

