"""Task graphs through the CLI, as a user runs them: real queen and forager processes,
`meshant graph submit/status/cancel`, foragers and the queen killed mid-graph."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from meshant import Client, MeshantError
from meshant.storage import open_journal

from .conftest import Procs, wait_for
from .test_cli import meshant
from .test_failover import Pair
from .test_journal import Restartable

pytestmark = pytest.mark.slow  # every test here starts subprocesses

APP = '''
import time
from meshant import Forager

forager = Forager()

@forager.task("add")
def add(p):
    return sum(p) if isinstance(p, list) else p

@forager.task("plan")
def plan(p, ctx):
    ctx.spawn_many([{"name": f"part{i}", "capability": "add", "payload": [i, i]}
                    for i in range(p)]).result(30)
    return p

@forager.task("slow")
def slow(p, ctx):
    ctx.cancelled.wait(p)
    return p
'''


def app_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "graphapp.py").write_text(APP)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                        os.environ.get("PYTHONPATH")]))}


def colony(procs: Procs, tmp_path: Path, *queen_args: str, foragers: int = 1,
           slots: int = 8) -> tuple[str, list[Any]]:
    _, ep = procs.queen(*queen_args)
    fs = [procs.start("forager", "--queen", ep, "--app", "graphapp:forager", "--builtins",
                      "--json", "--slots", str(slots), "--name", f"gf{i}",
                      env=app_env(tmp_path))[0] for i in range(foragers)]
    return ep, fs


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def test_diamond_fan_out_fan_in_status_and_cancel(procs: Procs, tmp_path: Path) -> None:
    ep, _ = colony(procs, tmp_path)
    doc = {"nodes": {
        "a": {"capability": "echo", "payload": 2},
        "b": {"capability": "add", "payload": [{"$result": "a"}, 10]},
        "c": {"capability": "add", "payload": [{"$result": "a"}, 100]},
        "d": {"capability": "add", "payload": {"$results": ["b", "c"]}},
        **{f"w{i}": {"capability": "add", "payload": [{"$result": "d"}, i]} for i in range(10)},
        "gather": {"capability": "echo", "payload": {"$results": [f"w{i}" for i in range(10)]}},
    }}
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    r = meshant("graph", "submit", str(f), "--wait", "--json", "--queen", ep)
    assert r.returncode == 0, r.stderr
    out = lines(r.stdout)
    gid = out[-1]["graph"]
    assert out[-1] == {"graph": gid, "state": "completed"}
    by = {x["node"]: x for x in out[:-1]}
    assert len(by) == 15 and all(x["state"] == "completed" for x in by.values())
    assert by["d"]["result"] == 114 and by["d"]["id"] == f"tg:{gid}/d"
    assert by["gather"]["result"] == [114 + i for i in range(10)]
    order = [x["node"] for x in out[:-1]]
    assert order.index("a") < order.index("b") < order.index("d") < order.index("gather")
    r = meshant("graph", "status", gid, "--json", "--queen", ep)
    st = json.loads(r.stdout)
    assert st["state"] == "completed" and st["counts"] == {"completed": 15}
    # From stdin, without waiting: the id; a running graph shows in `meshant status`.
    r = meshant("graph", "submit", "-", "--queen", ep, input=json.dumps(
        {"s": {"capability": "slow", "payload": 30}, "t": {"capability": "echo",
                                                           "after": ["s"]}}))
    assert r.returncode == 0, r.stderr
    gid2 = r.stdout.strip()
    wait_for(lambda: gid2 in meshant("status", "--queen", ep).stdout, what="graph in status")
    r = meshant("graph", "cancel", gid2, "--queen", ep)
    assert r.returncode == 0, r.stderr
    st = wait_for(lambda: (s := json.loads(meshant("graph", "status", gid2, "--json",
                                                   "--queen", ep).stdout))["state"] !=
                  "running" and s)
    assert st["state"] == "cancelled" and st["counts"] == {"cancelled": 2}
    r = meshant("graph", "status", "nope", "--queen", ep)
    assert r.returncode == 1 and "unknown-graph" in r.stderr


def test_bad_graphs_refused_with_nothing_run(procs: Procs, tmp_path: Path) -> None:
    ep, _ = colony(procs, tmp_path, "--max-graph-nodes", "5")
    cases = [
        ({"a": {"capability": "echo", "after": ["c"]}, "b": {"capability": "echo",
                                                           "after": ["a"]},
          "c": {"capability": "echo", "payload": {"$result": "b"}}}, "cycle: "),
        ({"a": {"capability": "echo", "payload": {"$result": "ghost"}}}, "'ghost'"),
        ({f"n{i}": {"capability": "echo"} for i in range(6)}, "graph-too-large"),
        ([{"name": "a", "capability": "echo"}, {"name": "a", "capability": "echo"}],
         "two nodes are named 'a'"),
    ]
    for doc, why in cases:
        r = meshant("graph", "submit", "-", "--wait", "--queen", ep, input=json.dumps(doc))
        assert r.returncode == 1 and why in r.stderr and "refused" in r.stderr, r.stderr
    r = meshant("graph", "submit", "-", "--queen", ep, input="{not json")
    assert r.returncode == 2 and "not JSON" in r.stderr
    st = json.loads(meshant("status", "--json", "--queen", ep).stdout)
    assert st["counters"]["submitted"] == 0 and st["counters"]["graphs"] == 0


def test_spawned_children_gathered(procs: Procs, tmp_path: Path) -> None:
    ep, _ = colony(procs, tmp_path)
    doc = {"plan": {"capability": "plan", "payload": 50},
           "gather": {"capability": "add", "payload": {"$spawned": "plan"}}}
    r = meshant("graph", "submit", "-", "--wait", "--json", "--queen", ep,
                input=json.dumps(doc))
    assert r.returncode == 0, r.stderr
    by = {x["node"]: x for x in lines(r.stdout)[:-1]}
    assert len(by) == 52 and by["gather"]["result"] == sum(2 * i for i in range(50))


@pytest.mark.parametrize("journal", [False, True])
def test_failed_node_cancels_its_dependants_only(procs: Procs, tmp_path: Path,
                                                 journal: bool) -> None:
    ep, _ = colony(procs, tmp_path, *(["--journal", str(tmp_path / "q.db")] if journal
                                      else []))
    doc = {"ok": {"capability": "echo", "payload": 1},
           "bad": {"capability": "fail", "payload": {"message": "nope"}, "max_attempts": 1},
           "down": {"capability": "echo", "payload": {"$result": "bad"}},
           "down2": {"capability": "echo", "after": ["down"]},
           "side": {"capability": "add", "payload": [{"$result": "ok"}, 1]}}
    r = meshant("graph", "submit", "-", "--wait", "--json", "--queen", ep,
                input=json.dumps(doc))
    assert r.returncode == 1
    out = lines(r.stdout)
    assert out[-1]["state"] == "failed"
    by = {x["node"]: x for x in out[:-1]}
    assert by["side"]["result"] == 2 and by["bad"]["error"]["message"] == "nope"
    assert {k for k, v in by.items() if v["state"] == "cancelled"} == {"down", "down2"}
    assert by["down2"]["error"]["code"] == "upstream-failed"
    gid = out[-1]["graph"]
    st = json.loads(meshant("graph", "status", gid, "--json", "--queen", ep).stdout)
    assert st["failed"] == "bad"
    # A finished graph's status names every node: state, attempt, error (#24, item 10).
    nodes = {n["node"]: n for n in st["node_states"]}
    assert {k: (v["state"], v["attempt"]) for k, v in nodes.items()} == {
        "ok": ("completed", 1), "bad": ("failed", 1), "down": ("cancelled", 0),
        "down2": ("cancelled", 0), "side": ("completed", 1)}
    assert nodes["bad"]["error"]["message"] == "nope" and nodes["bad"]["id"] == f"tg:{gid}/bad"
    assert "traceback" not in nodes["bad"]["error"]  # (the node's task has it)
    assert nodes["down"]["error"]["code"] == "upstream-failed"
    r = meshant("graph", "status", gid, "--queen", ep)
    assert r.returncode == 0 and f"graph {gid} failed, failed at 'bad'" in r.stdout
    assert re.search(r"bad +failed +fail +attempt 1 +\[handler-error\] \w+: nope", r.stdout), \
        r.stdout
    assert re.search(r"down2 +cancelled +echo +not run +\[upstream-failed\]", r.stdout)
    if journal:  # a queen restarted on the journal reads the finished graph from it
        first = procs.all[0]
        first.kill()
        first.wait(10)
        _, ep2 = procs.queen("--journal", str(tmp_path / "q.db"))
        again = json.loads(meshant("graph", "status", gid, "--json", "--queen", ep2).stdout)
        assert again["node_states"] == st["node_states"] and again["failed"] == "bad"


def test_forager_killed_mid_node(procs: Procs, tmp_path: Path) -> None:
    ep, fs = colony(procs, tmp_path, foragers=2, slots=1)
    with Client(ep) as c:
        h = c.submit_graph({"a": {"capability": "echo", "payload": 1},
                            "long": {"capability": "slow", "payload": 2, "after": ["a"]},
                            "z": {"capability": "add", "payload": [{"$result": "long"}, 1]}})
        tid = h.nodes["long"].task_id

        def running() -> Any:
            try:
                s = c.task_status(tid)
            except MeshantError:
                return None  # not a task yet
            return s["state"] == "accepted" and s

        st = wait_for(running, what="the long node running")
        victim = next(p for i, p in enumerate(fs) if f"gf{i}" == st["forager"])
        victim.send_signal(signal.SIGKILL)
        assert h.result(30) == {"a": 1, "long": 2, "z": 3}
        assert c.task_status(tid)["attempt"] == 2  # reissued once


def _plan(n: int) -> dict[str, Any]:
    """A chain of ``n`` short sleeps, a node on each using its result, one gathering."""
    nodes = {f"c{i}": {"capability": "slow", "payload": 0.05,
                       **({"after": [f"c{i - 1}"]} if i else {})} for i in range(n)}
    nodes.update({f"f{i}": {"capability": "add", "payload": [{"$result": f"c{i}"}, i]}
                  for i in range(n)})
    nodes["sum"] = {"capability": "add", "payload": {"$results": [f"f{i}" for i in range(n)]}}
    return nodes


def _once_each(journal: str, n: int) -> None:
    """Every node's task in the journal completed, once."""
    j = open_journal(journal, readonly=True)
    try:
        rows = [t for t in j.tasks(limit=10_000) if t["id"].startswith("tg:")]
        assert len(rows) == n
        for t in rows:
            states = [e["state"] for e in j.task(t["id"])["events"]]  # type: ignore[index]
            assert states.count("completed") == 1 and states[-1] == "completed", states
        (g,) = {t["id"][3:].rpartition("/")[0] for t in rows}
        assert j.find_graph(g)["counts"] == {"completed": n}  # type: ignore[index]
    finally:
        j.close()


def test_queen_killed_mid_graph_carries_on(procs: Procs, tmp_path: Path) -> None:
    # On SQLite; on PostgreSQL, test_standby_takes_over_mid_graph restores from it.
    q = Restartable(procs, tmp_path)
    for i in range(2):
        procs.start("forager", "--queen", q.router, "--app", "graphapp:forager", "--json",
                    "--slots", "4", "--name", f"gf{i}", env=app_env(tmp_path))
    n = 30
    with Client(q.router, queen_wait=60) as c:
        h = c.submit_graph(_plan(n))
        wait_for(lambda: sum(f.done() for f in h.nodes.values()) >= 10, 30,
                 what="graph under way")
        q.kill_and_restart()
        out = h.result(90)
    assert len(out) == 2 * n + 1 and out["sum"] == sum(0.05 + i for i in range(n))
    _once_each(q.journal, 2 * n + 1)


def test_standby_takes_over_mid_graph(procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    procs.start("forager", "--queen", pair.both, "--app", "graphapp:forager", "--json",
                "--slots", "8", "--name", "gf0", env=app_env(tmp_path))
    n = 30
    with Client(pair.both, queen_wait=60) as c:
        h = c.submit_graph(_plan(n))
        wait_for(lambda: sum(f.done() for f in h.nodes.values()) >= 10, 30,
                 what="graph under way")
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        out = h.result(90)
        assert c.status()["role"] == "leader"  # qb's answer: the client follows the leader
    assert len(out) == 2 * n + 1 and out["sum"] == sum(0.05 + i for i in range(n))
    _once_each(pg_url, 2 * n + 1)
