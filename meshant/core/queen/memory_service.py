"""Colony memory at the queen: ``mem.sync`` requests (set, delete, snapshot), every change
journaled before it is published to all agents, and keys expiring on their TTL.

A service of the queen core (:mod:`meshant.core.queen.router`) over the
:class:`~meshant.core.memory.model.MemoryStore`.
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.core.memory.model import DELETED, MemoryError_, MemoryStore
from meshant.core.queen.outbox import Publish, RecordMemory
from meshant.core.queen.state import QueenState, Request
from meshant.core.rights import reserved
from meshant.protocol.codes import Code
from meshant.protocol.topics import MEM_TOPIC


class MemoryService:
    """The authoritative colony memory and its journal records."""

    def __init__(self, state: QueenState, journaled: bool,
                 restore: list[tuple[str, Any, float | None, int]], now: float) -> None:
        self.state = state
        self.journaled = journaled
        self.store = MemoryStore(state.config.mem_max_keys, state.config.mem_max_value)
        if journaled:
            self.store.restore(restore, now, state.wall(now))

    def publish(self, update: dict[str, Any], now: float) -> None:
        st = self.state
        if self.journaled:
            # Durable before anyone hears of it (the journal keeps the memory across a
            # restart or a failover).
            key = update["key"]
            change: tuple[str, Any, float | None, int]
            if update.get("deleted"):
                change = (key, DELETED, None, update["seq"])
            else:
                exp = self.store.expires.get(key)
                change = (key, update.get("value"),
                          None if exp is None else st.wall(exp), update["seq"])
            # One record a turn, however many keys change (a thousand keys expiring at
            # once are one transaction): it stands before the first change's publication,
            # so before every later one too.
            out = st.out
            rec = out.memory_record
            if rec is None:
                rec = out.memory_record = RecordMemory([])
                out.actions.append(rec)
            rec.changes.append(change)
        msg = p.Message("mem.sync", update, frm=st.name, ts=st.wall(now))
        st.out.actions.append(Publish(MEM_TOPIC, p.binary.encode(msg)))

    def request(self, req: Request) -> None:
        st, node, now = self.state, req.node, req.now
        if st.not_negotiated(req, "mem.sync"):
            return
        b = req.msg.b
        op = b.get("op")
        if op in ("set", "delete") and reserved(b.get("key")) and st.forbidden(
                req, "mem.reserved"):
            return
        store = self.store
        try:
            if op == "snapshot":
                st.send(node, p.Message("mem.sync", store.snapshot(), ref=req.msg.id))
                return
            update: dict[str, Any] | None
            if op == "set":
                ttl = b.get("ttl")
                update = store.set(b.get("key"), b.get("value"), now,  # type: ignore[arg-type]
                                   float(ttl) if ttl is not None else None)
            elif op == "delete":
                update = store.delete(b.get("key"))  # type: ignore[arg-type]
            else:
                st.refuse(req, Code.BAD_VALUE, "mem.sync op must be set, delete or snapshot")
                return
        except MemoryError_ as e:
            st.refuse(req, e.code, e.message)
            return
        if update is not None:
            self.publish(update, now)
        st.send(node, p.Message("mem.sync", {"op": "ok", "seq": store.seq}, ref=req.msg.id))

    def tick(self, now: float) -> None:
        for update in self.store.expire(now):
            self.publish(update, now)


__all__ = ["MemoryService"]
