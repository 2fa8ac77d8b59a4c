"""The queen core's graph messages: submit, status, cancel (clients) and spawn (a running
node's forager). The graphs themselves are :class:`meshant.core.graph_book.GraphBook`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshant import protocol as p
from meshant.core.graph import GraphError, split_task_id
from meshant.core.graph_book import Graph
from meshant.core.queen_state import NOT_YOURS, RATE_LIMITED, UNKNOWN_TASK, QueenState
from meshant.core.registry import Node
from meshant.core.scheduler import QueueFull
from meshant.protocol.codes import Code


class GraphHandlers(QueenState):
    """``graph.submit``, ``graph.status``, ``graph.cancel``, ``graph.spawn``."""

    if TYPE_CHECKING:  # rights are queen_converse's
        def _forbidden(self, identity: bytes, node: Node, codec: str, operation: str,
                       msg: p.Message, owner: bool = False) -> bool: ...

    def _on_graph_submit(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                         now: float) -> None:
        assert node is not None
        book = self.graphs
        gid = msg.id
        known = book.graphs.get(gid)
        if known is None and gid not in book.done and self.scheduler.archive is not None:
            old = self.scheduler.archive.find_graph(gid)  # ended before a restart
            if old is not None:
                book.done[gid] = {k: v for k, v in old.items() if k != "node_states"}
        if known is not None or gid in book.done:
            self._graph_again(identity, node, msg, codec, known)
            return
        slow = self._allow(identity, now, self.config.submit_rate)
        if slow:
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED, "more than "
                           f"{self.config.submit_rate:g} submissions per second from this "
                           "peer: slow down", msg.id, retry_after=round(slow, 4))
            return
        if "/" in gid:
            self._error_to(identity, codec, Code.BAD_GRAPH, f"graph id {gid!r} cannot be "
                           "used (no '/' in a graph id)", msg.id)
            return
        try:
            g = book.submit(gid, msg.b["nodes"], identity, node.name, now,
                            updates=bool(msg.b.get("updates")))
        except GraphError as e:
            self._error_to(identity, codec, e.code, e.message, msg.id)
            return
        except QueueFull as e:
            self._error_to(identity, codec, Code.QUEUE_FULL, f"queue full: {e}", msg.id)
            return
        self._send(node, p.Message("graph.submitted", {"graph": gid, "nodes": len(g.nodes)},
                                   ref=msg.id))

    def _graph_again(self, identity: bytes, node: Node, msg: p.Message, codec: str,
                     g: Graph | None) -> None:
        """A graph id the queen holds: its client sending it again after a reconnect.
        Results go to the new connection; what it may have missed is sent again."""
        book = self.graphs
        owner = g.client_name if g is not None else book.done[msg.id].get("client")
        if owner != node.name:
            self._error_to(identity, codec, Code.DUPLICATE_TASK, f"a graph with id {msg.id!r} "
                           "was submitted by another client", msg.id)
            return
        self.counters["resubmitted"] += 1
        if g is None:
            self._send(node, p.Message("graph.result", book.done[msg.id], ref=msg.id))
            return
        g.client = identity
        prefix = f"tg:{g.id}/"
        for t in self.scheduler.tasks.values():
            if t.id.startswith(prefix):
                t.client = identity  # also the tasks restored after a queen restart
        self._send(node, p.Message("graph.submitted", {"graph": g.id, "nodes": len(g.nodes)},
                                   ref=msg.id))
        for n in g.nodes.values():
            if n.state in ("completed", "failed", "cancelled"):
                body: dict[str, Any] = {"graph": g.id, "node": n.name, "state": n.state,
                                        "task": f"tg:{g.id}/{n.name}"}
                if n.state == "completed":
                    body["result"] = n.result
                elif n.error is not None:
                    body["error"] = n.error
                self._send(node, p.Message("graph.node", body))

    def _graph_of(self, identity: bytes, node: Node | None, msg: p.Message,
                  codec: str) -> Graph | None:
        # Any client may name a graph by id (``meshant graph cancel`` is a process of its
        # own); what it may do with it is checked by the caller (rights).
        g = self.graphs.graphs.get(msg.b["graph"])
        if g is None or node is None or node.role != "client":
            self._error_to(identity, codec, Code.UNKNOWN_GRAPH,
                           f"no running graph {msg.b['graph']!r}", msg.id)
            return None
        return g

    def _on_graph_status(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                         now: float) -> None:
        assert node is not None
        st = self.graphs.status(msg.b["graph"])
        if st is None and self.scheduler.archive is not None:
            st = self.scheduler.archive.find_graph(msg.b["graph"])
        if st is None:
            self._error_to(identity, codec, Code.UNKNOWN_GRAPH, f"no graph {msg.b['graph']!r}",
                           msg.id)
            return
        self._send(node, p.Message("graph.state", st, ref=msg.id))

    def _on_graph_cancel(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                         now: float) -> None:
        g = self._graph_of(identity, node, msg, codec)
        # With CURVE, another client's graph only with an admin key (core/rights.py).
        if g is not None and node is not None and not self._forbidden(
                identity, node, codec, "graph.cancel", msg, g.client_name == node.name):
            self.graphs.cancel(g, now)

    def _on_graph_spawn(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                        now: float) -> None:
        assert node is not None
        verdict, att = self.scheduler.lookup(node, msg.ref)
        where = split_task_id(att.task.id) if att is not None else None
        if verdict != "ok" or att is None or where is None:
            why = ("only a graph node's current attempt may spawn nodes" if verdict == "ok"
                   or verdict == "duplicate" else f"no assign {msg.ref!r} for this forager")
            self._error_to(identity, codec, NOT_YOURS if verdict == "foreign" else UNKNOWN_TASK,
                           why, msg.id)
            return
        g = self.graphs.graphs.get(where[0])
        if g is None or g.cancelled:
            self._error_to(identity, codec, Code.UNKNOWN_GRAPH,
                           f"graph {where[0]!r} is not running", msg.id)
            return
        try:
            names = self.graphs.spawn(g, where[1], msg.b["nodes"], now)
        except GraphError as e:
            self._error_to(identity, codec, e.code, e.message, msg.id)
            return
        self.scheduler.accept(att, now)  # a spawning node is running: renew its lease
        self._send(node, p.Message("graph.spawned", {"graph": g.id, "nodes": names},
                                   ref=msg.id))
