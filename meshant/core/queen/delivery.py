"""The end of a turn: the work the scheduler decided becomes sends, batched per peer.

Per peer, in one turn: results (and progress, with batch.progress) for a client,
assignments for a forager travel as one message when the peer negotiated batching.
Anything else sent to that peer first flushes its batch, so the order of what it
receives never changes. Progress and partial results reach only clients that negotiated
them.
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.core.nodes.registry import Node
from meshant.core.queen.state import QueenState
from meshant.core.tasks.model import is_graph_node
from meshant.core.tasks.steps import INLINE_BYTES
from meshant.core.tasks.work import Assign, Deliver, Revoke, Watch, Work
from meshant.protocol.codec import BINARY, JSON


def flush(st: QueenState, work: list[Work], traces: dict[str, str]) -> None:
    """Turn ``work`` into sends on ``st``'s outbox, in order."""
    mono = st.now
    wall = st.wall(mono)
    by_id = st.registry.by_id
    results: dict[bytes, list[dict[str, Any]]] = {}
    assigns: dict[bytes, tuple[Node, list[dict[str, Any]]]] = {}
    for w in work:
        match w:
            case Assign(node=node, attempt=att):
                task = att.task
                body: dict[str, Any] = {"task": task.id, "attempt": att.number,
                                        "capability": task.capability, "payload": task.payload}
                if task.deadline is not None:
                    left = task.deadline - mono
                    body["timeout"] = left
                    body["deadline"] = wall + left
                if node.codec == JSON or is_graph_node(task.id):
                    body["node"] = task.id  # (a graph node's task: the spec's §7d)
                if task.steps and "steps" in node.features:
                    # What its earlier runs recorded goes with it, while small.
                    if task.steps_bytes <= INLINE_BYTES:
                        body["steps"] = task.steps
                    else:
                        body["steps_total"] = len(task.steps)
                if task.parent is not None:
                    body["parent"] = task.parent
                tp = traces.get(task.id) if traces else None
                if "batch" in node.features:
                    body["id"] = att.id
                    if tp is not None:
                        body["traceparent"] = tp
                    assigns.setdefault(node.identity, (node, []))[1].append(body)
                    continue
                st.send(node, p.Message("task.assign", body, id=att.id, to=node.name, ts=wall,
                                        extra={"traceparent": tp} if tp else None))
            case Deliver(task=task, kind=kind, body=body):
                if traces and task.final is not None:
                    traces.pop(task.id, None)
                client = task.client
                if task.parent is not None or not client:
                    # A sub-task's caller is a run that suspended on it: its end wakes the
                    # parent (the scheduler), whose re-run reads it with task.call. No
                    # connection follows a schedule's task (its result is the journal's),
                    # nor a restored one until its client says hello again.
                    continue
                if kind != "task.result" or body.get("partial"):
                    peer = by_id.get(client)
                    if peer is None or "progress" not in peer.features:
                        continue
                if kind == "task.result" or kind == "task.progress":
                    peer = by_id.get(client)
                    if peer is not None and "batch" in peer.features:
                        if kind == "task.result":
                            results.setdefault(client, []).append(body)
                            continue
                        if "batch.progress" in peer.features:
                            results.setdefault(client, []).append(
                                {**body, "kind": kind})
                            continue
                if client in results:
                    _send_results(st, client, results.pop(client))
                st.send_to(client, BINARY,
                           p.Message(kind, body, to=task.client_name, ref=task.id, ts=wall))
            case Revoke(node=node, attempt=att):
                if node.identity in assigns:
                    _send_assigns(st, *assigns.pop(node.identity))
                st.send(node, p.Message("task.cancel", {"task": att.task.id}, to=node.name,
                                        ref=att.id, ts=wall))
            case Watch(identity=identity, name=name, body=body):
                st.send_to(identity, BINARY, p.Message("task.result", body, to=name,
                                                       ref=body["task"], ts=wall))
    for node, items in assigns.values():
        _send_assigns(st, node, items)
    for client, items2 in results.items():
        _send_results(st, client, items2)


def _send_assigns(st: QueenState, node: Node, items: list[dict[str, Any]]) -> None:
    if len(items) == 1:
        body = items[0]
        tp = body.pop("traceparent", None)
        st.send(node, p.Message("task.assign", body, id=body.pop("id"), to=node.name,
                                extra={"traceparent": tp} if tp else None))
    else:
        st.send(node, p.Message("task.assigns", {"assigns": items}, to=node.name))


def _send_results(st: QueenState, client: bytes, items: list[dict[str, Any]]) -> None:
    if len(items) == 1:
        body = items[0]
        kind = body.get("kind", "task.result")
        if kind != "task.result":
            body = {k: v for k, v in body.items() if k != "kind"}
        msg = p.Message(kind, body, ref=body["task"])
    else:
        msg = p.Message("task.batch", {"results": items})
    st.send_to(client, BINARY, msg)


__all__ = ["flush"]
