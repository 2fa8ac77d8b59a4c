"""Task graphs, the document: its nodes, their references, and the checks that refuse a
bad graph whole before anything of it runs.

A graph is a list of node maps (``graph.submit``'s ``nodes``; the CLI and the Python API
also take a map of name to node). Each node has a ``name``, a ``capability``, a
``payload`` and optionally ``after`` (names it waits for), ``after_spawned`` (names it
waits for *with everything they spawn*), and the task options ``priority``, ``timeout``,
``labels``, ``to``, ``max_attempts``, ``wait``. In a payload ``{"$result": "A"}`` stands
for A's result, ``{"$results": ["A", "B"]}`` for the list of their results and
``{"$spawned": "P"}`` for the list of the results of the nodes P spawned, in the order
it spawned them; each implies the wait. Pure functions: no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from meshant.core.tasks.model import retry_on_problem
from meshant.protocol.codes import Code

NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}\Z")
OPTIONS = ("priority", "timeout", "labels", "to", "max_attempts", "wait", "retry_on")
_KEYS = frozenset(("name", "capability", "payload", "after", "after_spawned", *OPTIONS))
_REFS = ("$result", "$results", "$spawned")


class GraphError(Exception):
    """A graph (or a spawn) refused whole: ``code`` is a :class:`Code`, ``message`` says
    what was wrong, naming the nodes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as submitted (or spawned), checked."""

    name: str
    capability: str
    payload: Any
    after: tuple[str, ...]  # direct waits: ``after`` plus $result/$results references
    after_spawned: tuple[str, ...]  # waits for these and all they spawn ($spawned too)
    options: dict[str, Any]

    def doc(self) -> dict[str, Any]:
        """The node as a map (what the journal keeps and ``graph.state`` shows)."""
        return {"name": self.name, "capability": self.capability, "payload": self.payload,
                "after": list(self.after), "after_spawned": list(self.after_spawned),
                **self.options}


def normalize(doc: Any) -> list[dict[str, Any]]:
    """A graph document as a list of node maps: ``{"nodes": [...]}``, ``{"nodes": {name:
    node}}``, a list, or a map of name to node."""
    if isinstance(doc, Mapping) and "nodes" in doc:
        doc = doc["nodes"]
    if isinstance(doc, Mapping):
        out = []
        for name, node in doc.items():
            if not isinstance(node, Mapping):
                raise GraphError(Code.BAD_GRAPH, f"node {name!r} must be a map")
            out.append({"name": name, **node})
        return out
    if isinstance(doc, list | tuple):
        for i, node in enumerate(doc):
            if not isinstance(node, Mapping):
                raise GraphError(Code.BAD_GRAPH, f"node {i} must be a map with a name and "
                                 f"a capability, not {type(node).__name__}")
        return list(doc)
    raise GraphError(Code.BAD_GRAPH, "a graph is a list of nodes or a map of name to node, "
                     f"not {type(doc).__name__}")


def references(payload: Any) -> tuple[list[str], list[str]]:
    """The node names a payload refers to: ($result/$results names, $spawned names)."""
    direct: list[str] = []
    spawned: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            if len(v) == 1:
                (k, ref), = v.items()
                if k in _REFS:
                    names = ref if k == "$results" else [ref]
                    if not isinstance(names, list) or not all(isinstance(n, str)
                                                              for n in names):
                        what = "a list of names" if k == "$results" else "a node name"
                        raise GraphError(Code.BAD_GRAPH, f"{k} takes {what}")
                    (spawned if k == "$spawned" else direct).extend(names)
                    return
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(payload)
    return direct, spawned


def substitute(payload: Any, result: Callable[[str], Any],
               spawned: Callable[[str], list[Any]]) -> Any:
    """``payload`` with its references replaced by the results they stand for."""
    if isinstance(payload, dict):
        if len(payload) == 1:
            (k, ref), = payload.items()
            if k == "$result":
                return result(ref)
            if k == "$results":
                return [result(n) for n in ref]
            if k == "$spawned":
                return spawned(ref)
        return {k: substitute(v, result, spawned) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [substitute(v, result, spawned) for v in payload]
    return payload


def _names(node: Mapping[str, Any], key: str) -> list[str]:
    v = node.get(key) or []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list | tuple) or not all(isinstance(n, str) for n in v):
        raise GraphError(Code.BAD_GRAPH, f"node {node.get('name')!r}: {key} must be a list "
                         "of node names")
    return list(v)


def parse_node(node: Any) -> NodeSpec:
    """One node map, checked on its own (names, types, options)."""
    if not isinstance(node, Mapping):
        raise GraphError(Code.BAD_GRAPH, f"a node must be a map, not {type(node).__name__}")
    name = node.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise GraphError(Code.BAD_GRAPH, f"node name {name!r} must be 1-100 characters of "
                         "letters, digits and _ . : -")
    cap = node.get("capability")
    if not isinstance(cap, str) or not cap:
        raise GraphError(Code.BAD_GRAPH, f"node {name!r} needs a capability (a string)")
    unknown = sorted(set(node) - _KEYS)
    if unknown:
        raise GraphError(Code.BAD_GRAPH, f"node {name!r}: unknown field(s) "
                         f"{', '.join(unknown)} (a node has {', '.join(sorted(_KEYS))})")
    payload = node.get("payload")
    direct, spawned = references(payload)
    after = list(dict.fromkeys([*_names(node, "after"), *direct]))
    after_sp = list(dict.fromkeys([*_names(node, "after_spawned"), *spawned]))
    opts = {k: node[k] for k in OPTIONS if node.get(k) is not None}
    _check_options(name, opts)
    return NodeSpec(name, cap, payload, tuple(after), tuple(after_sp), opts)


def _check_options(name: str, o: dict[str, Any]) -> None:
    def bad(what: str) -> GraphError:
        return GraphError(Code.BAD_GRAPH, f"node {name!r}: {what}")

    pr = o.get("priority", 50)
    if not isinstance(pr, int) or isinstance(pr, bool) or not 0 <= pr <= 99:
        raise bad("priority must be an integer 0-99")
    ma = o.get("max_attempts", 3)
    if not isinstance(ma, int) or isinstance(ma, bool) or not 1 <= ma <= 100:
        raise bad("max_attempts must be an integer 1-100")
    for k in ("timeout", "wait"):
        v = o.get(k)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                              or v < 0 or (k == "timeout" and v == 0)):
            raise bad(f"{k} must be a number of seconds (> 0)")
    if "labels" in o and not isinstance(o["labels"], dict):
        raise bad("labels must be a map")
    if "to" in o and not isinstance(o["to"], str):
        raise bad("to must be a forager name")
    if "retry_on" in o and retry_on_problem(o["retry_on"]) is not None:
        raise bad(str(retry_on_problem(o["retry_on"])))


def find_cycle(waits: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle among ``waits`` (name -> names it waits for), as the names on it with the
    first repeated at the end, or None. Iterative: a 10,000-node chain is no recursion."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(waits, WHITE)
    for root in waits:
        if color[root] != WHITE:
            continue
        path: list[str] = [root]
        stack = [iter(waits[root])]
        color[root] = GREY
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = BLACK
                stack.pop()
                continue
            c = color.get(nxt)
            if c is None or c == BLACK:
                continue
            if c == GREY:
                return [*path[path.index(nxt):], nxt]
            color[nxt] = GREY
            path.append(nxt)
            stack.append(iter(waits[nxt]))
    return None


def check_graph(nodes: list[Any], max_nodes: int,
                existing: Mapping[str, Iterable[str]] | None = None) -> list[NodeSpec]:
    """Parse and check new nodes, refusing them all on the first problem: a duplicate
    name, a wait on a missing node, a cycle (named), more than ``max_nodes`` in all.

    ``existing``: a running graph's nodes (name -> what it waits for), when nodes are
    spawned into it; new nodes may wait for those, never the other way round.
    """
    old = existing or {}
    if not nodes:
        raise GraphError(Code.BAD_GRAPH, "a graph needs at least one node")
    total = len(old) + len(nodes)
    if total > max_nodes:
        raise GraphError(Code.GRAPH_TOO_LARGE,
                         f"the graph would have {total:,} nodes, over the queen's limit of "
                         f"{max_nodes:,} (--max-graph-nodes)")
    specs = [parse_node(n) for n in nodes]
    seen: set[str] = set()
    for s in specs:
        if s.name in seen or s.name in old:
            raise GraphError(Code.BAD_GRAPH, f"two nodes are named {s.name!r}: names must "
                             "be unique in a graph")
        seen.add(s.name)
    for s in specs:
        for dep in (*s.after, *s.after_spawned):
            if dep not in seen and dep not in old:
                raise GraphError(Code.BAD_GRAPH, f"node {s.name!r} waits for {dep!r}, which "
                                 "is not a node of this graph")
    waits = {s.name: (*s.after, *s.after_spawned) for s in specs}
    cycle = find_cycle(waits)
    if cycle is not None:
        raise GraphError(Code.BAD_GRAPH, "the graph has a cycle: " + " -> ".join(cycle))
    return specs


__all__ = ["GraphError", "NodeSpec", "check_graph", "find_cycle",
           "normalize", "parse_node", "references", "substitute"]
