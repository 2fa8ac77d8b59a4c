"""The queen's services besides tasks: status and tool queries, directed messages,
broadcasts, the dead-letter queue, and drain and halt of foragers.

A service of the queen core (:mod:`meshant.core.queen.router`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshant import protocol as p
from meshant.core.nodes.registry import ACTIVE
from meshant.core.queen.admission_service import AdmissionService
from meshant.core.queen.conversation_service import ConversationService
from meshant.core.queen.outbox import Publish
from meshant.core.queen.state import QueenState, Request
from meshant.core.tasks.scheduler import Scheduler
from meshant.protocol.codes import Code
from meshant.protocol.topics import TOPIC_MAX, USER_PREFIX, valid_topic


class OperationsService:
    """Queries, messages between agents, broadcasts, dead letters, drain and halt."""

    def __init__(self, state: QueenState, scheduler: Scheduler, conversations: ConversationService,
                 admission: AdmissionService, status: Callable[[float], dict[str, Any]]) -> None:
        self.state = state
        self.scheduler = scheduler
        self.conversations = conversations
        self.admission = admission
        self.status_of = status

    def status(self, req: Request) -> None:
        self.state.send(req.node, p.Message("status.reply", self.status_of(req.now),
                                            ref=req.msg.id))

    def tool_query(self, req: Request) -> None:
        tool = req.msg.b["tool"]
        foragers = [{"name": n.name, "slots": n.slots, "in_flight": n.busy,
                     "labels": n.labels, "state": n.state,
                     **((n.describe or {}).get(tool) or {})}
                    for n in self.state.registry.serving(tool)]
        self.state.send(req.node, p.Message("tool.reply", {"tool": tool,
                                                           "foragers": foragers},
                                            ref=req.msg.id))

    def directed(self, req: Request) -> None:
        st, msg, node = self.state, req.msg, req.node
        by_name = st.registry.by_name
        names = msg.recipients
        if not names or not all(isinstance(n, str) and n for n in names):
            st.refuse(req, Code.UNKNOWN_RECIPIENT, f"no recipient named in {names!r}")
            return
        missing = [n for n in names if n not in by_name]
        # Names not connected: kept in their durable inboxes.
        if missing and not self.conversations.keep(req, missing):
            return
        receipt = bool(msg.extra and msg.extra.get("receipt"))
        for name in names:
            target = by_name.get(name)
            if target is None:
                continue
            out = p.Message(msg.kind, msg.body, id=msg.id, frm=node.name, to=name, ts=msg.ts,
                            ref=msg.ref, extra=msg.extra)
            st.send(target, out)
            if receipt:
                st.send(node, p.Message("msg.receipt", {
                    "message": msg.id, "to": name, "status": "delivered",
                    "at": st.wall(req.now)}))

    def broadcast(self, req: Request) -> None:
        st, msg = self.state, req.msg
        if st.not_negotiated(req, "broadcast"):
            return
        topic = msg.b["topic"]
        if not valid_topic(topic):
            st.refuse(req, Code.BAD_TOPIC, f"topic {topic[:40]!r} is not allowed: use "
                      f"1-{TOPIC_MAX} characters of A-Z a-z 0-9 . _ : / -")
            return
        out = p.Message("broadcast", msg.body, id=msg.id, frm=req.node.name, ts=msg.ts)
        frames = p.binary.encode(out)
        size = sum(len(f) for f in frames)
        limit = st.config.max_broadcast
        if size > limit:
            st.refuse(req, Code.TOO_LARGE, f"the broadcast is {size:,} bytes, over the "
                      f"queen's limit of {limit:,} (--max-broadcast): send large data as a "
                      "task payload or in colony memory")
            return
        # One send on PUB reaches every subscriber; "u." keeps user topics apart from ours.
        st.out.actions.append(Publish(USER_PREFIX + topic.encode(), frames))
        st.counters["broadcasts"] += 1

    def dlq(self, req: Request) -> None:
        st, node, b = self.state, req.node, req.msg.b
        op = b["op"]
        if op in ("retry", "purge") and st.forbidden(req, f"dlq.{op}"):
            return
        sched = self.scheduler
        dlq = sched.dlq
        one = b.get("task")
        wanted: list[str] = list(dlq) if b.get("all") else [one] if isinstance(one, str) else []
        missing = [t for t in wanted if t not in dlq]
        if op in ("show", "retry", "purge") and (not wanted or missing):
            st.refuse(req, Code.UNKNOWN_TASK,
                      f"no dead letter {', '.join(map(str, missing)) or '(none given)'}")
            return
        ref = req.msg.id
        if op in ("list", "show"):
            chosen = wanted if op == "show" else list(dlq)
            items = [{"task": t.id, "capability": t.capability, "error": (t.final or {}).get(
                "error"), "attempts": t.attempt, "client": t.client_name,
                "payload": t.payload if op == "show" else None} for t in
                (dlq[i] for i in chosen)]
            st.send(node, p.Message("dlq.reply", {"op": op, "items": items}, ref=ref))
        elif op == "retry":
            new = [sched.dlq_retry(t, req.identity, node.name, req.now).id for t in wanted]
            st.send(node, p.Message("dlq.reply", {"op": op, "tasks": new}, ref=ref))
        elif op == "purge":
            for t in wanted:
                sched.dlq_purge(t)
            st.send(node, p.Message("dlq.reply", {"op": op, "tasks": wanted}, ref=ref))
        else:
            st.refuse(req, Code.BAD_VALUE, "dlq op must be list, show, retry or purge")

    def control(self, req: Request) -> None:
        """ctl.drain / ctl.halt for a forager, from a client (or the CLI)."""
        st, msg, node = self.state, req.msg, req.node
        if st.forbidden(req, msg.kind):
            return
        names = msg.recipients
        targets = [st.registry.by_name.get(n) for n in names]
        if not names or any(t is None or t.role != "forager" for t in targets):
            st.refuse(req, Code.UNKNOWN_RECIPIENT,
                      f"no live forager named {', '.join(names) or '(none given)'}")
            return
        for target in targets:
            assert target is not None
            st.send(target, p.Message(msg.kind, msg.body, frm=node.name))
            if msg.kind == "ctl.drain":
                if target.state == ACTIVE:
                    st.registry.drain(target)  # assign nothing more to it, at once
            else:
                self.admission.halt(target, req.now)
        st.counters[msg.kind.replace(".", "_")] += 1


__all__ = ["OperationsService"]
