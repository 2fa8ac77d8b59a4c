"""Task graphs without sockets: the checks (cycles named, missing names, duplicates, the
size limit), substitution, and whole graphs run by a QueenCore in memory with its peers'
real sessions (tests/inmemory.py), a journal restart included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshant.core.graphs.model import GraphError, check_graph, find_cycle, normalize, substitute
from meshant.protocol.codes import Code
from meshant.storage import open_journal
from tests.inmemory import InMemoryColony, InMemoryPeer


def n(name: str, cap: str = "echo", payload: Any = None, **kw: Any) -> dict[str, Any]:
    return {"name": name, "capability": cap, "payload": payload, **kw}


# -- the document ------------------------------------------------------------------------

def test_cycle_is_named() -> None:
    with pytest.raises(GraphError) as e:
        check_graph([n("a", after=["c"]), n("b", after=["a"]), n("c", payload={"$result": "b"}),
                     n("d")], 100)
    assert e.value.code == Code.BAD_GRAPH
    assert "cycle" in e.value.message
    assert all(x in e.value.message for x in ("'a'" if False else "a ->", "b ->", "c ->"))


def test_missing_duplicate_oversize() -> None:
    with pytest.raises(GraphError, match="waits for 'zz', which is not a node"):
        check_graph([n("a"), n("b", payload={"x": [{"$results": ["a", "zz"]}]})], 100)
    with pytest.raises(GraphError, match="two nodes are named 'a'"):
        check_graph([n("a"), n("a")], 100)
    with pytest.raises(GraphError) as e:
        check_graph([n(f"x{i}") for i in range(11)], 10)
    assert e.value.code == Code.GRAPH_TOO_LARGE and "--max-graph-nodes" in e.value.message
    with pytest.raises(GraphError, match="capability"):
        check_graph([{"name": "a"}], 10)
    with pytest.raises(GraphError, match="unknown field"):
        check_graph([n("a", colour="red")], 10)
    with pytest.raises(GraphError, match="name"):
        check_graph([n("a/b")], 10)


def test_long_chain_has_no_recursion_limit() -> None:
    waits = {f"n{i}": [f"n{i - 1}"] if i else [] for i in range(20_000)}
    assert find_cycle(waits) is None
    waits["n0"] = ["n19999"]
    cyc = find_cycle(waits)
    assert cyc is not None and len(cyc) == 20_001


def test_normalize_and_substitute() -> None:
    assert normalize({"nodes": {"a": {"capability": "x"}}}) == [{"name": "a", "capability": "x"}]
    res = {"a": 1, "b": [2]}
    got = substitute({"k": {"$result": "a"}, "l": [{"$results": ["a", "b"]}],
                      "s": {"$spawned": "p"}, "keep": {"$result": "a", "other": 1}},
                     res.__getitem__, lambda x: ["c1"])
    assert got == {"k": 1, "l": [[1, [2]]], "s": ["c1"],
                   "keep": {"$result": "a", "other": 1}}


# -- running, in memory ------------------------------------------------------------------

def run_all(col: InMemoryColony, fg: InMemoryPeer, fn: Any = None,
            limit: int = 10_000) -> list[str]:
    """Answer every assign the forager gets with fn(body) (default: echo the payload),
    until none come; returns the task ids in the order they ran."""
    ran = []
    for _ in range(limit):
        got = col.assigns(fg)
        if not got:
            return ran
        for a in got:
            ran.append(a["task"])
            out = fn(a) if fn is not None else {"status": "ok", "result": a["payload"]}
            fg.send("task.result", out, ref=a["id"])
    raise AssertionError("did not settle")


def graph_msgs(client: InMemoryPeer, kind: str) -> list[dict[str, Any]]:
    return [m.b for m in client.take(kind)]


def test_diamond_substitutes_results() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=4, tools=["echo"])
    cl = col.client()
    cl.send("graph.submit", {"nodes": [
        n("a", payload=1), n("b", payload={"x": {"$result": "a"}}),
        n("c", payload={"y": {"$result": "a"}}),
        n("d", payload={"$results": ["b", "c"]})]}, id="g1")
    assert cl.one("graph.submitted").b == {"graph": "g1", "nodes": 4}
    ran = run_all(col, fg)
    assert ran[0] == "tg:g1/a" and ran[-1] == "tg:g1/d"
    results = col.results(cl)
    assert results["tg:g1/d"]["result"] == [{"x": 1}, {"y": 1}]
    assert len(results) == 4
    end = cl.one("graph.result").b
    assert end["state"] == "completed" and end["counts"] == {"completed": 4}


def test_failure_cancels_exactly_its_dependants() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=4, tools=["echo"])
    cl = col.client()
    cl.send("graph.submit", {"nodes": [
        n("root"), n("bad", after=["root"], max_attempts=1), n("down1", after=["bad"]),
        n("down2", payload={"$result": "down1"}), n("side", after=["root"]),
        n("side2", after=["side"]), n("join", after=["side2", "down2"])]}, id="g2")
    ran = run_all(col, fg, lambda a: {"status": "error", "error": {"message": "no"}}
                  if a["task"].endswith("/bad") else {"status": "ok", "result": 1})
    assert sorted(ran) == sorted(f"tg:g2/{x}" for x in ("root", "bad", "side", "side2"))
    nodes = {b["node"]: b for b in graph_msgs(cl, "graph.node")}
    assert set(nodes) == {"down1", "down2", "join"}
    assert all(b["state"] == "cancelled" and b["error"]["cause"] == Code.UPSTREAM_FAILED
               for b in nodes.values())
    end = cl.one("graph.result").b
    assert end["state"] == "failed" and end["failed"] == "bad"
    assert end["counts"] == {"completed": 3, "failed": 1, "cancelled": 3}


def test_refused_graph_runs_nothing() -> None:
    col = InMemoryColony(max_graph_nodes=5)
    fg = col.forager("f")
    cl = col.client()
    for nodes in ([n("a", after=["b"]), n("b", after=["a"])], [n("a", after=["x"])],
                  [n(f"x{i}") for i in range(6)]):
        cl.send("graph.submit", {"nodes": nodes})
        err = cl.one("error").b
        assert err["code"] in (Code.BAD_GRAPH, Code.GRAPH_TOO_LARGE), err
    assert col.assigns(fg) == [] and col.core.scheduler.counters["submitted"] == 0


def test_cancel_graph() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=1)
    cl = col.client()
    cl.send("graph.submit", {"nodes": [n("a"), n("b", after=["a"]), n("c")]}, id="g3")
    assert len(col.assigns(fg)) == 1
    cl.send("graph.cancel", {"graph": "g3"})
    assert fg.take("task.cancel")
    assert cl.one("graph.result").b["state"] == "cancelled"
    assert not col.core.graphs.graphs and col.core.scheduler.queued == 0


def test_spawn_fan_out_and_gather() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=8, tools=["echo", "plan"])
    cl = col.client()
    cl.send("graph.submit", {"nodes": [
        n("plan", "plan"), n("gather", payload={"$spawned": "plan"}),
        n("after", payload={"$result": "gather"})]}, id="g4")

    def work(a: dict[str, Any]) -> dict[str, Any]:
        if a["capability"] == "plan":
            fg.send("graph.spawn", {"nodes": [n(f"c{i}", payload=i) for i in range(50)]},
                    ref=a["id"])
            assert fg.one("graph.spawned").b["nodes"][0] == "c0"
            # A re-run attempt spawning the same nodes again changes nothing.
            fg.send("graph.spawn", {"nodes": [n("c0", payload=0)]}, ref=a["id"])
            fg.one("graph.spawned")
        return {"status": "ok", "result": a["payload"]}

    run_all(col, fg, work)
    results = col.results(cl)
    assert results["tg:g4/gather"]["result"] == list(range(50))
    assert cl.one("graph.result").b["counts"] == {"completed": 53}


def test_spawn_deadlock_refused() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=8, tools=["echo"])
    cl = col.client()
    cl.send("graph.submit", {"nodes": [n("p"), n("g", after_spawned=["p"])]}, id="g5")
    (a,) = col.assigns(fg)
    fg.send("graph.spawn", {"nodes": [n("c", after=["g"])]}, ref=a["id"])
    assert "cycle" in fg.one("error").b["message"]
    fg.send("graph.spawn", {"nodes": [n("c", after=["p"])]}, ref=a["id"])
    assert "cycle" not in str(fg.take())


@pytest.fixture(params=["sqlite", "postgresql"])
def journal_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An SQLite file or a PostgreSQL database (tests/pg_server.py) to journal to."""
    if request.param == "sqlite":
        return str(tmp_path / "j.db")
    return str(request.getfixturevalue("pg_url"))


def test_restart_carries_graph_on(journal_spec: str) -> None:
    j = open_journal(journal_spec)
    col = InMemoryColony(journal=j)
    fg = col.forager("f", slots=2)
    cl = col.client()
    cl.send("graph.submit", {"nodes": [n("a", payload=1), n("b", payload={"$result": "a"}),
                                       n("c", payload={"$result": "b"}),
                                       n("gone", max_attempts=1),
                                       n("never", after=["gone"])]}, id="g6")
    got = col.assigns(fg)
    a = next(x for x in got if x["task"].endswith("/a"))
    fg.send("task.result", {"status": "ok", "result": 10}, ref=a["id"])
    for x in got:
        if x["task"].endswith("/gone"):
            fg.send("task.result", {"status": "error", "error": {"message": "x"}}, ref=x["id"])
    (b,) = col.assigns(fg)
    assert b["payload"] == 10
    j.close()
    # Restarted on the journal: b is held for its forager, a's result stays known.
    j2 = open_journal(journal_spec)
    col2 = InMemoryColony(journal=j2)
    fg2 = col2.forager("f", slots=2, running=[b["id"]])
    cl2 = col2.client()
    cl2.send("graph.submit", {"nodes": []}, id="g6")  # the client re-sends its graph
    assert cl2.one("graph.submitted").b["graph"] == "g6"
    assert {m.b["node"] for m in cl2.take("graph.node")} == {"a", "gone", "never"}
    fg2.send("task.result", {"status": "ok", "result": 20}, ref=b["id"])
    ran = run_all(col2, fg2)
    assert ran == ["tg:g6/c"]
    assert col2.results(cl2)["tg:g6/c"]["result"] == 20
    end = cl2.one("graph.result").b
    assert end["state"] == "failed" and end["failed"] == "gone"
    st = j2.find_graph("g6")
    assert st is not None and st["counts"] == {"completed": 3, "failed": 1, "cancelled": 1}
    j2.close()


def test_graph_ended_meanwhile_tells_its_client_every_node_again(journal_spec: str) -> None:
    # The queen died with node b running; its successor ended the graph before the
    # client came back (b's result went nowhere): the client sending the graph again
    # hears every node's end, b's result too, before the graph's, from memory or, after
    # another restart, from the journal.
    j = open_journal(journal_spec)
    col = InMemoryColony(journal=j)
    fg = col.forager("f", slots=2)
    cl = col.client()
    cl.send("graph.submit", {"nodes": [n("a", payload=1), n("b", payload={"$result": "a"}),
                                       n("bad", max_attempts=1)]}, id="g7")
    for x in col.assigns(fg):
        if x["task"].endswith("/a"):
            fg.send("task.result", {"status": "ok", "result": 10}, ref=x["id"])
        else:
            fg.send("task.result", {"status": "error", "error": {"message": "x"}}, ref=x["id"])
    (b,) = col.assigns(fg)
    j.close()
    j2 = open_journal(journal_spec)
    col2 = InMemoryColony(journal=j2)
    fg2 = col2.forager("f", slots=2, running=[b["id"]])
    fg2.send("task.result", {"status": "ok", "result": 20}, ref=b["id"])
    for c in (col2.client(), None):
        if c is None:  # once more, on a queen that has the graph from its journal only
            j2.close()
            j2 = open_journal(journal_spec)
            c = InMemoryColony(journal=j2).client()
        c.send("graph.submit", {"nodes": []}, id="g7")
        got = [m for m in c.take() if m.kind in ("graph.node", "graph.result")]
        assert [m.kind for m in got] == ["graph.node"] * 3 + ["graph.result"]
        ends = {m.b["node"]: m.b for m in got[:3]}
        assert ends["a"]["result"] == 10 and ends["b"]["result"] == 20
        assert ends["bad"]["state"] == "failed" and ends["bad"]["error"]["message"] == "x"
        assert got[3].b["state"] == "failed" and "results" not in got[3].b
        c.send("graph.status", {"graph": "g7"})
        st = c.one("graph.state").b
        assert "results" not in st and st["counts"] == {"completed": 2, "failed": 1}
    j2.close()


def test_ended_graphs_results_kept_in_bytes_then_read_back(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    # Memory keeps finished graphs' node results up to a byte budget, the oldest let go
    # first; a client sending such a graph again has them read back from the journal.
    from meshant.core.graphs import book as graph_book

    monkeypatch.setattr(graph_book, "KEEP_DONE_RESULT_BYTES", 25_000)
    j = open_journal(str(tmp_path / "q.db"))
    col = InMemoryColony(journal=j)
    fg = col.forager("f", slots=1)
    cl = col.client()
    for g in ("g1", "g2", "g3"):
        cl.send("graph.submit", {"nodes": [n("a")]}, id=g)
        (x,) = col.assigns(fg)
        fg.send("task.result", {"status": "ok", "result": g * 5000}, ref=x["id"])
    book = col.core.graphs
    assert [book.has_results(g) for g in ("g1", "g2", "g3")] == [False, True, True]
    assert book._done_result_bytes == sum(book._done_results.values()) < 25_000
    cl.take()
    cl.send("graph.submit", {"nodes": []}, id="g1")
    got = [m for m in cl.take() if m.kind in ("graph.node", "graph.result")]
    assert [m.kind for m in got] == ["graph.node", "graph.result"]
    assert got[0].b["result"] == "g1" * 5000
    j.close()


def test_long_chain_failing_first_cancels_the_rest() -> None:
    col = InMemoryColony()
    fg = col.forager("f", slots=1)
    cl = col.client()
    nodes = [n("c0", max_attempts=1)] + [n(f"c{i}", after=[f"c{i - 1}"])
                                         for i in range(1, 5_000)]
    cl.send("graph.submit", {"nodes": nodes}, id="g7")
    (a,) = col.assigns(fg)
    fg.send("task.result", {"status": "error", "error": {"message": "x"}}, ref=a["id"])
    end = cl.one("graph.result").b
    assert end["counts"] == {"failed": 1, "cancelled": 4_999} and end["failed"] == "c0"


def test_journal_prunes_ended_graphs(journal_spec: str) -> None:
    j = open_journal(journal_spec)
    col = InMemoryColony(journal=j)
    fg = col.forager("f", slots=2)
    cl = col.client()
    for gid in ("old", "new"):
        cl.send("graph.submit", {"nodes": [n("a")]}, id=gid)
        run_all(col, fg)
    cl.send("graph.submit", {"nodes": [n("a")]}, id="live")
    assert j.find_graph("old") is not None
    j.prune(before=0.0, keep=1)  # keeps the newest ended graph, and the running one
    assert j.find_graph("old") is None
    assert j.find_graph("new") is not None and j.find_graph("live") is not None
    assert [g["id"] for g in j.unfinished_graphs()] == ["live"]
    j.close()


def test_payload_grown_past_the_limit_fails_its_node() -> None:
    col = InMemoryColony(max_message=64 * 1024)
    fg = col.forager("f", slots=2)
    cl = col.client()
    cl.send("graph.submit", {"nodes": [n("a"), n("b", payload=[{"$result": "a"}] * 3),
                                       n("c", after=["b"])]}, id="g8")
    (a,) = col.assigns(fg)
    fg.send("task.result", {"status": "ok", "result": "x" * 30_000}, ref=a["id"])
    assert col.assigns(fg) == []
    err = {m.b["node"]: m.b["error"] for m in cl.take("graph.node")}
    assert err["b"]["code"] == Code.TOO_LARGE and "--max-message" in err["b"]["message"]
    assert err["c"]["code"] == Code.UPSTREAM_FAILED
    assert cl.one("graph.result").b["failed"] == "b"
