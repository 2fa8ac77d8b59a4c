"""Task graphs end to end over real sockets (in-process queen, foragers and clients):
the Python API, spawn from a handler, a 1,000-node graph, cancel."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from meshant import Graph, GraphFailed, TaskContext
from meshant.protocol.codes import Code

from .conftest import Colony, wait_for


def add(payload: Any) -> Any:
    return sum(payload) if isinstance(payload, list) else payload


def test_diamond_and_fan_in_python(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"add": add, "echo": lambda x: x}, slots=4)
    c = colony.client()
    g = Graph()
    g.node("a", "echo", 1)
    g.node("b", "add", [g.result("a"), 10])
    g.node("c", "add", [g.result("a"), 100])
    g.node("d", "add", g.results("b", "c"))
    for i in range(20):
        g.node(f"w{i}", "add", [g.result("d"), i])
    g.node("all", "echo", g.results(*[f"w{i}" for i in range(20)]))
    h = c.submit_graph(g, updates=True)
    out = h.result(20)
    assert out["d"] == 112 and out["all"] == [112 + i for i in range(20)]
    assert h.nodes["all"].result(0) == out["all"]
    kinds = [(u.kind, u.node) for u in h.updates(5)]
    assert ("started", "a") in kinds and ("finished", "all") in kinds


def test_spawned_children_and_gather(colony: Colony) -> None:
    colony.start_queen()

    def plan(payload: Any, ctx: TaskContext) -> str:
        names = ctx.spawn_many([{"name": f"part{i}", "capability": "square", "payload": i}
                                for i in range(50)]).result(10)
        assert len(names) == 50
        return "planned"

    colony.forager({"plan": plan, "square": lambda x: x * x, "echo": lambda x: x}, slots=8)
    c = colony.client()
    h = c.submit_graph({"plan": {"capability": "plan"},
                        "gather": {"capability": "echo", "payload": {"$spawned": "plan"}}})
    out = h.result(30)
    assert out["gather"] == [i * i for i in range(50)]
    assert len(out) == 52 and out["part7"] == 49


def test_refused_spawn_reaches_the_handler(colony: Colony) -> None:
    colony.start_queen()
    seen: list[str] = []

    def plan(payload: Any, ctx: TaskContext) -> None:
        try:
            ctx.spawn("x", "echo", after=["nowhere"]).result(10)
        except Exception as e:  # the queen's reason
            seen.append(str(e))

    colony.forager({"plan": plan, "echo": lambda x: x})
    c = colony.client()
    c.submit_graph({"p": {"capability": "plan"}}).result(20)
    assert "'nowhere', which is not a node" in seen[0]


def test_thousand_nodes(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"add": add}, slots=16)
    c = colony.client()
    g = Graph()
    for i in range(500):  # a chain of 500, and 499 beside it joining in
        g.node(f"c{i}", "add", [g.result(f"c{i - 1}"), 1] if i else [0])
    for i in range(499):
        g.node(f"s{i}", "add", [g.result(f"c{i}"), 0])
    g.node("end", "add", g.results(*[f"s{i}" for i in range(499)]))
    out = c.submit_graph(g).result(60)
    assert len(out) == 1000 and out["c499"] == 499
    assert out["end"] == sum(range(499))


def test_failure_and_cancel(colony: Colony) -> None:
    colony.start_queen()
    release = threading.Event()

    def boom(payload: Any) -> None:
        raise ValueError("boom")

    def block(payload: Any, ctx: TaskContext) -> str:
        ctx.cancelled.wait(10)
        return "stopped"

    colony.forager({"boom": boom, "echo": lambda x: x, "block": block}, slots=4)
    c = colony.client()
    h = c.submit_graph({"ok": {"capability": "echo", "payload": 1},
                        "bad": {"capability": "boom", "max_attempts": 1},
                        "down": {"capability": "echo", "payload": {"$result": "bad"}},
                        "side": {"capability": "echo", "after": ["ok"]}})
    with pytest.raises(GraphFailed) as e:
        h.result(20)
    assert e.value.failed == "bad" and e.value.results == {"ok": 1, "side": None}
    assert e.value.errors["down"].code == Code.UPSTREAM_FAILED
    h2 = c.submit_graph({"b": {"capability": "block"},
                         "after": {"capability": "echo", "after": ["b"]}})
    wait_for(lambda: c.graph_status(h2.id)["counts"].get("running"), what="running")
    h2.cancel()
    with pytest.raises(GraphFailed):
        h2.result(20)
    assert h2.state == "cancelled"
    assert c.graph_status(h2.id)["state"] == "cancelled"
    release.set()


def test_progress_updates_and_async_client(colony: Colony) -> None:
    import asyncio

    from meshant import AsyncClient

    colony.start_queen()

    def work(payload: Any, ctx: TaskContext) -> Any:
        ctx.progress(0.5, "half")
        return payload

    colony.forager({"work": work})
    c = colony.client()
    h = c.submit_graph({"a": {"capability": "work", "payload": 1},
                        "b": {"capability": "work", "payload": {"$result": "a"}}})
    assert h.result(20) == {"a": 1, "b": 1}
    ups = [(u.kind, u.node, u.note) for u in h.updates(5)]
    assert ("progress", "a", "half") in ups and ("finished", "b", None) in ups

    async def main() -> dict[str, Any]:
        async with AsyncClient(colony.endpoint, context=colony.ctx) as ac:
            return await ac.submit_graph({"x": {"capability": "work", "payload": 7}})

    assert asyncio.run(main()) == {"x": 7}
