"""Task graphs, client side: :class:`Graph` (a builder for the document) and
:class:`GraphHandle` (what ``Client.submit_graph`` returns: a future per node, the
updates as nodes start and finish, the graph's result, cancel).

The client's I/O thread feeds a handle what the queen sends about its graph: each node
task's progress and result (task ids ``tg:<graph>/<node>``), ``graph.node`` for a node
that ends without running, ``graph.result`` at the end. A handle's submission is kept
until the graph ends and sent again (same id) after a reconnect: the queen answers a
graph it holds with what the client may have missed, never by running it again.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from meshant import protocol as p
from meshant.actors.futures import TaskFuture, drain_updates, fail
from meshant.core.graphs.model import GraphError, normalize
from meshant.core.tasks.model import graph_node_id
from meshant.errors import BadInput, GraphFailed, MeshantError, from_error_body

NodeDoc = dict[str, Any]


def result_of(name: str) -> dict[str, str]:
    """The placeholder for node ``name``'s result in another node's payload."""
    return {"$result": name}


class Graph:
    """A graph document built in Python: ``g.node("b", "parse", {"text": g.result("a")})``.

    ``Client.submit_graph`` also takes the document itself: a map of name to node, or
    ``{"nodes": [...]}``."""

    def __init__(self) -> None:
        self.nodes: list[NodeDoc] = []

    def node(self, name: str, capability: str, payload: Any = None, *,
             after: list[str] | None = None, after_spawned: list[str] | None = None,
             **options: Any) -> str:
        """Add a node; returns its name. ``options``: priority, timeout, labels, to,
        max_attempts, wait (as for ``Client.submit``)."""
        doc: NodeDoc = {"name": name, "capability": capability, "payload": payload}
        if after:
            doc["after"] = list(after)
        if after_spawned:
            doc["after_spawned"] = list(after_spawned)
        doc.update({k: v for k, v in options.items() if v is not None})
        self.nodes.append(doc)
        return name

    @staticmethod
    def result(name: str) -> dict[str, str]:
        return result_of(name)

    @staticmethod
    def results(*names: str) -> dict[str, list[str]]:
        return {"$results": list(names)}

    @staticmethod
    def spawned(name: str) -> dict[str, str]:
        """The list of the results of the nodes ``name`` spawns (waits for them all)."""
        return {"$spawned": name}

    def doc(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes)}


def nodes_of(graph: Any) -> list[NodeDoc]:
    """The node list of a document, a :class:`Graph`, or a map of name to node."""
    if isinstance(graph, Graph):
        return list(graph.nodes)
    try:
        return normalize(graph)
    except GraphError as e:
        raise BadInput(e.message, code=e.code) from None


@dataclass(frozen=True, slots=True)
class GraphUpdate:
    """A node started (``"started"``, when asked for), reported progress, or ended
    (``"finished"``, with its ``state`` and ``result`` or ``error``)."""

    kind: str
    node: str
    state: str | None = None
    result: Any = None
    error: MeshantError | None = None
    fraction: float | None = None
    note: str | None = None


class GraphHandle:
    """A submitted graph. ``nodes[name]`` is a future per node (spawned ones appear when
    they report); ``result()`` the dict of node results; ``updates()`` what happens."""

    def __init__(self, graph_id: str, names: list[str], cancel: Callable[[str], None],
                 pump: Callable[[Callable[[], bool], float | None], None] | None) -> None:
        self.id = graph_id
        self._cancel = cancel
        self._pump = pump
        self.nodes: dict[str, TaskFuture[Any]] = {n: TaskFuture(graph_node_id(graph_id, n), pump)
                                             for n in names}
        self.submitted: Future[int] = Future()
        self.done: Future[dict[str, Any]] = Future()
        self.state: str | None = None
        self._updates: queue.SimpleQueue[GraphUpdate | None] = queue.SimpleQueue()

    # -- for the caller ---------------------------------------------------------------------

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """The node results by name once the graph completed; GraphFailed if it failed
        or was cancelled (its ``results`` and ``errors`` say what each node did)."""
        if self._pump is not None and not self.done.done():
            self._pump(self.done.done, timeout)
            timeout = 0
        return self.done.result(timeout)

    def cancel(self) -> None:
        """Cancel the graph: pending nodes at once, running ones best effort."""
        self._cancel(self.id)

    def updates(self, timeout: float | None = None) -> Iterator[GraphUpdate]:
        """Yield node updates until the graph ends (TimeoutError if none comes within
        ``timeout`` seconds)."""
        return drain_updates(self._updates, self._pump, timeout, f"graph {self.id}")

    # -- from the I/O thread ----------------------------------------------------------------

    def _node(self, name: str) -> TaskFuture[Any]:
        fut = self.nodes.get(name)
        if fut is None:
            fut = self.nodes[name] = TaskFuture(graph_node_id(self.id, name), self._pump)
        return fut

    def on_task(self, name: str, b: dict[str, Any], kind: str) -> None:
        fut = self._node(name)
        seq = b.get("seq", 0)
        if seq <= fut.last_seq:
            return  # exactly once
        fut.last_seq = seq
        if kind == "task.progress":
            self._updates.put(GraphUpdate("progress", name, fraction=b.get("fraction"),
                                          note=b.get("note")))
            return
        if b.get("partial"):
            return
        self._finished(name, b.get("state", "failed"), b.get("result"), b.get("error"))

    def on_node(self, b: dict[str, Any]) -> None:
        name = b["node"]
        if b["state"] == "running":
            self._updates.put(GraphUpdate("started", name, "running"))
            return
        self._finished(name, b["state"], b.get("result"), b.get("error"))

    def _finished(self, name: str, state: str, result: Any, error: Any) -> None:
        fut = self._node(name)
        if fut.done():
            return
        if state == "completed":
            value = p.unwrap_blob(result)
            fut.set_result(value)
            self._updates.put(GraphUpdate("finished", name, state, result=value))
        else:
            err = from_error_body(error if isinstance(error, dict) else {"code": state})
            fut.set_exception(err)
            self._updates.put(GraphUpdate("finished", name, state, error=err))

    def on_end(self, b: dict[str, Any]) -> None:
        self.state = b.get("state")
        results: dict[str, Any] = {}
        errors: dict[str, MeshantError] = {}
        for name, fut in self.nodes.items():
            if not fut.done():
                continue
            e = fut.exception(0)
            if e is None:
                results[name] = fut.result(0)
            elif isinstance(e, MeshantError):
                errors[name] = e
        if not self.submitted.done():
            self.submitted.set_result(b.get("nodes", len(self.nodes)))
        if self.state == "completed":
            if not self.done.done():
                self.done.set_result(results)
        else:
            failed = b.get("failed")
            why = f" at node {failed!r}: {errors[failed]}" if failed in errors else ""
            fail(self.done, GraphFailed(f"graph {self.id} {self.state}{why}", failed=failed,
                                        results=results, errors=errors))
        self._updates.put(None)

    def on_error(self, err: MeshantError) -> None:
        """The queen refused the graph (nothing of it ran), or the client gave up."""
        fail(self.submitted, err)
        fail(self.done, err)
        for fut in self.nodes.values():
            fail(fut, err)
        self._updates.put(None)


class ClientGraphs:
    """A client's submitted graphs, until each ends: the handles, fed from the I/O
    thread with what the queen sends about them."""

    def __init__(self) -> None:
        self.handles: dict[str, GraphHandle] = {}

    def add(self, h: GraphHandle) -> None:
        self.handles[h.id] = h

    def on_task(self, b: dict[str, Any], kind: str) -> None:
        """A result or progress of a graph node's task (id ``tg:<graph>/<node>``)."""
        gid, _, node = str(b.get("task", ""))[3:].rpartition("/")
        h = self.handles.get(gid)
        if h is not None:
            h.on_task(node, b, kind)

    def on_submitted(self, msg: p.Message) -> None:
        h = self.handles.get(msg.b["graph"])
        if h is not None and not h.submitted.done():
            h.submitted.set_result(msg.b.get("nodes", 0))

    def on_node(self, msg: p.Message) -> None:
        h = self.handles.get(msg.b["graph"])
        if h is not None:
            h.on_node(msg.b)

    def on_result(self, msg: p.Message) -> bool:
        """The graph ended; False if it is not one of ours (any more)."""
        h = self.handles.pop(msg.b["graph"], None)
        if h is None:
            return False
        h.on_end(msg.b)
        return True

    def on_error(self, ref: str, err: MeshantError) -> bool:
        h = self.handles.pop(ref, None)
        if h is None:
            return False
        h.on_error(err)
        return True

    def fail_all(self, err: MeshantError) -> None:
        for h in list(self.handles.values()):
            h.on_error(err)
        self.handles.clear()


__all__ = ["ClientGraphs", "Graph", "GraphHandle", "GraphUpdate", "nodes_of", "result_of"]
