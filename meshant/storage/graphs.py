"""Task graphs in the journal: each graph and each of its nodes (spec, state, and the
result later nodes need), so a queen restarted on its journal — or a standby taking
over — carries its graphs on.

Backend-neutral: the rows travel in a :class:`~meshant.storage.records.Batch` (its
``extra`` statements, written in the batch's transaction by either backend, fenced and
retried as the tasks' rows are), and are read with the backend's ``_all``/``_one``.
Portable SQL only (TEXT, INTEGER, REAL, BLOB; ``?`` placeholders; ``INSERT ... ON
CONFLICT DO UPDATE``); the tables are created if missing on every writable open.
"""

from __future__ import annotations

import time
from typing import Any

from meshant.core.tasks.model import GRAPH_NODE_PREFIX, graph_node_id
from meshant.storage.records import Batch, pack, unpack

TABLES = (
    """CREATE TABLE IF NOT EXISTS graphs (
    id TEXT PRIMARY KEY,
    client_name TEXT NOT NULL,
    state TEXT NOT NULL,
    failed TEXT,
    cancelled INTEGER NOT NULL,
    updates INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS graph_nodes (
    graph TEXT NOT NULL,
    name TEXT NOT NULL,
    seq INTEGER NOT NULL,
    parent TEXT,
    spec BLOB NOT NULL,
    state TEXT NOT NULL,
    result BLOB,
    error BLOB,
    PRIMARY KEY (graph, name)
)""",
    "CREATE INDEX IF NOT EXISTS graphs_state ON graphs (state)",
)

UPSERT_GRAPH = (
    "INSERT INTO graphs (id, client_name, state, failed, cancelled, updates, created, "
    "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "state = excluded.state, failed = excluded.failed, cancelled = excluded.cancelled, "
    "updated = excluded.updated")
UPSERT_NODE = (
    "INSERT INTO graph_nodes (graph, name, seq, parent, spec, state, result, error) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (graph, name) DO UPDATE SET "
    "state = excluded.state, result = excluded.result, error = excluded.error")
UPDATE_NODE = "UPDATE graph_nodes SET state = ?, result = ?, error = ? WHERE graph = ? AND name = ?"

# Retention (each backend runs them in one transaction, with (before, keep) twice):
# ended graphs updated before ``before`` or beyond the newest ``keep``, with their nodes.
_OLD = ("SELECT id FROM graphs WHERE state != 'running' AND (updated < ? OR id NOT IN "
        "(SELECT id FROM graphs WHERE state != 'running' ORDER BY updated DESC LIMIT ?))")
PRUNE = (f"DELETE FROM graph_nodes WHERE graph IN ({_OLD})",
         f"DELETE FROM graphs WHERE id IN ({_OLD})")


def batch(graphs: list[Any], nodes: list[Any], to_wall: float) -> Batch:
    """The rows for what changed (``GraphBook.take_changes``: graphs, (graph, node) pairs).
    A node's spec goes once, with its first row; later changes are an UPDATE. Built once
    and written as often as it takes (every statement is idempotent)."""
    now = time.time()
    grows = [(g.id, g.client_name, g.state, g.failed, int(g.cancelled), int(g.updates),
              g.created + to_wall, now) for g in graphs]
    seen: dict[tuple[str, str], Any] = {}
    for g, n in nodes:
        seen[(g.id, n.name)] = (g, n)  # the last state of a node changed twice this turn
    new, changed = [], []
    for g, n in seen.values():
        result = pack(n.result) if n.state == "completed" else None
        error = pack(n.error) if n.error is not None else None
        if n.journaled:
            changed.append((n.state, result, error, g.id, n.name))
        else:
            new.append((g.id, n.name, n.seq, n.parent, pack(n.spec.doc()), n.state, result,
                        error))
            n.journaled = True
    b = Batch()
    b.extra.extend((sql, rows) for sql, rows in ((UPSERT_GRAPH, grows), (UPSERT_NODE, new),
                                                 (UPDATE_NODE, changed)) if rows)
    return b


_GCOLS = ("id", "client_name", "state", "failed", "cancelled", "updates", "created", "updated")


def _nodes(j: Any, gid: str) -> list[dict[str, Any]]:
    # Each node's attempt is its task's (a node's task id is tg:<graph>/<name>; a node
    # that never ran has none).
    rows = j._all("SELECT n.seq, n.parent, n.spec, n.state, n.result, n.error, t.attempt "
                  "FROM graph_nodes n LEFT JOIN tasks t ON t.id = "
                  f"'{GRAPH_NODE_PREFIX}' || n.graph || '/' || n.name "
                  "WHERE n.graph = ? ORDER BY n.seq", (gid,))
    # A node whose task row was pruned (tasks are kept by count, graphs on their own) ran
    # all the same if it ended completed or failed: its attempt is unknown (None).
    return [{"seq": r[0], "parent": r[1], "spec": unpack(r[2]), "state": r[3],
             "result": unpack(r[4]), "error": unpack(r[5]),
             "attempt": r[6] if r[6] is not None else (
                 None if r[3] in ("completed", "failed") else 0)}
            for r in rows]


def unfinished(j: Any) -> list[dict[str, Any]]:
    """The graphs still running in journal ``j``, each with its nodes (what
    ``GraphBook.restore`` takes)."""
    rows = j._all(f"SELECT {', '.join(_GCOLS)} FROM graphs WHERE state = 'running' "
                  "ORDER BY created")
    out = []
    for r in rows:
        d = dict(zip(_GCOLS, r, strict=True))
        d["nodes"] = _nodes(j, d["id"])
        out.append(d)
    return out


def find(j: Any, gid: str) -> dict[str, Any] | None:
    """One graph as ``graph.state`` shows it, with its completed nodes' ``results``
    besides, or None (also for a journal from before graphs, opened read-only)."""
    try:
        r = j._one(f"SELECT {', '.join(_GCOLS)} FROM graphs WHERE id = ?", (gid,))
    except Exception:  # no graphs table: an old journal opened read-only
        return None
    if r is None:
        return None
    d = dict(zip(_GCOLS, r, strict=True))
    nodes = _nodes(j, gid)
    counts: dict[str, int] = {}
    states = []
    for n in nodes:
        counts[n["state"]] = counts.get(n["state"], 0) + 1
        rec: dict[str, Any] = {"node": n["spec"]["name"], "state": n["state"],
                               "id": graph_node_id(gid, n["spec"]["name"]),
                               "capability": n["spec"]["capability"],
                               "attempt": n["attempt"]}
        if n["parent"]:
            rec["spawned_by"] = n["parent"]
        if isinstance(n["error"], dict):
            rec["error"] = {k: v for k, v in n["error"].items() if k != "traceback"}
        states.append(rec)
    out: dict[str, Any] = {"graph": gid, "state": d["state"], "client": d["client_name"],
                           "nodes": len(nodes), "counts": counts, "node_states": states,
                           # (what a client sending an ended graph again is told again)
                           "results": {n["spec"]["name"]: n["result"] for n in nodes
                                       if n["state"] == "completed"}}
    if d["failed"]:
        out["failed"] = d["failed"]
    return out
