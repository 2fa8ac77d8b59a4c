"""Observing the colony: the snapshot (sans-IO, on the in-memory colony), the metrics and
the HTTP side of a live queen, and ``meshant top``."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshant import Client, Forager, Queen, TaskCancelled
from meshant.observe import Observer
from meshant.observe.server import parse_http
from meshant.observe.snapshot import BUCKETS
from meshant.observe.top import frame

from .conftest import Procs, wait_for
from .inmemory import InMemoryColony


def _run_one(sim: InMemoryColony, client: Any, forager: Any, result: Any = "ok",
             dt: float = 0.0, **kw: Any) -> None:
    client.send("task.submit", {"capability": "echo", "payload": 1, **kw})
    (a,) = sim.assigns(forager)
    sim.advance(dt)
    forager.send("task.result", {"status": "ok", "result": result}, ref=a["id"])


# -- the snapshot, sans-IO ------------------------------------------------------------------


def test_snapshot_counts_per_capability_and_times_each_task_once() -> None:
    sim = InMemoryColony()
    obs = Observer(period=0.5)
    c = sim.client()
    f = sim.forager("f1", slots=1, tools=["echo"], labels={"zone": "a"})
    c.send("task.submit", {"capability": "echo", "payload": 1})
    sim.advance(0.3)  # a free forager took it at once: this is run time
    (a,) = sim.assigns(f)
    c.send("task.submit", {"capability": "echo", "payload": 2})  # queued behind it
    s = obs.publish(sim.core, sim.now, 1e9)
    assert s["queues"] == {"echo": 1} and s["queued"] == 1 and s["running"] == 1
    assert s["submitted"] == {"echo": 2} and s["completed"] == {}
    (fr,) = s["foragers"]
    assert fr["name"] == "f1" and fr["labels"] == {"zone": "a"} and fr["breaker"] == "closed"
    assert s["slots_free"] == 0 and s["foragers_by_state"]["active"] == 1
    assert [t["task"] for t in s["running_tasks"]] == [a["task"]]
    sim.advance(2.0)
    f.send("task.result", {"status": "ok", "result": "x"}, ref=a["id"])
    (b,) = sim.assigns(f)
    sim.advance(0.5)
    f.send("task.result", {"status": "ok", "result": "y"}, ref=b["id"])
    s = obs.publish(sim.core, sim.now, 1e9)
    assert s["completed"] == {"echo": 2} and s["submitted"] == {"echo": 2}
    lat = s["histograms"]["latency"]
    assert lat["count"] == 2 and sum(lat["counts"]) == 2
    # The second task waited 2 s for the first; they ran 2.3 s and 0.5 s.
    wait = s["histograms"]["queue_wait"]
    assert wait["count"] == 2 and 1.9 < wait["sum"] < 2.1
    run = s["histograms"]["run_time"]
    assert run["count"] == 2 and 2.7 < run["sum"] < 2.9
    assert s["latency"]["n"] == 2 and s["latency"]["p99"] >= s["latency"]["p50"] > 0
    # Published again with nothing new: nothing counted twice.
    s2 = obs.publish(sim.core, sim.now + 0.5, 1e9)
    assert s2["histograms"]["latency"]["count"] == 2 and s2["seq"] == s["seq"] + 1
    assert [t["state"] for t in s2["recent_tasks"]] == ["completed", "completed"]
    hist = s2["recent_tasks"][0]["history"]
    assert hist[0][1:] == ["queued", "submitted"] and hist[-1][1] == "completed"
    assert len(s2["history"]) == 3 and s2["role"] == "leader"


def test_snapshot_failures_reissues_and_dead_letters() -> None:
    sim = InMemoryColony(breaker_threshold=1)
    obs = Observer()
    c = sim.client()
    f = sim.forager("f1")
    c.send("task.submit", {"capability": "echo", "payload": 1, "max_attempts": 1})
    (a,) = sim.assigns(f)
    # A failure its handler asked to retry (an outage's kind): it counts for the breakers.
    f.send("task.result", {"status": "error", "error": {"type": "X", "message": "no",
                                                        "retry": True}}, ref=a["id"])
    s = obs.publish(sim.core, sim.now, 0.0)
    assert s["failed"] == {"echo": 1} and s["dead_letters"] == 1
    (d,) = s["dead_letter_tasks"]
    assert d["task"] == a["task"] and d["error"]["code"]
    assert s["breakers"]["foragers"] == {"f1": "open"}
    assert s["foragers"][0]["breaker"] == "open"


def test_observer_keeps_bounded_lists() -> None:
    sim = InMemoryColony()
    obs = Observer()
    c = sim.client()
    f = sim.forager("f1", slots=1)
    for _ in range(60):
        _run_one(sim, c, f)
    s = obs.publish(sim.core, sim.now, 0.0)
    assert s["completed"] == {"echo": 60} and len(s["recent_tasks"]) == 40
    assert len(BUCKETS) + 1 == len(s["histograms"]["latency"]["counts"])
    with pytest.raises(ValueError):
        Observer(period=0)


def test_parse_http() -> None:
    assert parse_http("9100") == ("127.0.0.1", 9100)
    assert parse_http("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_http("[::1]:0") == ("::1", 0)
    for bad in ("", "host:", "x:99999", "abc"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_http(bad)


def test_top_frame() -> None:
    st = {"queen": {"name": "q1", "colony": "c", "uptime": 3.0, "endpoint": "tcp://x"},
          "counters": {"submitted": 10, "completed": 8, "failed": 1},
          "queued": 1, "running": 1, "clients": 1, "dead_letters": 1,
          "queues": {"echo": 1}, "breakers": {"foragers": {"f2": "open"}, "capabilities": {}},
          "foragers": [{"name": f"f{i}", "state": "active", "slots": 2, "in_flight": 1,
                        "last_seen_age": 0.2, "tools": ["echo"]} for i in range(30)]}
    prev = {**st, "counters": {"completed": 4, "failed": 0}}
    lines = frame(st, prev, 2.0, width=80, height=20)
    text = "\n".join(lines)
    assert "queen q1" in lines[0] and "throughput 2.5/s" in text
    assert "echo=1" in text and "forager f2 open" in text and "slots 30/60 busy" in text
    assert len(lines) <= 20 and all(len(x) <= 80 for x in lines)
    assert "more" in lines[-1]
    assert "throughput -" in "\n".join(frame(st))


# -- the HTTP side of a live queen -------------------------------------------------------


def _get(url: str, **headers: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: bytes, token: str | None = None, **more: str
          ) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **more}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def live() -> Iterator[tuple[Queen, Forager, Client]]:
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", http="127.0.0.1:0",
              http_token="t0ken", hb_interval=0.2).start()
    f = Forager(q.endpoint, name="obs-f1", slots=2)

    @f.task("echo")
    def echo(x: Any) -> Any:
        return x

    @f.task("nap")
    def nap(x: Any, ctx: Any) -> Any:
        ctx.cancelled.wait(30)
        return x

    f.start()
    c = Client(q.endpoint)
    try:
        yield q, f, c
    finally:
        c.close()
        f.stop()
        q.stop()


def test_metrics_healthz_and_snapshot_over_http(live: tuple[Queen, Forager, Client]) -> None:
    q, _, c = live
    url = q.http_url
    assert url is not None and url.startswith("http://127.0.0.1:")
    for i in range(10):
        assert c.run("echo", i, result_timeout=10) == i

    def scraped() -> dict[str, Any]:
        status, body = _get(url + "metrics")
        assert status == 200
        return {s.name + json.dumps(s.labels, sort_keys=True): s.value
                for fam in text_string_to_metric_families(body.decode())
                for s in fam.samples}

    m = wait_for(lambda: (m := scraped()).get(
        'meshant_tasks_completed_total{"capability": "echo"}') == 10 and m, 10,
        "the completed counter")
    assert m['meshant_tasks_submitted_total{"capability": "echo"}'] == 10
    assert m['meshant_foragers{"state": "active"}'] == 1
    assert m['meshant_slots_free{}'] == 2
    assert m['meshant_task_latency_seconds_count{}'] == 10
    assert m['meshant_task_latency_seconds_bucket{"le": "+Inf"}'] == 10
    info = json.dumps({"epoch": q.epoch, "name": "queen", "role": "leader"})
    assert m["meshant_queen_info" + info] == 1
    status, body = _get(url + "healthz")
    h = json.loads(body)
    assert status == 200 and h["status"] == "ok" and h["role"] == "leader"
    status, body = _get(url + "api/snapshot")
    s = json.loads(body)
    assert status == 200 and s["foragers"][0]["name"] == "obs-f1"
    status, body = _get(url)
    # Nothing fetched from elsewhere: every src and href is this server's.
    assert status == 200 and b"/static/dashboard.js" in body
    assert re.findall(rb'(?:src|href)="([^"]*)"', body) == [
        b"/static/dashboard.css", b"/metrics", b"/healthz", b"/static/dashboard.js"]
    status, body = _get(url + "static/dashboard.js")
    assert status == 200 and b"/api/events" in body
    assert _get(url + "nope")[0] == 404
    assert _get(url + "static/../snapshot.py")[0] == 404
    # The live feed: server-sent events, one snapshot per event.
    with urllib.request.urlopen(url + "api/events", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        first = json.loads(r.readline().removeprefix(b"data: "))
        assert r.readline() == b"\n"
        second = json.loads(r.readline().removeprefix(b"data: "))
    assert second["seq"] > first["seq"]


def test_task_timeline_and_actions_need_the_token(live: tuple[Queen, Forager, Client]
                                                  ) -> None:
    q, f, c = live
    url = q.http_url
    assert url is not None
    fut = c.submit("nap", "zz")
    wait_for(lambda: f.name in [x["forager"] for x in
                                json.loads(_get(url + "api/snapshot")[1])["running_tasks"]],
             10, "the task running")
    status, body = _get(url + f"api/task/{fut.task_id}")
    t = json.loads(body)
    assert status == 200 and t["state"] in ("assigned", "accepted")
    assert [h[1] for h in t["history"]][:2] == ["queued", "assigned"]
    assert _get(url + "api/task/no-such-task")[0] == 404
    action = url + "api/action/cancel"
    target = json.dumps({"target": fut.task_id}).encode()
    assert _post(action, target)[0] == 401
    assert _post(action, target, "wrong")[0] == 401
    assert _post(action, b"not json", "t0ken")[0] == 400
    assert _post(url + "api/action/explode", target, "t0ken")[0] == 404
    assert _post(url + "api/action/drain", b'{"target": "nobody"}', "t0ken")[0] == 404
    assert not fut.done()  # refused requests changed nothing
    status, r = _post(action, target, "t0ken")
    assert status == 200 and r["ok"]
    with pytest.raises(TaskCancelled):
        fut.result(10)
    assert _post(action, b'{"target": "no-such-task"}', "t0ken")[0] == 404


def test_read_only_without_a_token() -> None:
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", http="127.0.0.1:0").start()
    try:
        assert q.http_url is not None
        status, r = _post(q.http_url + "api/action/halt", b'{"target": "x"}', "anything")
        assert status == 403 and "--http-token" in r["error"]
    finally:
        q.stop()


def test_foreign_host_and_origin_are_refused_with_a_reason(
        live: tuple[Queen, Forager, Client]) -> None:
    q, f, _ = live
    url = q.http_url
    assert url is not None
    wait_for(lambda: json.loads(_get(url + "api/snapshot")[1]).get("foragers"), 10,
             "the forager listed")
    for path in ("", "static/dashboard.js", "healthz", "metrics", "api/snapshot",
                 "api/events"):
        # DNS rebinding: a page whose name now points at 127.0.0.1.
        status, body = _get(url + path, Host="evil.example:80")
        why = json.loads(body)["error"]
        assert status == 403 and "'evil.example'" in why and "--http-allow-host" in why
        # Another origin's script calling the port: reads are refused too.
        status, body = _get(url + path, Origin="http://evil.example")
        assert status == 403 and "cross-origin" in json.loads(body)["error"]
    own = url.rstrip("/")
    assert _get(url + "api/snapshot", Origin=own)[0] == 200  # the page's own requests
    assert _get(url + "api/snapshot", Host=f"localhost:{q._http.port}")[0] == 200
    status, r = _post(url + "api/action/drain", json.dumps({"target": f.name}).encode(),
                      "t0ken", Origin="http://evil.example")
    assert status == 403 and "cross-origin" in r["error"]
    assert json.loads(_get(url + "api/snapshot")[1])["foragers"][0]["state"] == "active"


def test_reads_with_and_without_the_read_token_behind_a_proxy_name() -> None:
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", http="127.0.0.1:0",
              http_token="act", http_read_token="rd",
              http_allow_host=("dash.example.org",)).start()
    try:
        url = q.http_url
        assert url is not None
        rd, act = {"Authorization": "Bearer rd"}, {"Authorization": "Bearer act"}
        # The page and its script carry no colony data: served, so the page can ask.
        assert _get(url)[0] == 200 and _get(url + "static/dashboard.js")[0] == 200
        for path in ("api/snapshot", "metrics", "api/events", "api/task/x"):
            status, body = _get(url + path)
            assert status == 401 and "Bearer" in json.loads(body)["error"], path
            assert _get(url + path, Authorization="Bearer wrong")[0] == 401, path
        assert _get(url + "api/snapshot", **rd)[0] == 200
        assert _get(url + "api/snapshot", **act)[0] == 200  # the action token reads too
        assert b"meshant_queen_info" in _get(url + "metrics", **rd)[1]
        # A supervisor without the token learns the status, nothing of the colony.
        status, body = _get(url + "healthz")
        assert status == 200 and json.loads(body) == {"status": "ok"}
        assert json.loads(_get(url + "healthz", **rd)[1])["name"] == "queen"
        assert json.loads(_get(url + "api/access")[1]) == {
            "read": False, "act": False, "actions": True, "read_token": True}
        assert json.loads(_get(url + "api/access", **rd)[1])["read"] is True
        assert json.loads(_get(url + "api/access", **act)[1])["act"] is True
        assert _post(url + "api/action/halt", b'{"target": "x"}', "rd")[0] == 401
        # Through a reverse proxy named dash.example.org (TLS in front, so https).
        assert _get(url + "api/snapshot", Host="dash.example.org", **rd)[0] == 200
        assert _get(url + "api/snapshot", Host="dash.example.org",
                    Origin="https://dash.example.org", **rd)[0] == 200
        assert _get(url + "api/snapshot", Host="other.example.org", **rd)[0] == 403
    finally:
        q.stop()


def test_the_queen_without_http_publishes_nothing() -> None:
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0").start()
    try:
        assert q.observer is None and q.http_url is None
    finally:
        q.stop()


# -- the CLI ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_queen_http_and_top(procs: Procs) -> None:
    r = subprocess.run([sys.executable, "-m", "meshant", "queen", "--http", "nope:x"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "HOST:PORT" in r.stderr
    _, info = procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                          "tcp://127.0.0.1:0", "--json", "--hb-interval", "0.2",
                          env={"MESHANT_HTTP": "127.0.0.1:0"})
    ep = info["router"]
    assert info["http"].startswith("http://127.0.0.1:")
    assert json.loads(_get(info["http"] + "healthz")[1])["status"] == "ok"
    procs.forager(ep, "--name", "top-ant", "--slots", "3")
    r = subprocess.run([sys.executable, "-m", "meshant", "top", "--once", "--queen", ep,
                        "--interval", "0.2"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "top-ant" in r.stdout and "throughput" in r.stdout and "queues:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "meshant", "top", "--json", "--queen", ep],
                       capture_output=True, text=True, timeout=30)
    assert json.loads(r.stdout)["foragers"][0]["name"] == "top-ant"
    # Full screen on a terminal: refreshed until q.
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes `meshant top` on the pty
        os.execve(sys.executable, [sys.executable, "-m", "meshant", "top", "--queen", ep,
                                   "--interval", "0.3"], {**os.environ, "TERM": "xterm"})
    try:
        seen = b""
        deadline = time.monotonic() + 20
        while seen.count(b"top-ant") < 2 and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                seen += os.read(fd, 65536)
        assert seen.count(b"top-ant") >= 2, seen[-500:]  # two frames: it refreshes
        assert b"\x1b[?1049h" in seen  # the alternate screen
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
        assert done and os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def test_a_long_queue_is_counted_in_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshant.observe import snapshot

    monkeypatch.setattr(snapshot, "SCAN_SLICE", 3)
    monkeypatch.setattr(snapshot, "SCAN_BUDGET", -1.0)  # one slice per snapshot
    sim = InMemoryColony()
    obs = Observer()
    c = sim.client()
    for i in range(8):  # nobody serves "later": they stay queued
        c.send("task.submit", {"capability": "later", "payload": i, "wait": 600})
    seen = [obs.publish(sim.core, sim.now, 0.0)["queues"] for _ in range(3)]
    assert seen[:2] == [{}, {}] and seen[2] == {"later": 8}  # 3 + 3 + 2
    c.send("task.cancel", {"task": sim.core.scheduler.queues.heaps["later"][0][2]})
    for i in range(2):
        c.send("task.submit", {"capability": "later", "payload": i, "wait": 600})
    subs = [obs.publish(sim.core, sim.now, 0.0) for _ in range(3)]
    # Submissions are counted exactly at once; the depth catches up when the pass ends.
    assert [s["submitted"]["later"] for s in subs] == [10, 10, 10]
    assert subs[0]["queues"] == {"later": 8} and subs[0]["cancelled"] == {"later": 1}
    assert subs[-1]["queues"] == {"later": 9}


def test_snapshot_of_a_standby() -> None:
    sim = InMemoryColony()
    obs = Observer()
    assert obs.publish(sim.core, sim.now, 0.0)["role"] == "leader"
    sim.core.lead(3, {"role": "standby", "term": 3, "leader": "tcp://10.0.0.1:5670"})
    s = obs.publish(sim.core, sim.now, 0.0)
    assert (s["role"], s["term"], s["leader"]) == ("standby", 3, "tcp://10.0.0.1:5670")
    assert obs.role == "standby"


@pytest.mark.slow
def test_leader_and_standby_over_http(procs: Procs, tmp_path: Any, pg_url: str) -> None:
    urls: dict[str, str] = {}
    pids: dict[str, subprocess.Popen[str]] = {}
    for name in ("qa", "qb"):
        p, info = procs.start("queen", "--name", name, "--bind", f"ipc://{tmp_path}/{name}",
                              "--pub", f"ipc://{tmp_path}/{name}-pub", "--json",
                              "--journal", pg_url, "--lease", "1.0", "--hb-interval", "0.2",
                              "--http", "127.0.0.1:0")
        urls[name], pids[name] = info["http"], p
        if name == "qa":  # qa leads before qb starts
            wait_for(lambda: json.loads(_get(urls["qa"] + "healthz")[1]).get("role")
                     == "leader", 15, "qa to lead")

    def health(name: str, leader: bool = False) -> tuple[int, dict[str, Any]]:
        status, body = _get(urls[name] + "healthz" + ("?leader" if leader else ""))
        return status, json.loads(body)

    st, h = wait_for(lambda: (r := health("qb"))[1].get("role") == "standby" and r, 15,
                     "qb's snapshot")
    assert st == 200 and h["leader"] == f"ipc://{tmp_path}/qa" and h["term"] >= 1
    assert health("qb", leader=True)[0] == 503  # a load balancer sends work to the leader
    assert health("qa", leader=True)[0] == 200
    metrics = _get(urls["qb"] + "metrics")[1].decode()
    assert "meshant_queen_leader 0.0" in metrics
    pids["qa"].kill()  # the leader dies: the standby takes over, and says so
    wait_for(lambda: health("qb", leader=True)[0] == 200, 20, "qb to lead")
    assert "meshant_queen_leader 1.0" in _get(urls["qb"] + "metrics")[1].decode()


def test_healthz_says_stalled_when_the_loop_stops_publishing() -> None:
    from meshant.observe.server import ObserveServer

    sim = InMemoryColony()
    obs = Observer()
    srv = ObserveServer(obs, "127.0.0.1:0")  # not started: health() reads the observer only
    assert srv.health()[0] == 503 and srv.health()[1]["status"] == "starting"
    obs.publish(sim.core, time.monotonic(), 0.0)
    assert srv.health()[0] == 200
    obs.publish(sim.core, time.monotonic() - 60, 0.0)  # the loop's last word a minute ago
    status, h = srv.health()
    assert status == 503 and h["status"] == "stalled"


def test_snapshot_lists_tasks_waiting_for_input_and_running_graphs() -> None:
    sim = InMemoryColony()
    obs = Observer()
    c = sim.client()
    f = sim.forager("f1", slots=2, tools=["echo"])
    c.send("task.submit", {"capability": "echo", "payload": 1})
    (a,) = sim.assigns(f)
    f.send("task.ask", {"request": f"{a['id']}.q1", "prompt": "which?"}, ref=a["id"])
    c.send("graph.submit", {"nodes": [
        {"name": "x", "capability": "echo", "payload": 1},
        {"name": "y", "capability": "echo", "payload": {"$result": "x"}}]}, id="g1")
    s = obs.publish(sim.core, sim.now, 0.0)
    assert s["waiting_input"] == 1
    assert [t["task"] for t in s["waiting_input_tasks"]] == [a["task"]]
    assert s["graphs_running"] == 1
    assert s["graphs"] == [{"graph": "g1", "state": "running", "client": "client",
                            "nodes": 2}]
