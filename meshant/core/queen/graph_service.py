"""Task graphs' messages at the queen: ``graph.submit``, ``graph.status``,
``graph.cancel`` (clients) and ``graph.spawn`` (a running node's forager). The graphs
themselves are :class:`meshant.core.graphs.book.GraphBook`'s.

A service of the queen core (:mod:`meshant.core.queen.router`).
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.core.graphs.book import Graph, GraphBook, node_end, public
from meshant.core.graphs.model import GraphError
from meshant.core.journal.archive import ArchiveIndex
from meshant.core.queen.reads import ReadKey, Reads
from meshant.core.queen.state import QueenState, Request
from meshant.core.tasks.model import graph_node_id, graph_node_of
from meshant.core.tasks.scheduler import QueueFull, Scheduler, Verdict
from meshant.protocol.codes import Code


class GraphService:
    """Graph requests over the book of running graphs."""

    def __init__(self, state: QueenState, book: GraphBook, scheduler: Scheduler,
                 index: ArchiveIndex | None, reads: Reads) -> None:
        self.state = state
        self.book = book
        self.scheduler = scheduler
        self.index = index
        self.reads = reads

    def _graph_read(self, gid: str, results: bool = False) -> ReadKey | None:
        """The read that finds graph ``gid`` in the journal (None: memory has it, or the
        journal surely has not). ``results``: an ended graph's node results are wanted
        too (memory may have let them go)."""
        book = self.book
        if (gid in book.graphs or (gid in book.done and (not results or book.has_results(gid)))
                or self.index is None or not self.index.maybe("g", gid)):
            return None
        return ("graph", gid)

    def needs_graph(self, req: Request) -> list[ReadKey]:
        """A graph submitted (its id may be one that ended before a restart) or asked
        about: the journal's row of it, if memory lacks it."""
        submit = req.msg.kind == "graph.submit"
        read = self._graph_read(req.msg.id if submit else req.msg.b["graph"], results=submit)
        return [read] if read is not None else []

    def _ended(self, req: Request, gid: str, results: bool = False) -> dict[str, Any] | None:
        """A graph that ended (in memory, else from the journal)."""
        read = self._graph_read(gid, results)
        if read is None:
            return self.book.done.get(gid)
        summary: dict[str, Any] | None = self.reads.value(req, *read)
        return summary

    def submit(self, req: Request) -> None:
        st, msg, node, now = self.state, req.msg, req.node, req.now
        book = self.book
        gid = msg.id
        known = book.graphs.get(gid)
        if known is None and not book.has_results(gid):
            old = self._ended(req, gid, results=True)  # ended before a restart
            if old is not None:
                book.remember(gid, old)
        if known is not None or gid in book.done:
            self._again(req, known)
            return
        slow = st.rates.wait(req.identity, now, st.config.submit_rate)
        if slow:
            st.counters["rate_limited"] += 1
            st.refuse(req, Code.RATE_LIMITED, "more than "
                      f"{st.config.submit_rate:g} submissions per second from this "
                      "peer: slow down", retry_after=round(slow, 4))
            return
        if "/" in gid:
            st.refuse(req, Code.BAD_GRAPH, f"graph id {gid!r} cannot be used (no '/' in a "
                      "graph id)")
            return
        try:
            g = book.submit(gid, msg.b["nodes"], req.identity, node.name, now,
                            updates=bool(msg.b.get("updates")))
        except GraphError as e:
            st.refuse(req, e.code, e.message)
            return
        except QueueFull as e:
            st.refuse(req, Code.QUEUE_FULL, f"queue full: {e}")
            return
        if self.index is not None:
            self.index.add("g", gid)
        st.send(node, p.Message("graph.submitted", {"graph": gid, "nodes": len(g.nodes)},
                                ref=msg.id))

    def _again(self, req: Request, g: Graph | None) -> None:
        """A graph id the queen holds: its client sending it again after a reconnect.
        Results go to the new connection; what it may have missed is sent again."""
        st, msg, node = self.state, req.msg, req.node
        book = self.book
        owner = g.client_name if g is not None else book.done[msg.id].get("client")
        if owner != node.name:
            st.refuse(req, Code.DUPLICATE_TASK, f"a graph with id {msg.id!r} was submitted "
                      "by another client")
            return
        st.counters["resubmitted"] += 1
        if g is None:
            # It ended meanwhile (perhaps on this queen, restored after a failover, while
            # its nodes' results went to a connection long gone): every node's end, then
            # the graph's, as for a running graph.
            for end in book.ended_nodes(msg.id):
                st.send(node, p.Message("graph.node", end))
            st.send(node, p.Message("graph.result", book.result_of(msg.id), ref=msg.id))
            return
        book.client_moved(g, req.identity)  # its nodes' tasks too (restored ones among them)
        st.send(node, p.Message("graph.submitted", {"graph": g.id, "nodes": len(g.nodes)},
                                ref=msg.id))
        for n in g.nodes.values():
            if n.state in ("completed", "failed", "cancelled"):
                st.send(node, p.Message("graph.node", node_end(
                    g.id, n.name, n.state, graph_node_id(g.id, n.name), n.result, n.error)))

    def status(self, req: Request) -> None:
        gid = req.msg.b["graph"]
        st = self.book.status(gid)
        if st is None:
            st = self._ended(req, gid)
            st = public(st) if st is not None else None
        if st is None:
            self.state.refuse(req, Code.UNKNOWN_GRAPH, f"no graph {gid!r}")
            return
        self.state.send(req.node, p.Message("graph.state", st, ref=req.msg.id))

    def cancel(self, req: Request) -> None:
        # Any client may name a graph by id (``meshant graph cancel`` is a process of its
        # own); with CURVE, another client's graph only with an admin key (core/rights.py).
        g = self.book.graphs.get(req.msg.b["graph"])
        if g is None or req.node.role != "client":
            self.state.refuse(req, Code.UNKNOWN_GRAPH,
                              f"no running graph {req.msg.b['graph']!r}")
            return
        if self.state.forbidden(req, "graph.cancel", g.client_name == req.node.name):
            return
        self.book.cancel(g, req.now)

    def spawn(self, req: Request) -> None:
        st, msg, now = self.state, req.msg, req.now
        verdict, att = self.scheduler.lookup(req.node, msg.ref)
        where = graph_node_of(att.task.id) if att is not None else None
        if verdict is not Verdict.OK or att is None or where is None:
            why = ("only a graph node's current attempt may spawn nodes"
                   if verdict in (Verdict.OK, Verdict.DUPLICATE)
                   else f"no assign {msg.ref!r} for this forager")
            st.refuse(req, Code.NOT_YOURS if verdict is Verdict.FOREIGN else Code.UNKNOWN_TASK,
                      why)
            return
        g = self.book.graphs.get(where[0])
        if g is None or g.cancelled:
            st.refuse(req, Code.UNKNOWN_GRAPH, f"graph {where[0]!r} is not running")
            return
        try:
            names = self.book.spawn(g, where[1], msg.b["nodes"], now)
        except GraphError as e:
            st.refuse(req, e.code, e.message)
            return
        self.scheduler.accept(att, now)  # a spawning node is running: renew its lease
        st.send(req.node, p.Message("graph.spawned", {"graph": g.id, "nodes": names},
                                    ref=msg.id))


__all__ = ["GraphService"]
