"""The promises under faults and load: nothing a caller submitted is lost across a queen
outage, sizes are enforced early with the size in the error, back-pressure is honoured,
and the client's I/O thread never dies silently."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from meshant import (
    Client,
    ConfigError,
    Forager,
    MeshantError,
    NoForager,
    Queen,
    TaskContext,
    TooLarge,
)
from meshant import protocol as p

from .conftest import Colony, Procs, wait_for
from .test_cli import meshant
from .test_journal import Restartable


@pytest.mark.slow
def test_soak_queen_down_past_the_heartbeat_timeout_loses_no_submission(
        procs: Procs, tmp_path: Path) -> None:
    # The chaos soak that found 172 task-lost in 24,000, in small: a client keeps
    # submitting while the queen is killed and kept down longer than the client's
    # heartbeat timeout (1 s here), twice, and a forager is killed and replaced.
    q = Restartable(procs, tmp_path)
    foragers = [procs.forager(q.router, "--name", f"f{i}", "--slots", "4")[0]
                for i in range(3)]
    futures: list[Any] = []
    stop = threading.Event()
    with Client(q.router, queen_wait=60) as c:
        def submit() -> None:
            i = 0
            while not stop.is_set():
                cap = "sleep" if i % 2 else "echo"
                futures.append((i, c.submit(cap, {"seconds": 0.01, "n": i})))
                i += 1
                time.sleep(0.02)

        t = threading.Thread(target=submit)
        t.start()
        try:
            for down in (3.0, 2.0):
                wait_for(lambda: c.status()["counters"]["completed"] > 50, 20, "work")
                q.proc.send_signal(signal.SIGKILL)
                q.proc.wait(10)
                time.sleep(down)  # past the client's and foragers' heartbeat timeout
                q.start()
                foragers[0].send_signal(signal.SIGKILL)
                foragers[0] = procs.forager(q.router, "--name", "f0-again", "--slots", "4")[0]
            time.sleep(2)
        finally:
            stop.set()
            t.join(10)
        results = [(i, f.result(90)) for i, f in futures]
    assert len(results) > 300
    for i, r in results:
        assert r["n"] == i, (i, r)  # every task's own result, none lost, none failed
    rows = [json.loads(x) for x in meshant("tasks", "--journal", q.journal, "--limit",
                                           str(len(results) + 100), "--json").stdout.splitlines()]
    assert len(rows) == len(results) and {x["state"] for x in rows} == {"completed"}
    assert meshant("journal", "verify", "--journal", q.journal).returncode == 0


def test_an_oversized_submission_fails_at_once_naming_the_sizes(colony: Colony) -> None:
    colony.start_queen(max_message=100_000)
    c = colony.client()
    assert c.max_message == 100_000  # from the welcome
    with pytest.raises(TooLarge) as info:
        c.submit("echo", "x" * 200_000)
    assert "200,1" in info.value.message and "100,000" in info.value.message
    assert info.value.code == "too-large"
    assert c.status()["counters"]["submitted"] == 0  # nothing was sent


def test_an_oversized_result_fails_the_task_once_without_retry(colony: Colony) -> None:
    colony.start_queen(max_message=100_000)
    runs: list[int] = []

    def big(payload: Any) -> str:
        runs.append(1)
        return "y" * 150_000

    colony.forager({"big": big})
    colony.forager({"big": big})
    c = colony.client()
    with pytest.raises(MeshantError) as info:
        c.submit("big", None, max_attempts=3).result(10)
    assert info.value.code == "too-large"
    assert "100,000" in info.value.message
    assert len(runs) == 1  # a retry could not have made it smaller
    assert c.status()["dead_letters"] == 1


def test_a_result_over_the_limit_that_reaches_the_queen_fails_at_once(
        colony: Colony, ctx: zmq.Context[Any]) -> None:
    # A forager that does not check sizes (not meshant's): the queen fails the task
    # itself rather than let the lease run out and run it again elsewhere.
    q = colony.start_queen(max_message=100_000, assign_timeout=60)
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(q.endpoint)
    hello = p.Message("hello", {"role": "forager", "name": "careless", "versions": [2],
                                "slots": 1, "tools": ["big"]}, frm="careless")
    raw.send_multipart(p.binary.encode(hello))
    assert raw.poll(5000)
    assert p.binary.decode(raw.recv_multipart()).kind == "welcome"
    c = colony.client()
    fut = c.submit("big")
    assert raw.poll(5000)
    assign = p.binary.decode(raw.recv_multipart())
    assert assign.kind == "task.assign"
    huge = p.Message("task.result", {"status": "ok", "result": "z" * 120_000},
                     ref=assign.id, frm="careless")
    raw.send_multipart(p.binary.encode(huge))
    with pytest.raises(MeshantError) as info:
        fut.result(10)
    assert info.value.code == "too-large" and "careless" in info.value.message
    raw.close(0)


@pytest.mark.slow
def test_a_flood_of_submissions_is_paced_not_refused(colony: Colony) -> None:
    colony.start_queen(submit_rate=500.0)
    colony.forager({"echo": lambda x: x}, slots=8)
    c = colony.client()
    futs = [c.submit("echo", i) for i in range(3000)]
    assert [f.result(60) for f in futs] == list(range(3000))
    counters = c.status()["counters"]
    assert counters["rate_limited"] > 0  # the queen did push back, and lost nothing
    assert counters["submitted"] == 3000


def test_a_raising_progress_callback_is_reported_and_the_client_goes_on(
        colony: Colony, caplog: pytest.LogCaptureFixture) -> None:
    colony.start_queen()

    def talk(payload: Any, ctx: TaskContext) -> str:
        ctx.progress(0.5, "half")
        ctx.partial("p")
        return "done"

    colony.forager({"talk": talk})

    def bad(task_id: str, update: Any) -> None:
        raise RuntimeError("callback bug")

    c = colony.client(on_progress=bad)
    with caplog.at_level(logging.ERROR, "meshant.client"):
        fut = c.submit("talk")
        assert fut.result(10) == "done"
        kinds = [u.kind for u in fut.updates(5)]
    assert "callback-error" in kinds and "progress" in kinds and "partial" in kinds
    assert "callback bug" in caplog.text
    assert c.run("talk", result_timeout=10) == "done"  # the I/O thread lives on


def test_a_dead_io_thread_fails_pending_futures_and_new_calls(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client()

    def broken(msg: p.Message, now: float) -> str | None:
        raise RuntimeError("a bug in a handler")

    c.link.role.on_message = broken  # type: ignore[method-assign]  # a bug that kills the I/O thread
    colony.forager({"echo": lambda x: x})
    fut = c.submit("echo", 1)
    with pytest.raises(MeshantError) as info:
        fut.result(10)
    assert info.value.code == "io-failed" and "a bug in a handler" in info.value.message
    with pytest.raises(MeshantError) as info2:
        c.submit("echo", 2)
    assert info2.value.code == "io-failed"


@pytest.mark.parametrize("endpoint", ["bogus-endpoint", "tcp://127.0.0.1", "tcp://:x",
                                      "tcp://127.0.0.1:99999", "http://127.0.0.1:5670"])
def test_a_malformed_endpoint_is_refused_in_the_constructor(endpoint: str) -> None:
    with pytest.raises(ConfigError) as info:
        Client(endpoint, timeout=1)
    assert endpoint in str(info.value) and "tcp://" in str(info.value)
    with pytest.raises(ValueError):
        Forager(endpoint)


@pytest.mark.slow
def test_a_task_nobody_serves_fails_as_no_forager_even_when_its_timeout_ends_it(
        colony: Colony) -> None:
    colony.start_queen()
    c = colony.client()
    with pytest.raises(NoForager) as info:
        c.submit("nosuch", {}, timeout=0.5).result(10)
    assert "'nosuch'" in info.value.message and "0.5 s" in info.value.message
    r = meshant("submit", "--queen", colony.endpoint, "nosuch", "{}", "--timeout", "0.5")
    assert r.returncode != 0 and "no-forager" in r.stderr and "nosuch" in r.stderr


@pytest.mark.slow
def test_a_forager_waiting_for_its_queen_says_so(procs: Procs) -> None:
    with zmq.Context() as zc:
        s = zc.socket(zmq.ROUTER)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        s.close(0)  # a free port nobody listens on
    proc, _ = procs.start("forager", "--queen", f"tcp://127.0.0.1:{port}", ready=False)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # bounded: the forager says it within a few seconds
    assert "waiting for the queen" in first and str(port) in first
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 0


def test_a_broadcast_over_the_limit_is_refused_and_pub_memory_is_bounded(
        colony: Colony) -> None:
    q = colony.start_queen(max_broadcast=64 * 1024, pub_buffer=16 * 1024 * 1024)
    assert q.pub_hwm == 256  # the byte budget over the largest broadcast
    c = colony.client()
    assert c.welcome["max_broadcast"] == 64 * 1024  # stated in the welcome
    with pytest.raises(TooLarge) as info:
        c.broadcast("news.big", "b" * 100_000)
    assert "100,1" in info.value.message and "65,536" in info.value.message
    c.broadcast("news.small", "fine")
    # Nothing went out for the big one; the queen goes on serving.
    wait_for(lambda: c.status()["counters"]["broadcasts"] == 1, 5, "the small broadcast")


def test_a_forager_stops_a_handler_the_restarted_queen_does_not_know(
        ctx: zmq.Context[Any], tmp_path: Path) -> None:
    router, pub = f"ipc://{tmp_path}/r", f"ipc://{tmp_path}/p"
    q = Queen(router, pub, hb_interval=0.2, hb_misses=5, context=ctx).start()
    ended = threading.Event()
    finished = threading.Event()  # bounds every handler run, whatever happens

    f = Forager(router, context=ctx)

    @f.task("stream")
    def stream(payload: Any, ctx_: TaskContext) -> str:
        while not ctx_.is_cancelled and not finished.is_set():
            ctx_.partial("tok")
            finished.wait(0.01)
        if ctx_.is_cancelled:
            ended.set()
        return "stopped"

    f.start(timeout=10)
    c = Client(router, context=ctx, queen_wait=60)
    try:
        c.submit("stream")
        wait_for(lambda: f.running, 10, "the stream to start")
        c.close()  # nobody will send it again: the restarted queen never hears of it
        q.stop()
        q = Queen(router, pub, hb_interval=0.2, hb_misses=5, context=ctx).start()
        assert ended.wait(15)  # told to stop, not left streaming into the void
    finally:
        finished.set()
        c.close()
        f.stop()
        q.stop()


def test_the_welcome_states_the_limit() -> None:
    terms = p.QueenTerms(epoch="e", max_message=12345)
    w = p.negotiate({"role": "client", "versions": [2]}, terms, "c")
    assert isinstance(w, p.Welcome) and w.body(terms)["max_message"] == 12345
    assert msgpack.unpackb(msgpack.packb(w.body(terms)))["max_message"] == 12345


def test_an_oversized_result_from_an_iacp_1_1_forager_fails_at_once(
        colony: Colony, ctx: zmq.Context[Any]) -> None:
    q = colony.start_queen(max_message=100_000, assign_timeout=60)
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(q.endpoint)

    def send(kind: str, ref: str | None = None, body: dict[str, Any] | None = None) -> None:
        env = {"v": "1.1", "id": f"m-{kind}", "from": "old", "to": "queen", "kind": kind,
               "ts": 1, **({"ref": ref} if ref else {}), **({"body": body} if body else {})}
        raw.send(json.dumps(env).encode())

    send("hb", body={"slots": 1, "tools": ["big"]})  # an IACP 1.1 forager registers so
    c = colony.client()
    fut = c.submit("big")
    assert raw.poll(5000)
    assign = json.loads(raw.recv())
    assert assign["kind"] == "task.assign"
    send("task.result", assign["id"], {"status": "ok", "result": "z" * 120_000})
    with pytest.raises(MeshantError) as info:
        fut.result(10)  # at once, not after the lease or the task's timeout
    assert info.value.code == "too-large" and "100,000" in info.value.message
    raw.close(0)


def test_an_empty_endpoint_is_refused_and_no_forager_names_the_labels(
        colony: Colony) -> None:
    with pytest.raises(ConfigError):
        Client("", timeout=1)
    colony.start_queen()
    colony.forager({"echo": lambda x: x})
    c = colony.client()
    with pytest.raises(NoForager) as info:
        c.submit("echo", {}, labels={"gpu": "1"}, timeout=0.5).result(10)
    assert "gpu='1'" in info.value.message


@pytest.mark.slow
def test_a_hung_handler_does_not_keep_the_forager_from_stopping(procs: Procs,
                                                                 tmp_path: Path) -> None:
    _, ep = procs.queen()
    (tmp_path / "hungapp.py").write_text(
        "import time\n"
        "from meshant import Forager\n"
        "forager = Forager()\n"
        "@forager.task('hang')\n"
        "def hang(payload):\n"
        "    time.sleep(3600)  # ignores its cancel, as a hung model call would\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc, _ = procs.start("forager", "--queen", ep, "--app", "hungapp:forager", "--json",
                          env=env)
    with Client(ep) as c:
        fut = c.submit("hang", None, max_attempts=1)
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", 10, "running")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) is not None  # it stops; the queen reissues what it ran


def test_a_bug_met_by_one_message_does_not_stop_the_queen(colony: Colony) -> None:
    q = colony.start_queen()
    c = colony.client()

    def boom(*_: object) -> None:
        raise RuntimeError("a bug in one handler")
    q.core._after["tool.query"] = boom
    with pytest.raises(MeshantError, match=r"no answer to tool\.query"):
        c.tool_query("echo", timeout=1)  # its message dropped: no answer
    assert q._thread is not None and q._thread.is_alive()
    st = c.status()  # still served
    assert st["counters"]["internal_errors"] == 1


def test_a_stopped_run_whose_id_a_new_assignment_reuses_reports_nothing() -> None:
    # A queen restarted without a task tells its forager to stop that run; the client
    # re-sends the task, which gets the same assignment id (attempt 1 again), maybe on the
    # same forager. When the old run ends, it must neither untrack nor answer for the new.
    from meshant.core.peers.forager_session import ForagerSession, Start

    fs = ForagerSession(["echo"], slots=2)
    body = {"task": "t", "attempt": 1, "capability": "echo", "payload": 1}
    fs.assign("t.1", body, None, 0.0)
    (old,) = fs.take()
    fs.error(None, {"code": "unknown-task", "assign": "t.1", "message": "gone"})
    fs.finished("t.1", old.run, {"status": "cancelled"})  # (its handler stopped)
    fs.flush(0.0)
    fs.assign("t.1", body, None, 1.0)  # the re-sent task, the same assignment id
    new = next(a for a in fs.take() if isinstance(a, Start))
    assert isinstance(old, Start) and new.run != old.run
    fs.assign("t.2", {**body, "task": "u"}, None, 1.0)  # (another run, to show order)
    fs.take()
    assert not fs.finished("t.1", old.run, {"status": "ok", "result": "stale"})
    assert "t.1" in fs.running and fs.flush(1.0) == []
    assert fs.finished("t.1", new.run, {"status": "ok", "result": "fresh"})
    assert "t.1" not in fs.running
    (msg,) = fs.flush(1.0)
    assert msg.b["result"] == "fresh" and msg.ref == "t.1"


def test_updates_the_queen_lacks_are_sent_again_after_its_welcome() -> None:
    # Partials that died with a connection (or with a queen that had not journaled them)
    # go again, in order, before anything new; what the queen has does not.
    from meshant import protocol as p
    from meshant.core.peers.forager_session import ForagerSession

    fs = ForagerSession(["echo"], slots=2)
    fs.features = frozenset({"progress"})
    for ref in ("a.1", "b.1"):
        fs.assign(ref, {"task": ref[0], "attempt": 1, "capability": "echo"}, None, 0.0)
    runs = {s.ref: s.run for s in fs.take()}
    for i in range(3):
        fs.send(p.Message("task.result", {"partial": True, "value": i}, ref="a.1"))
    fs.send(p.Message("task.progress", {"fraction": 0.5}, ref="b.1"))
    sent = fs.flush(0.0)
    assert [m.b.get("n") for m in sent] == [1, 2, 3, 1]  # numbered per run
    fs.finished("b.1", runs["b.1"], {"status": "ok", "result": 1})  # b ends meanwhile
    for m in fs.flush(0.0):
        fs.sent(m, 0.0)
    fs.queen_lost()
    fs.welcomed(False, {"a.1": 1, "b.1": 0})  # the queen took a's first only, none of b's
    again = [(m.kind, m.ref, m.b.get("n")) for m in fs.flush(1.0)]
    assert [x for x in again if x[1] == "a.1"] == [("task.result", "a.1", 2),
                                                   ("task.result", "a.1", 3)]
    assert [x for x in again if x[1] == "b.1"] == [("task.progress", "b.1", 1),
                                                   ("task.result", "b.1", None)]  # then b's end
    fs.welcomed(False, None)  # a queen that sends no map: nothing again
    assert fs.flush(2.0) == []


@pytest.mark.slow
def test_a_draining_forager_whose_queen_is_gone_leaves_within_a_heartbeat_timeout(
        procs: Procs) -> None:
    # Its last result is kept for re-sending to a queen that restarts; with the queen gone
    # (stopped cleanly: its farewell), SIGTERM's drain used to wait for that queen for the
    # whole drain timeout (600 s). It waits a heartbeat timeout (5 x 0.2 s here), then goes.
    qp, router = procs.queen("--journal", ":memory:")
    fp, _ = procs.forager(router, "--name", "late-ant")
    with Client(router) as c:
        assert c.run("echo", 1, result_timeout=20) == 1
    qp.send_signal(signal.SIGTERM)
    assert qp.wait(10) == 0
    fp.send_signal(signal.SIGTERM)
    assert fp.wait(10) == 0
    assert fp.stderr is not None
    err = fp.stderr.read()
    assert "leaving with 1 messages unsent: the queen is gone" in err or "reconnecting" not in err


@pytest.mark.slow
def test_a_draining_forager_whose_queen_was_killed_stops_its_running_task(
        procs: Procs) -> None:
    # A forager running a long task, its queen killed (no farewell): SIGTERM's drain used
    # to wait for the task to finish (here ten minutes), though its result could reach no
    # queen. With no queen for a heartbeat timeout (5 x 0.2 s here) it stops instead.
    qp, router = procs.queen("--journal", ":memory:")
    fp, _ = procs.forager(router, "--name", "orphan-ant")
    with Client(router) as c:
        fut = c.submit("sleep", {"seconds": 600})
        wait_for(lambda: c.task_status(fut.task_id)["state"] == "accepted", timeout=30,
                 what="the sleep task accepted")
    qp.send_signal(signal.SIGKILL)
    qp.wait(10)
    fp.send_signal(signal.SIGTERM)
    assert fp.wait(10) == 0  # (TimeoutExpired: still draining)
    assert fp.stderr is not None
    err = fp.stderr.read()
    assert "the queen is gone; stopping, not draining" in err, err


def test_a_streaming_backlog_goes_out_in_slices_of_batched_results_in_order() -> None:
    # #26: consecutive results, partial or final, travel as one task.batch; a backlog
    # is handed out in slices (a full pipe then puts back one slice, not all of it);
    # only final results are kept for re-sending (partials are kept per run, numbered).
    from meshant import protocol as p
    from meshant.core.peers.forager_session import ForagerSession

    fs = ForagerSession(["echo"], slots=2)
    fs.features = frozenset({"progress", "batch"})
    fs.assign("a.1", {"task": "a", "attempt": 1, "capability": "echo"}, None, 0.0)
    (start,) = fs.take()
    for i in range(5):
        fs.send(p.Message("task.result", {"partial": True, "value": i}, ref="a.1"))
    fs.send(p.Message("task.progress", {"fraction": 0.5}, ref="a.1"))
    fs.send(p.Message("task.result", {"partial": True, "value": 5}, ref="a.1"))
    fs.finished("a.1", start.run, {"status": "ok", "result": "done"})
    first = fs.flush(0.0, limit=3)
    assert [m.kind for m in first] == ["task.batch"] and len(fs.outbox) == 5
    fs.unsent(first)  # the pipe was full: the slice goes back, in front, in order
    sent = fs.flush(0.0, limit=3) + fs.flush(0.0, limit=3) + fs.flush(0.0, limit=3)
    assert fs.flush(0.0) == [] and [m.kind for m in sent] == [
        "task.batch", "task.batch", "task.progress", "task.batch"]
    items = [r for m in sent if m.kind == "task.batch" for r in m.b["results"]]
    assert [r.get("value", r.get("result")) for r in items] == [0, 1, 2, 3, 4, 5, "done"]
    assert [r.get("n") for r in items] == [1, 2, 3, 4, 5, 7, None]  # (6: the progress)
    for m in sent:
        fs.sent(m, 0.0)
    assert [r["ref"] for _, _, r in fs._sent] == ["a.1"] and fs._sent[0][2]["result"] == "done"


def test_with_batch_progress_a_forager_batches_its_progress_with_its_results() -> None:
    # #26: progress reports join the run of results (an item with "kind"); a slice the
    # pipe did not take comes back as the messages the items stand for; progress is
    # never kept as a result to re-send.
    from meshant import protocol as p
    from meshant.core.peers.forager_session import ForagerSession

    fs = ForagerSession(["echo"], slots=1)
    fs.features = frozenset({"progress", "batch", "batch.progress"})
    fs.assign("a.1", {"task": "a", "attempt": 1, "capability": "echo"}, None, 0.0)
    (start,) = fs.take()
    for i in range(3):
        fs.send(p.Message("task.result", {"partial": True, "value": i}, ref="a.1"))
        fs.send(p.Message("task.progress", {"fraction": (i + 1) / 3}, ref="a.1"))
    fs.finished("a.1", start.run, {"status": "ok", "result": "done"})
    (batch,) = fs.flush(0.0)
    kinds = [r.get("kind", "partial" if r.get("partial") else "final")
             for r in batch.b["results"]]
    assert kinds == ["partial", "task.progress"] * 3 + ["final"]
    fs.unsent([batch])
    assert [m.kind for m in fs.outbox] == ["task.result", "task.progress"] * 3 + [
        "task.result"] and "kind" not in fs.outbox[1].b and fs.outbox[1].ref == "a.1"
    (again,) = fs.flush(0.0)
    fs.sent(again, 0.0)
    assert [r["result"] for _, _, r in fs._sent] == ["done"]


def test_updates_split_back_from_an_unsent_batch_are_not_lost_after_a_welcome() -> None:
    # Found by a review of #26: the welcome's re-send skipped only updates still queued
    # as the same objects; a batch split back by unsent() holds copies, so the kept
    # originals went first and the queen, which takes each number once and in order,
    # dropped the copies' numbers and more. Now what waits is matched by number.
    from meshant import protocol as p
    from meshant.core.peers.forager_session import ForagerSession

    fs = ForagerSession(["x"], 4)
    fs.features = frozenset({"batch", "progress", "batch.progress"})
    fs.assign("a1", {"capability": "x", "task": "t1"}, None, 0.0)
    fs.take()
    for _ in range(4000):
        fs.send(p.Message("task.result", {"partial": True, "value": "tok"}, ref="a1"))
    last, taken = 0, []

    def deliver(msg: Any) -> None:
        nonlocal last
        items = msg.b["results"] if msg.kind == "task.batch" else [dict(msg.b, ref=msg.ref)]
        for it in items:
            if it.get("n") is not None and it["n"] > last:  # as the queen's _numbered
                last = it["n"]
                taken.append(last)
    for _ in range(5):
        for m in fs.flush(1.0):
            deliver(m)
            fs.sent(m, 1.0)
    fs.unsent(fs.flush(1.0))  # the pipe is full: the sixth slice comes back
    fs.queen_lost()
    fs.welcomed(False, {"a1": last})
    while fs.outbox:
        for m in fs.flush(2.0):
            deliver(m)
    assert taken == list(range(1, 4001))


def test_an_accept_comes_due_behind_its_own_messages_is_implied_by_them() -> None:
    from meshant import protocol as p
    from meshant.core.peers.forager_session import ForagerSession

    fs = ForagerSession(["x"], 1)
    fs.features = frozenset({"progress"})
    fs.assign("a1", {"capability": "x", "task": "t1"}, None, 0.0)
    fs.take()
    fs.send(p.Message("task.progress", {"fraction": 0.1}, ref="a1"))
    fs.tick(1.0, 5.0, True)  # the implied accept is due while the progress still waits
    assert [m.kind for m in fs.outbox] == ["task.progress"]
