"""Task graphs, running: the queen's book of graphs, sans-IO.

Each node becomes a task (id ``tg:<graph>/<node>``) once everything it waits for has
completed, with its payload's references replaced by those results; from then on it has
every task guarantee (leases, fencing, retries, dead letters, audit). The scheduler
tells the book when a node's task ends (``Scheduler.on_graph_final``); the book starts
what that unblocks, or — if it failed — cancels exactly the nodes downstream of it with
cause ``upstream-failed``. A running node's handler may add nodes (``spawn``).

What the client hears, besides each node task's own results: ``graph.node`` for a node
that ends without running (cancelled), and ``graph.result`` when the graph ends; both go
to ``notify`` (the core sends them after the turn's task results). What the journal must
keep is in ``changed`` (graphs) and ``changed_nodes``, drained once per turn.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshant import protocol as p
from meshant.core.conversations.model import size_of
from meshant.core.counters import Counters
from meshant.core.graphs.model import GraphError, NodeSpec, check_graph, substitute
from meshant.core.lifecycle import GRAPH_NODE, GRAPH_NODE_FINAL, NodeEvent, NodeState, step
from meshant.core.tasks.model import graph_node_id, graph_node_of
from meshant.core.tasks.scheduler import QueueFull, Scheduler, Task, revive
from meshant.protocol.codes import Code

PENDING, RUNNING = NodeState.PENDING, NodeState.RUNNING
COMPLETED, FAILED, CANCELLED = NodeState.COMPLETED, NodeState.FAILED, NodeState.CANCELLED
NODE_FINAL = GRAPH_NODE_FINAL
_ENDS = {COMPLETED: NodeEvent.COMPLETE, FAILED: NodeEvent.FAIL, CANCELLED: NodeEvent.CANCEL}
KEEP_DONE = 1000  # finished graphs remembered in memory (the journal keeps them all)
KEEP_DONE_NODES = 50_000  # and their node states, at most (bounded by nodes, not graphs)
# ... and their completed nodes' results, as many bytes as this holds (the oldest graphs'
# are let go first; with a journal, a client sending such a graph again has them read back)
KEEP_DONE_RESULT_BYTES = 64 * 1024 * 1024


@dataclass(slots=True, eq=False)
class GNode:
    spec: NodeSpec
    seq: int
    parent: str | None = None
    journaled: bool = False  # its row (with its spec) is in the journal
    state: NodeState = PENDING
    waiting: int = 0  # nodes it still waits for
    result: Any = None
    error: dict[str, Any] | None = None
    children: list[str] = field(default_factory=list)
    dependants: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(slots=True, eq=False)
class Graph:
    id: str
    client: bytes
    client_name: str
    created: float
    updates: bool = False
    state: str = RUNNING
    failed: str | None = None  # the first node that failed for good
    cancelled: bool = False
    nodes: dict[str, GNode] = field(default_factory=dict)
    # Nodes that wait for everything a node spawns, by that node.
    subwaiters: dict[str, list[str]] = field(default_factory=dict)
    open: int = 0  # nodes not final

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for n in list(self.nodes.values()):  # also from a status thread
            c[n.state] = c.get(n.state, 0) + 1
        return c

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"graph": self.id, "state": self.state, "client": self.client_name,
                               "nodes": len(self.nodes), "counts": self.counts()}
        if self.failed:
            out["failed"] = self.failed
        return out

    def node_record(self, n: GNode) -> dict[str, Any]:
        rec: dict[str, Any] = {"node": n.name, "state": n.state,
                               "id": graph_node_id(self.id, n.name),
                               "capability": n.spec.capability}
        if n.parent:
            rec["spawned_by"] = n.parent
        if n.error is not None:
            rec["error"] = n.error
        return rec


def node_end(gid: str, node: str, state: str, task: str, result: Any,
             error: dict[str, Any] | None) -> dict[str, Any]:
    """The ``graph.node`` body of a node that ended: its result if it completed, else
    its error (if any)."""
    body: dict[str, Any] = {"graph": gid, "node": node, "state": state, "task": task}
    if state == COMPLETED:
        body["result"] = result
    elif error is not None:
        body["error"] = error
    return body


def public(status: dict[str, Any]) -> dict[str, Any]:
    """A finished graph's status as ``graph.state`` shows it (its nodes' results, kept
    for ``GraphBook.ended_nodes``, left out)."""
    return {k: v for k, v in status.items() if k != "results"}


class GraphBook:
    """The running graphs. ``scheduler.on_graph_final`` must be this book's ``on_final``."""

    def __init__(self, scheduler: Scheduler, max_nodes: int,
                 max_payload: int = 64 * 1024 * 1024,
                 notify: Callable[[bytes, p.Message], None] | None = None,
                 counters: Counters | None = None) -> None:
        self.scheduler = scheduler
        self.max_nodes = max_nodes
        self.max_payload = max_payload  # the largest frame a forager accepts
        self.graphs: dict[str, Graph] = {}
        # Finished graphs: each one's graph.result summary and its ``node_states``.
        self.done: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._done_nodes = 0
        self._done_results: OrderedDict[str, int] = OrderedDict()  # gid -> its results' bytes
        self._done_result_bytes = 0
        # What a client hears about its graph, sent after the turn's task results.
        self.notify: Callable[[bytes, p.Message], None] = notify or (lambda i, m: None)
        self.changed: dict[str, Graph] = {}
        self.changed_nodes: list[tuple[Graph, GNode]] = []
        self.track_changes = False
        self.counters = counters if counters is not None else Counters()
        self.counters.declare("graphs", "graphs", "graph_nodes", "spawned")
        self._now = 0.0
        # While restoring: final tasks of the graphs' nodes that the journal holds.
        self._finals: dict[str, Task] | None = None
        scheduler.on_graph_final = self.on_final

    # -- journal ----------------------------------------------------------------------------

    def _touch(self, g: Graph, n: GNode | None = None) -> None:
        """Journal ``n``'s change (or, without a node, the graph's own: created, ended)."""
        if self.track_changes:
            if n is None:
                self.changed[g.id] = g
            else:
                self.changed_nodes.append((g, n))

    def take_changes(self) -> tuple[list[Graph], list[tuple[Graph, GNode]]]:
        graphs, nodes = list(self.changed.values()), self.changed_nodes
        self.changed, self.changed_nodes = {}, []
        return graphs, nodes

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, gid: str, nodes: list[Any], client: bytes, client_name: str,
               now: float, *, updates: bool = False) -> Graph:
        """Check the whole graph (GraphError, nothing changed) and start its ready nodes."""
        specs = check_graph(nodes, self.max_nodes)
        ready = sum(1 for s in specs if not s.after and not s.after_spawned)
        room = self.scheduler.max_queue - self.scheduler.queued
        if ready > room:
            raise QueueFull(f"the graph's {ready:,} first nodes do not fit in the queue "
                            f"({room:,} places left)")
        self._now = now
        g = Graph(gid, client, client_name, now, updates)
        self.graphs[gid] = g
        self.counters["graphs"] += 1
        self._touch(g)
        self._add(g, specs, None, now)
        return g

    def _add(self, g: Graph, specs: list[NodeSpec], parent: str | None, now: float) -> None:
        nodes = g.nodes
        new = []
        for s in specs:
            n = GNode(s, len(nodes), parent)
            nodes[s.name] = n
            g.open += 1
            new.append(n)
            self.counters["graph_nodes"] += 1
            if parent is not None:
                nodes[parent].children.append(s.name)
            self._touch(g, n)
        for n in new:
            for dep in n.spec.after_spawned:
                g.subwaiters.setdefault(dep, []).append(n.name)
        for n in new:
            self._wire(g, n)
            if parent is not None:
                # Whoever waits for everything an ancestor spawns now waits for this too.
                a: str | None = parent
                while a is not None:
                    for w in g.subwaiters.get(a, ()):
                        self._wait(g, nodes[w], n.name)
                    a = nodes[a].parent
        for n in new:
            if n.state == PENDING and n.waiting == 0:
                self._start(g, n, now)

    def _wire(self, g: Graph, n: GNode) -> None:
        for dep in n.spec.after:
            self._wait(g, n, dep)
        for dep in n.spec.after_spawned:
            self._wait(g, n, dep)
            for d in self._subtree(g, dep):
                self._wait(g, n, d)

    def _subtree(self, g: Graph, name: str) -> list[str]:
        out, todo = [], list(g.nodes[name].children)
        while todo:
            c = todo.pop()
            out.append(c)
            todo.extend(g.nodes[c].children)
        return out

    def _wait(self, g: Graph, n: GNode, dep: str) -> None:
        d = g.nodes[dep]
        if d.state == COMPLETED:
            return
        if d.state in NODE_FINAL:
            if n.state == PENDING:
                self._end(g, n, CANCELLED, self._upstream(g, dep))
            return
        d.dependants.append(n.name)
        n.waiting += 1

    @staticmethod
    def _upstream(g: Graph, dep: str) -> dict[str, Any]:
        return {"code": Code.UPSTREAM_FAILED, "cause": Code.UPSTREAM_FAILED, "node": dep,
                "message": f"node {dep!r} of graph {g.id} did not complete"}

    def _start(self, g: Graph, n: GNode, now: float) -> None:
        sched = self.scheduler
        tid = graph_node_id(g.id, n.name)
        known = sched.find_live(tid) or (
            self._finals.get(tid) if self._finals is not None else None)
        if known is not None:
            # Its task exists already: a restart between journal writes, found again as
            # the graph is restored, or as its client sends the graph again (the queen
            # died after the node's task was written, before the graph was). The same
            # node: its results go to the graph's client.
            self._move(g, n, NodeEvent.START)
            if known.final is None:
                sched.follow(known, g.client, g.client_name)
            else:
                self.on_final(known)
            return
        nodes = g.nodes
        payload = n.spec.payload
        if n.spec.after or n.spec.after_spawned:
            payload = substitute(payload, lambda x: nodes[x].result,
                                 lambda x: [nodes[c].result for c in nodes[x].children])
            size = self._size(payload)
            if size > self.max_payload:
                # Results grew the payload past what a forager takes: it could never run.
                self._end(g, n, FAILED, {
                    "code": Code.TOO_LARGE, "cause": Code.TOO_LARGE,
                    "message": f"node {n.name!r}'s payload with its inputs' results is "
                               f"{size:,} bytes, over the queen's limit of "
                               f"{self.max_payload:,} (--max-message)"})
                return
        o = n.spec.options
        task = Task(id=tid, capability=n.spec.capability, payload=payload, client=g.client,
                    client_name=g.client_name, priority=o.get("priority", 50),
                    timeout=o.get("timeout"), to=o.get("to"), labels=dict(o.get("labels") or {}),
                    max_attempts=o.get("max_attempts", 3),
                    retry_on=tuple(o["retry_on"]) if o.get("retry_on") else None,
                    wait=o.get("wait", sched.default_wait))
        try:
            sched.submit(task, now)
        except QueueFull as e:
            self._end(g, n, FAILED, {"code": Code.QUEUE_FULL, "cause": Code.QUEUE_FULL,
                                     "message": f"queue full: {e}"})
            return
        self._move(g, n, NodeEvent.START)
        if g.updates:
            self.notify(g.client, p.Message("graph.node", {
                "graph": g.id, "node": n.name, "state": RUNNING, "task": tid}))

    @staticmethod
    def _size(payload: Any) -> int:
        """The largest frame an assign with this payload takes (blobs travel apart)."""
        return max(len(f) for f in p.binary.encode(p.Message("task.assign",
                                                             {"payload": payload})))

    # -- nodes ending -------------------------------------------------------------------------

    def on_final(self, task: Task) -> None:
        """A graph node's task ended (the scheduler's hook, and restore's)."""
        where = graph_node_of(task.id)
        g = self.graphs.get(where[0]) if where is not None else None
        n = g.nodes.get(where[1]) if g is not None and where is not None else None
        if g is None or n is None or n.state in NODE_FINAL:
            return
        body = task.final or {}
        state = body.get("state", FAILED)
        if state == COMPLETED:
            n.result = body.get("result")
            self._end(g, n, COMPLETED, None, notify=False)
        else:
            self._end(g, n, state if state in NODE_FINAL else FAILED,
                      body.get("error") or {"code": Code.ERROR}, notify=False)

    def _end(self, g: Graph, n: GNode, state: NodeState, error: dict[str, Any] | None, *,
             notify: bool = True) -> None:
        """``n`` is final. ``notify``: tell the client (a node whose task ended has told
        it already, with the task's own result)."""
        self._mark(g, n, state, error, notify)
        if state == COMPLETED:
            for d in n.dependants:
                dn = g.nodes[d]
                dn.waiting -= 1
                if dn.waiting == 0 and dn.state == PENDING:
                    self._start(g, dn, self._now)
        else:
            if state == FAILED and g.failed is None:
                g.failed = n.name
                self._touch(g)
            # Exactly what depends on it, directly or not (iteratively: a chain of 10,000
            # is no recursion): the rest goes on.
            upstream = self._upstream(g, n.name)
            todo = list(n.dependants)
            while todo:
                dn = g.nodes[todo.pop()]
                if dn.state == PENDING:
                    self._mark(g, dn, CANCELLED, upstream, True)
                    todo.extend(dn.dependants)
        if g.open == 0:
            self._finish(g)

    def _move(self, g: Graph, n: GNode, event: NodeEvent) -> None:
        """Move ``n`` by ``event`` (a change its table forbids is a bug: LifecycleError),
        and journal it."""
        n.state = step(GRAPH_NODE, n.state, event, "graph %s's node %r", g.id, n.name)
        self._touch(g, n)

    def _mark(self, g: Graph, n: GNode, state: NodeState, error: dict[str, Any] | None,
              notify: bool) -> None:
        n.error = error
        self._move(g, n, _ENDS[state])
        g.open -= 1
        if notify:
            body: dict[str, Any] = {"graph": g.id, "node": n.name, "state": state,
                                    "task": graph_node_id(g.id, n.name)}
            if error is not None:
                body["error"] = error
            self.notify(g.client, p.Message("graph.node", body))

    def _finish(self, g: Graph) -> None:
        if self.graphs.pop(g.id, None) is None:
            return  # ended already, deeper in the same cascade
        if g.cancelled:
            g.state = CANCELLED
        elif g.failed is not None or any(x.state != COMPLETED for x in g.nodes.values()):
            g.state = FAILED
            if g.failed is None:  # only cancelled nodes (a node's task cancelled)
                g.failed = next(x.name for x in g.nodes.values() if x.state != COMPLETED)
        else:
            g.state = COMPLETED
        self._touch(g)
        summary = g.summary()
        self.notify(g.client, p.Message("graph.result", summary))
        # With its nodes' results: a client that sends the graph again (it missed the
        # end, over a failover) is told every node's end before the graph's.
        self.remember(g.id, {**summary, "node_states": self.node_states(g),
                             "results": {x.name: x.result for x in g.nodes.values()
                                         if x.state == COMPLETED}})

    def remember(self, gid: str, status: dict[str, Any]) -> None:
        """Keep a finished graph's status (with its ``node_states``) for graph.status,
        the newest first, as many as KEEP_DONE graphs and KEEP_DONE_NODES nodes hold; its
        ``results`` while KEEP_DONE_RESULT_BYTES holds them."""
        self._forget(gid)
        self.done[gid] = status
        self._done_nodes += len(status.get("node_states") or ())
        if status.get("results"):
            size = size_of(status["results"])
            self._done_results[gid] = size
            self._done_result_bytes += size
        while len(self.done) > 1 and (len(self.done) > KEEP_DONE
                                      or self._done_nodes > KEEP_DONE_NODES):
            self._forget(next(iter(self.done)))
        while self._done_result_bytes > KEEP_DONE_RESULT_BYTES:
            old, size = self._done_results.popitem(last=False)
            self._done_result_bytes -= size
            self.done[old].pop("results", None)

    def _forget(self, gid: str) -> None:
        old = self.done.pop(gid, None)
        if old is not None:
            self._done_nodes -= len(old.get("node_states") or ())
            self._done_result_bytes -= self._done_results.pop(gid, 0)

    def has_results(self, gid: str) -> bool:
        """Whether a finished graph's node results are in memory (``ended_nodes``)."""
        return "results" in self.done.get(gid, ())

    def result_of(self, gid: str) -> dict[str, Any]:
        """A finished graph's ``graph.result`` body (its summary, without node states)."""
        return {k: v for k, v in self.done[gid].items() if k not in ("node_states", "results")}

    def ended_nodes(self, gid: str) -> list[dict[str, Any]]:
        """A finished graph's ``graph.node`` bodies, one per node: its end, with its
        result or error (for a client that may have missed them)."""
        done = self.done[gid]
        results = done.get("results") or {}
        return [node_end(gid, r["node"], r["state"], r["id"], results.get(r["node"]),
                         r.get("error")) for r in done.get("node_states") or ()]

    def node_states(self, g: Graph) -> list[dict[str, Any]]:
        """Every node's state, attempt and error (its traceback left to the node's task:
        ``meshant task ID`` shows it)."""
        out = []
        for n in list(g.nodes.values()):
            rec = g.node_record(n)
            task = self.scheduler.find_live(rec["id"])
            rec["attempt"] = task.attempt if task is not None else 0
            err = rec.get("error")
            if isinstance(err, dict) and "traceback" in err:
                rec["error"] = {k: v for k, v in err.items() if k != "traceback"}
            out.append(rec)
        return out

    # -- requests -----------------------------------------------------------------------------

    def cancel(self, g: Graph, now: float) -> None:
        """Cancel the graph: its pending nodes at once, its running nodes' tasks."""
        self._now = now
        g.cancelled = True
        self._touch(g)
        err = {"code": Code.CANCELLED, "cause": Code.CANCELLED,
               "message": "the graph was cancelled"}
        for n in list(g.nodes.values()):
            if g.id not in self.graphs:
                break
            if n.state == PENDING:
                self._end(g, n, CANCELLED, err)
            elif n.state == RUNNING:
                self.scheduler.cancel(graph_node_id(g.id, n.name), now)  # -> on_final

    def spawn(self, g: Graph, parent: str, nodes: list[Any], now: float) -> list[str]:
        """Add nodes spawned by the running node ``parent``. GraphError, nothing changed,
        if any is bad; nodes it spawned already (a re-run attempt) are taken as they are."""
        self._now = now
        fresh = []
        for raw in nodes:
            name = raw.get("name") if isinstance(raw, dict) else None
            old = g.nodes.get(name) if isinstance(name, str) else None
            if old is not None and old.parent == parent:
                continue  # spawned by an earlier attempt of the same node
            fresh.append(raw)
        if not fresh:
            return [r["name"] for r in nodes]
        existing = {k: (*v.spec.after, *v.spec.after_spawned) for k, v in g.nodes.items()}
        specs = check_graph(fresh, self.max_nodes, existing)
        self._check_deadlock(g, parent, specs)
        self.counters["spawned"] += len(specs)
        self._add(g, specs, parent, now)
        return [r["name"] for r in nodes]

    def _check_deadlock(self, g: Graph, parent: str, specs: list[NodeSpec]) -> None:
        """A spawned node must not wait for a node that waits for everything its
        spawner's line spawns: that node would wait for it in turn."""
        blocked: dict[str, str] = {}
        a: str | None = parent
        while a is not None:
            for w in g.subwaiters.get(a, ()):
                blocked[w] = a
            a = g.nodes[a].parent
        if not blocked:
            return
        batch = {s.name: s for s in specs}
        for s in specs:
            seen: set[str] = set()
            todo = [*s.after, *s.after_spawned]
            while todo:
                x = todo.pop()
                if x in seen:
                    continue
                seen.add(x)
                if x in blocked:
                    raise GraphError(Code.BAD_GRAPH, f"spawned node {s.name!r} would wait for "
                                     f"{x!r}, which waits for everything {blocked[x]!r} "
                                     "spawns: a cycle")
                spec = batch[x] if x in batch else g.nodes[x].spec
                todo.extend((*spec.after, *spec.after_spawned))
                for sp in spec.after_spawned:
                    if sp in g.nodes:
                        todo.extend(self._subtree(g, sp))  # what it waits for too

    def status(self, gid: str) -> dict[str, Any] | None:
        g = self.graphs.get(gid)
        if g is None:
            done = self.done.get(gid)
            return None if done is None else public(done)
        return {**g.summary(), "node_states": self.node_states(g)}

    def client_moved(self, g: Graph, new: bytes) -> None:
        """The graph's client is on a new connection now (it sent the graph again): the
        graph's news and its nodes' results go there."""
        g.client = new
        sched = self.scheduler
        prefix = graph_node_id(g.id, "")
        for t in list(sched.tasks.values()):
            if t.id.startswith(prefix):
                sched.follow(t, new)

    def peer_moved(self, old: bytes, new: bytes) -> None:
        """A client reconnected on a new connection: its graphs' news follow it."""
        for g in self.graphs.values():
            if g.client == old:
                g.client = new

    # -- restart ------------------------------------------------------------------------------

    def restore(self, rows: list[dict[str, Any]], finals: dict[str, dict[str, Any]],
                now: float) -> int:
        """Take back the unfinished graphs a journal holds (``storage.graphs.unfinished``),
        after the scheduler took back its tasks: nodes whose tasks ended meanwhile end now
        (``finals``: those tasks' journal rows), ready ones start (never twice: a node's
        task id is fixed)."""
        self._now = now
        to_wall = self.scheduler.to_wall
        self._finals = {tid: revive(r, to_wall) for tid, r in finals.items()}
        try:
            self._restore(rows, now)
        finally:
            self._finals = None
        return len(self.graphs)

    def _restore(self, rows: list[dict[str, Any]], now: float) -> None:
        for r in rows:
            g = Graph(r["id"], b"", r["client_name"], now, bool(r.get("updates")))
            g.cancelled = bool(r.get("cancelled"))
            g.failed = r.get("failed")
            for nr in sorted(r["nodes"], key=lambda x: x["seq"]):
                d = nr["spec"]
                spec = NodeSpec(d["name"], d["capability"], d.get("payload"),
                                tuple(d.get("after") or ()), tuple(d.get("after_spawned") or ()),
                                {k: d[k] for k in ("priority", "timeout", "labels", "to",
                                                   "max_attempts", "wait", "retry_on")
                                 if k in d})
                n = GNode(spec, nr["seq"], nr.get("parent"), journaled=True,
                          state=NodeState(nr["state"]), result=nr.get("result"),
                          error=nr.get("error"))
                g.nodes[spec.name] = n
                if n.parent is not None and n.parent in g.nodes:
                    g.nodes[n.parent].children.append(spec.name)
                if n.state not in NODE_FINAL:
                    g.open += 1
            for n in g.nodes.values():
                for dep in n.spec.after_spawned:
                    g.subwaiters.setdefault(dep, []).append(n.name)
            self.graphs[g.id] = g
            pending = [n for n in g.nodes.values() if n.state == PENDING]
            for n in pending:
                self._wire(g, n)
            if g.open == 0:
                self._finish(g)
                continue
            for n in list(g.nodes.values()):
                if g.id not in self.graphs:
                    break
                if n.state == RUNNING:
                    tid = graph_node_id(g.id, n.name)
                    t = self.scheduler.find_live(tid) or (self._finals or {}).get(tid)
                    if t is None:
                        # Its task never reached the journal: run it.
                        self._move(g, n, NodeEvent.RESTART)
                        self._start(g, n, now)
                    elif t.final is not None:
                        self.on_final(t)
                elif n.state == PENDING and n.waiting == 0:
                    self._start(g, n, now)


__all__ = ["GNode", "Graph", "GraphBook", "GraphError", "node_end", "public"]
