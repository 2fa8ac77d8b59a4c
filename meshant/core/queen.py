"""The queen's logic, sans-IO: peers' messages in, what to do out.

``QueenCore`` owns the registry, the scheduler and the colony memory. A driver (the
:class:`~meshant.actors.queen.Queen` actor, or a test) feeds it what arrives —
``receive(identity, frames, key, now)`` — and the passing of time — ``tick(now)``,
``beat(now)`` — and closes each loop turn with ``end_turn(now)``; then it takes the
actions to carry out, in order, with ``take()``:

* :class:`Send` — a message for one peer (the driver encodes and sends it);
* :class:`Publish` — frames for the PUB socket under a topic;
* :class:`Record` — tasks whose changes the journal must make durable *before* any later
  action of the same turn leaves.

It reads no clock (``now`` is the driver's monotonic time; wall-clock stamps are ``now``
plus the ``wall_offset`` the driver gives) and touches no socket, so whole colony
scenarios run in memory (``tests/colony_sim.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from meshant import protocol as p
from meshant.core.graph_queen import GraphHandlers
from meshant.core.queen_converse import ConverseHandlers
from meshant.core.queen_peers import PeerHandlers
from meshant.core.queen_services import ServiceHandlers
from meshant.core.queen_state import (
    BAD_FROM,
    NOT_REGISTERED,
    UNSUPPORTED,
    Action,
    Grants,
    GraphRecord,
    Handler,
    Publish,
    QueenConfig,
    Record,
    RecordMemory,
    Remember,
    Send,
)
from meshant.core.queen_tasks import TaskHandlers
from meshant.core.registry import Node
from meshant.protocol.codec import BINARY, JSON
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC


class QueenCore(PeerHandlers, TaskHandlers, ServiceHandlers, ConverseHandlers,
                GraphHandlers):
    """The queen's decisions, driven by method calls and a clock argument."""

    def __init__(self, config: QueenConfig, *, epoch: str, wall_offset: float = 0.0,
                 authorized: Grants | None = None, archive: Any = None,
                 restore: Iterable[dict[str, Any]] = (),
                 memory: Iterable[tuple[str, Any, float | None, int]] = (),
                 now: float = 0.0) -> None:
        super().__init__(config, epoch=epoch, wall_offset=wall_offset, authorized=authorized,
                         archive=archive, restore=restore, memory=memory, now=now)
        self._converse_init()  # conversations: after the scheduler restored its tasks
        self._handlers: dict[str, Handler] = {
            "hello": self._on_hello,
            "hb": self._on_hb,
            "task.submit": self._on_submit,
            "task.accept": self._on_accept,
            "task.reject": self._on_reject,
            "task.progress": self._on_progress,
            "task.result": self._on_result,
            "task.batch": self._on_batch,
            "task.cancel": self._on_cancel,
            "task.status": self._on_task_status,
            "status.query": self._on_status,
            "tool.query": self._on_tool_query,
            "msg": self._on_directed,
            "note": self._on_directed,
            "mem.sync": self._on_memory,
            "broadcast": self._on_broadcast,
            "dlq": self._on_dlq,
            "ctl.drain": self._on_control,
            "ctl.halt": self._on_control,
            "task.ask": self._on_ask,  # conversations (queen_converse)
            "task.answer": self._on_answer,
            "task.attach": self._on_attach,
            "inbox": self._on_inbox,
            "graph.submit": self._on_graph_submit,  # task graphs: core/graph_queen.py
            "graph.status": self._on_graph_status,
            "graph.cancel": self._on_graph_cancel,
            "graph.spawn": self._on_graph_spawn,
        }

    def take(self) -> list[Action]:
        """The actions decided since the last call, in the order to carry them out."""
        out, self.out = self.out, []
        self._mem_record = None
        return out

    def receive(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        """One message from the ROUTER: ``frames[0]`` is the peer's identity; ``key`` the
        CURVE key its connection authenticated with (or None)."""
        self._now = now
        self._handle(frames, key, now)

    def tick(self, now: float) -> None:
        """Liveness, leases, deadlines, retries and memory expiry (every few ms)."""
        self._now = now
        sched = self.scheduler
        for node in self.registry.expired(now):
            if node.role == "forager":
                sched.forager_lost(node, now, "forager went silent")
        sched.tick(now)
        for update in self.memory.expire(now):
            self._publish_mem(update)
        self._converse_tick(now)

    def end_turn(self, now: float) -> None:
        """Close a loop turn: assign what can be, journal what changed, then what to send."""
        self._now = now
        sched = self.scheduler
        if sched.dirty:
            sched.dispatch(now)
            if sched.dirty and self.graphs.graphs:
                sched.dispatch(now)  # graph nodes that what dispatch ended unblocked
        if sched.changed or self.deferral.waiting:
            # Durable before anything about it leaves: one record per turn. A young
            # task's first write may wait for its end (core/journal_defer.py).
            write = self.deferral.split(sched.changed.values(), now)
            sched.changed.clear()
            if write:
                self.out.append(Record(write))
        graphs = self.graphs
        if graphs.changed or graphs.changed_nodes:
            self.out.append(GraphRecord(*graphs.take_changes()))
        if sched.out:
            self._converse_turn()  # update logs and watchers, before the sends
            self._flush()
        if self._later:
            later, self._later = self._later, []
            for node, msg in later:
                self._send(node, msg)
        if graphs.outbox:
            # After the turn's task results: a graph's end follows its last node's.
            outbox, graphs.outbox = graphs.outbox, []
            for identity, msg in outbox:
                self._send_to(identity, BINARY, msg)

    def revoke(self, grants: Iterable[bytes], now: float) -> int:
        """Authorized keys changed: drop the live peers whose key is no longer granted."""
        self._now = now
        allowed = set(grants)
        dropped = 0
        for node in list(self.registry.by_id.values()):
            if node.key is not None and node.key not in allowed:
                self.registry.remove(node, now)
                if node.role == "forager":
                    self.scheduler.forager_lost(node, now, "key revoked")
                dropped += 1
        return dropped

    def beat(self, now: float) -> None:
        """The queen's heartbeat on PUB (every ``hb_interval``)."""
        self._now = now
        hb = p.Message("hb", {"epoch": self.epoch, "queen": self.name,
                              "interval": self.registry.hb_interval,
                              "mem_seq": self.memory.seq},
                       frm=self.name, ts=self._wall(now))
        self.out.append(Publish(HB_TOPIC, p.binary.encode(hb)))

    def farewell(self, now: float) -> None:
        """A last heartbeat as the queen stops cleanly: under an epoch of its own, so
        every peer takes the queen for gone at once (and goes to another queen of its
        list, or waits for this one's return) instead of after its heartbeat timeout."""
        self._now = now
        waiting = self.deferral.flush()
        if waiting:  # a clean stop leaves every task it knows in the journal
            self.out.append(Record(waiting))
        hb = p.Message("hb", {"epoch": f"{self.epoch}.stopped", "queen": self.name,
                              "state": "stopping"}, frm=self.name, ts=self._wall(now))
        self.out.append(Publish(HB_TOPIC, p.binary.encode(hb)))

    def status(self, now: float) -> dict[str, Any]:
        """Registry, queue depths and counters (what ``meshant status`` shows).

        Safe to call from another thread: it reads snapshots (``list()`` of a dict is
        atomic under the GIL) and changes nothing.
        """
        peers = list(self.registry.by_id.values())
        foragers = [n.record(now) for n in peers if n.role == "forager"]
        info = self.info
        return {
            "queen": {"name": self.name, "colony": self.config.colony, "epoch": self.epoch,
                      "advertised": info.advertised, "endpoint": info.endpoint,
                      "pub": info.pub, "pid": info.pid, "host": info.host,
                      "uptime": round(now - info.started, 3),
                      "assign_timeout": self.scheduler.assign_timeout,
                      "hb_interval": self.registry.hb_interval,
                      "hb_misses": self.registry.hb_misses},
            "foragers": foragers,
            "clients": sum(1 for n in peers if n.role == "client"),
            "queues": self.scheduler.depths(),
            "queued": self.scheduler.queued,
            "running": sum(f["in_flight"] for f in foragers),
            "counters": {**self.scheduler.counters, **self.counters, **self.graphs.counters},
            "role": "standby" if self.standby is not None else "leader",
            "term": self.term,
            "dead_letters": len(self.scheduler.dlq),
            "breakers": self.scheduler.breakers(),
            "recently_gone": list(self.registry.gone)[-10:],
            "graphs": [g.summary() for g in list(self.graphs.graphs.values())[:100]],
            "journal": journal_location(self.config.journal),
        }

    def _flush(self) -> None:
        out = self.scheduler.out
        self.scheduler.out = []
        mono = self._now
        wall = self._wall(mono)
        by_id = self.registry.by_id
        traces = self.traces
        # Per peer, in one turn: results for a client, assignments for a forager travel
        # as one message when the peer negotiated batching. Anything else sent to that
        # peer first flushes its batch, so the order of what it receives never changes.
        results: dict[bytes, list[dict[str, Any]]] = {}
        assigns: dict[bytes, tuple[Node, list[dict[str, Any]]]] = {}
        for action in out:
            what = action[0]
            if what == "assign":
                node, att = action[1], action[2]
                task = att.task
                body: dict[str, Any] = {"task": task.id, "attempt": att.number,
                                        "capability": task.capability, "payload": task.payload}
                if task.deadline is not None:
                    left = task.deadline - mono
                    body["timeout"] = left
                    body["deadline"] = wall + left
                if node.codec == JSON or task.id[:3] == "tg:":
                    body["node"] = task.id  # a graph node's: "tg:<graph>/<node>"
                tp = traces.get(task.id) if traces else None
                if "batch" in node.features:
                    body["id"] = att.id
                    if tp is not None:
                        body["traceparent"] = tp
                    assigns.setdefault(node.identity, (node, []))[1].append(body)
                    continue
                self._send(node, p.Message("task.assign", body, id=att.id, to=node.name,
                                           ts=wall, extra={"traceparent": tp} if tp else None))
            elif what == "watch":
                self._send_to(action[1], BINARY, p.Message(
                    "task.result", action[3], to=action[2], ref=action[3]["task"], ts=wall))
            elif what == "cancel":
                node, att = action[1], action[2]
                if node.identity in assigns:
                    self._send_assigns(*assigns.pop(node.identity))
                self._send(node, p.Message("task.cancel", {"task": att.task.id}, to=node.name,
                                           ref=att.id, ts=wall))
            else:
                task, kind, body = action[1], action[2], action[3]
                if traces and task.final is not None:
                    traces.pop(task.id, None)
                client = task.client
                if kind != "task.result" or body.get("partial"):
                    # Progress and partial results reach only clients that negotiated them.
                    peer = by_id.get(client)
                    if peer is None or "progress" not in peer.features:
                        continue
                if kind == "task.result":
                    peer = by_id.get(client)
                    if peer is not None and "batch" in peer.features:
                        results.setdefault(client, []).append(body)
                        continue
                if client in results:
                    self._send_results(client, results.pop(client))
                self._send_to(client, BINARY,
                              p.Message(kind, body, to=task.client_name, ref=task.id, ts=wall))
        for node, items in assigns.values():
            self._send_assigns(node, items)
        for client, items2 in results.items():
            self._send_results(client, items2)

    def _send_assigns(self, node: Node, items: list[dict[str, Any]]) -> None:
        if len(items) == 1:
            body = items[0]
            tp = body.pop("traceparent", None)
            self._send(node, p.Message("task.assign", body, id=body.pop("id"), to=node.name,
                                       extra={"traceparent": tp} if tp else None))
        else:
            self._send(node, p.Message("task.assigns", {"assigns": items}, to=node.name))

    def _send_results(self, client: bytes, items: list[dict[str, Any]]) -> None:
        if len(items) == 1:
            msg = p.Message("task.result", items[0], ref=items[0]["task"])
        else:
            msg = p.Message("task.batch", {"results": items})
        self._send_to(client, BINARY, msg)

    def _handle(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        identity = frames[0]
        self._key = key
        self.counters["messages"] += 1
        try:
            msg, codec = p.decode_any(frames[1:], max_frame=self.config.max_message)
        except p.ProtocolError as e:
            self.counters["protocol_errors"] += 1
            codec = JSON if len(frames) == 2 and frames[1][:1] == b"{" else BINARY
            ref = p.binary.peek_id(frames[1:]) if codec == BINARY else None
            self._error_to(identity, codec, e.code, e.message, ref)
            if e.code == p.errors.TOO_LARGE:
                self._oversized_result(identity, frames[1:], now)
            return
        if self.standby is not None:
            if msg.kind != "error":
                # Not this queen's colony now: say so, and where the leader is.
                self._error_to(identity, codec, Code.NOT_LEADER, self.standby.get(
                    "message", "this queen is a standby"), msg.id,
                    **{k: v for k, v in self.standby.items() if k != "message"})
            return
        node = self.registry.by_id.get(identity)
        if node is not None:
            self.registry.touch(node, now)
            if msg.frm and msg.frm != node.name:
                self._error_to(identity, codec, BAD_FROM,
                               f"'from' is {msg.frm!r} but this peer registered as "
                               f"{node.name!r}", msg.id)
                return
        if len(frames) > 2 and node is not None and "blobs" not in node.features:
            self._error_to(identity, codec, UNSUPPORTED, "this peer did not negotiate 'blobs' "
                           "in its hello: send bytes inline, with no blob frames", msg.id)
            return
        handler = self._handlers.get(msg.kind)
        if handler is None:
            if msg.kind == "error":
                return  # an error is never answered (spec §9): two peers could loop
            self._error_to(identity, codec, UNSUPPORTED,
                           f"the queen does not accept {msg.kind!r} messages", msg.id)
            return
        if node is None and msg.kind != "hello" and not (codec == JSON and msg.kind == "hb"):
            # Expected after a restart or a silence: the peer says hello again.
            self.counters["unregistered"] += 1
            if msg.kind == "task.result" and not msg.b.get("partial"):
                # A forager we declared offline sends the result of an attempt we already
                # moved on from: count it as the duplicate it is.
                att = self.scheduler.attempts.get(msg.ref or "")
                if att is not None and not att.live:
                    self.scheduler.counters["duplicates"] += 1
            self._error_to(identity, codec, NOT_REGISTERED,
                           "say hello first: this peer is not registered with the queen",
                           msg.id)
            return
        handler(identity, node, msg, codec, now)


__all__ = ["Action", "GraphRecord", "Publish", "QueenConfig", "QueenCore", "Record",
           "RecordMemory", "Remember", "Send"]


def journal_location(journal: str | None) -> str | None:
    """The journal as ``status`` names it, for `meshant tasks` and the other readers: a
    file's absolute path, a database URL without its password; None for none."""
    if journal is None or journal == ":memory:":
        return None
    if "://" not in journal:
        return os.path.abspath(journal)
    u = urlsplit(journal)
    if u.password is None:
        return journal
    return urlunsplit(u._replace(netloc=u.netloc.replace(f":{u.password}@", "@", 1)))
