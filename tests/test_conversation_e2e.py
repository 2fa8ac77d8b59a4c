"""Agents in conversation end to end, over real sockets: a task that asks and is answered
from the CLI, a question that outlives a kill -9 of the queen, a lease held while waiting,
inboxes for offline foragers, a second client attaching mid-stream, rights per key."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from meshant import Client, Forager, MeshantError, Queen
from meshant.actors.futures import Update
from meshant.adapters.security import generate
from meshant.errors import AskTimeout, Forbidden
from meshant.protocol import Message

from .conftest import Colony, Procs, wait_for
from .test_cli import meshant
from .test_journal import Restartable


@pytest.fixture(params=["sqlite", "postgresql"])
def journal_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a journal goes: an SQLite file, then a PostgreSQL database (as test_journal)."""
    if request.param == "sqlite":
        return str(tmp_path / "q.db")
    return str(request.getfixturevalue("pg_url"))


def _next_update(fut: Any, kind: str, timeout: float = 10.0) -> Update:
    for u in fut.updates(timeout=timeout):
        if u.kind == kind:
            return u  # type: ignore[no-any-return]
    raise AssertionError(f"the task ended without a {kind} update")


def _asker(x: Any, ctx: Any) -> str:
    name = ctx.ask(f"name for {x}?", data={"x": x}, timeout=60)
    return f"hello {name}"


async def _async_asker(x: Any, ctx: Any) -> str:
    name = await ctx.ask_async(f"name for {x}?", timeout=60)
    return f"hello {name} (async)"


@pytest.mark.slow
def test_ask_answered_from_the_cli_in_another_process(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"greet": _asker, "agreet": _async_asker}, name="f")
    c = colony.client()
    fut = c.submit("greet", 7)
    u = _next_update(fut, "input-required")
    assert u.value == {"prompt": "name for 7?", "data": {"x": 7}} and u.request
    assert c.task_status(fut.task_id)["state"] == "input-required"
    r = meshant("answer", fut.task_id, '"bob"', "--queen", colony.endpoint, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"task": fut.task_id, "request": u.request}
    assert fut.result(10) == "hello bob"
    r = meshant("answer", fut.task_id, '"again"', "--queen", colony.endpoint)
    assert r.returncode == 1 and "finished" in r.stderr
    # The whole exchange, replayed by `meshant watch` from the start.
    r = meshant("watch", fut.task_id, "--queen", colony.endpoint, "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["update"] for x in lines[:-1]] == ["input-required"]
    assert lines[-1] == {"task": fut.task_id, "state": "completed", "result": "hello bob"}
    # The async twin, answered by request id through the API.
    fut2 = c.submit("agreet", 8)
    u2 = _next_update(fut2, "input-required")
    assert c.answer(fut2.task_id, "ann", request=u2.request)["request"] == u2.request
    assert fut2.result(10) == "hello ann (async)"


@pytest.mark.slow
def test_a_pending_question_survives_kill_9_of_the_queen(procs: Procs, tmp_path: Path,
                                                        journal_at: str) -> None:
    q = Restartable(procs, tmp_path, journal=journal_at)
    ctx: zmq.Context[Any] = zmq.Context()
    f = Forager(q.router, name="f", context=ctx)
    f.add_handler("greet", _asker)
    f.start(timeout=10)
    c = Client(q.router, context=ctx, timeout=10)
    try:
        fut = c.submit("greet", 1)
        request = _next_update(fut, "input-required").request
        r = meshant("tasks", "--journal", q.journal, "--state", "input-required", "--json")
        assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == [fut.task_id]
        epoch = f.epoch
        q.kill_and_restart()
        wait_for(lambda: f.epoch != epoch and f.connected, 20, "the forager to rejoin")

        def answered() -> bool:
            try:
                c.answer(fut.task_id, "after the crash", timeout=2)
                return True
            except MeshantError as e:  # not registered yet with the new queen
                assert e.code in ("timeout", "unknown-task"), e
                return False
        wait_for(answered, 20, "the answer to be taken")
        assert fut.result(20) == "hello after the crash"
        r = meshant("task", fut.task_id, "--journal", q.journal, "--json")
        events = [(e["state"], e["why"]) for e in json.loads(r.stdout)["events"]]
        assert ("input-required", f"{request}: name for 1?") in events
        assert any(s == "answered" and w.startswith(request) for s, w in events)
    finally:
        c.close()
        f.stop()
        ctx.destroy(linger=0)


@pytest.mark.slow
def test_the_lease_holds_while_waiting_three_assign_timeouts(colony: Colony) -> None:
    queen = colony.start_queen(assign_timeout=0.6)
    colony.forager({"greet": _asker, "impatient": _impatient, "big": _big_question}, name="f")
    c = colony.client()
    fut = c.submit("greet", 1)
    _next_update(fut, "input-required")
    until = time.monotonic() + 3 * 0.6 + 0.2

    def waited() -> bool:
        assert queen.scheduler.counters["reissued"] == 0
        return time.monotonic() >= until
    wait_for(waited, 10, "three assign timeouts to pass")
    c.answer(fut.task_id, "patient")
    assert fut.result(10) == "hello patient"
    assert c.task_status(fut.task_id)["attempt"] == 1
    # A timeout ends the wait in the handler, which goes on without the input.
    fut2 = c.submit("impatient", None)
    kinds = [u.kind for u in fut2.updates(timeout=10)]
    assert kinds == ["input-required", "withdrawn"]
    assert fut2.result(10) == "no answer: ask-timeout"
    with pytest.raises(MeshantError) as info:
        c.answer(fut2.task_id, "too late")
    assert info.value.code == "unknown-task"
    # A question the queen refuses raises in the handler at once, with the queen's words.
    assert c.run("big", None, result_timeout=10).startswith("too-large: a question's")


def _fail(x: Any) -> None:
    raise ValueError("always")


def _big_question(x: Any, ctx: Any) -> str:
    try:
        return str(ctx.ask("x" * 100_000, timeout=30))
    except MeshantError as e:
        return f"{e.code}: {e.message}"


def _impatient(x: Any, ctx: Any) -> str:
    try:
        return str(ctx.ask("quick?", timeout=0.3))
    except AskTimeout as e:
        return f"no answer: {e.code}"


@pytest.mark.slow
def test_messages_to_an_offline_forager_wait_and_arrive_in_order_once(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client(name="sender")
    ids = [c.send("late-f", {"i": i}, receipt=True) for i in range(3)]
    gone = c.note("late-f", "short-lived", receipt=True, ttl=0.3)
    receipts: list[Message] = []

    def receipt(status: str, mid: str) -> bool:
        while not c.inbox.empty():
            receipts.append(c.inbox.get())
        return any(m.b["status"] == status and m.b["message"] == mid for m in receipts)
    wait_for(lambda: receipt("expired", gone), 10, "the expired receipt")
    r = meshant("inbox", "late-f", "--queen", colony.endpoint, "--json")
    assert r.returncode == 0, r.stderr
    assert [i["body"] for i in json.loads(r.stdout)["items"]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    got: list[Message] = []
    f = colony.forager({"echo": lambda x: x}, name="late-f", start=False)
    f.on_message(got.append)
    f.start(timeout=10)
    wait_for(lambda: all(receipt("delivered", i) for i in ids), 10, "delivered receipts")
    wait_for(lambda: len(got) == 3, 10, "the kept messages")
    assert [m.b for m in got] == [{"i": 0}, {"i": 1}, {"i": 2}] and [m.id for m in got] == ids
    assert all(m.frm == "sender" for m in got)
    c.send("late-f", {"i": 3})  # now live: straight through, after the kept ones
    wait_for(lambda: len(got) == 4, 10, "the live message")
    assert [m.b["i"] for m in got] == [0, 1, 2, 3]
    assert sum(m.b["status"] == "delivered" for m in receipts) == 3


@pytest.mark.slow
def test_a_second_client_attaches_mid_stream_from_a_cursor(colony: Colony) -> None:
    colony.start_queen()
    gate = threading.Event()

    def stream(n: int, ctx: Any) -> str:
        for i in range(n):
            ctx.partial(i)
            if i == 4:
                gate.wait(20)
        return "end"
    colony.forager({"stream": stream}, name="f")
    a = colony.client()
    fut = a.submit("stream", 10)
    seen = []
    for u in fut.updates(timeout=10):
        seen.append(u.seq)
        if len(seen) == 5:
            break
    b = colony.client()
    att = b.attach(fut.task_id, after_seq=3)
    assert att.state in ("accepted", "assigned") and att.last == 5
    gate.set()
    ups = list(att.updates(timeout=10))
    assert [u.seq for u in ups] == list(range(4, 11))
    assert [u.value for u in ups] == list(range(3, 10))
    assert att.result(10) == "end" and fut.result(10) == "end"
    with pytest.raises(MeshantError) as info:
        b.attach("no-such-task")
    assert info.value.code == "unknown-task"


@pytest.mark.slow
def test_a_non_admin_key_is_refused_drain_halt_and_dlq_purge(tmp_path: Path) -> None:
    keys, auth = tmp_path / "keys", tmp_path / "authorized"
    auth.mkdir()
    r = meshant("keys", "generate", str(keys), "--name", "root", "--role", "admin")
    assert r.returncode == 0, r.stderr
    generate(keys, "queen")
    generate(keys, "f1", ("forager",))
    # The CLI's client names itself client-HOST-PID: the user key allows any name.
    generate(keys, "user", ("client",), ("*",))
    for name in ("f1", "user", "root"):
        shutil.copy(keys / f"{name}.key", auth)
    ctx: zmq.Context[Any] = zmq.Context()
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", curve_secret=str(keys / "queen.key_secret"),
              authorized=str(auth), hb_interval=0.2, context=ctx).start()
    owned: list[Any] = []

    def peer(cls: Any, name: str) -> Any:
        p = cls(q.endpoint, name=name, curve_secret=str(keys / f"{name}.key_secret"),
                queen_key=str(keys / "queen.key"), context=ctx)
        owned.append(p)
        return p
    try:
        f = peer(Forager, "f1")
        f.add_handler("echo", lambda x: x)
        f.add_handler("fail", _fail)
        f.start(timeout=10)
        user = peer(Client, "user")
        dead = user.submit("fail", None, max_attempts=1)
        with pytest.raises(MeshantError):
            dead.result(10)
        with pytest.raises(Forbidden) as info:
            user.dlq("purge", dead.task_id)
        assert info.value.detail["operation"] == "dlq.purge"
        assert [i["task"] for i in user.dlq("list")["items"]] == [dead.task_id]
        common = ("--queen", q.endpoint, "--curve-secret", str(keys / "user.key_secret"),
                  "--queen-key", str(keys / "queen.key"))
        for what in ("drain", "halt"):
            r = meshant(what, "f1", *common)
            assert r.returncode == 1 and "[forbidden]" in r.stderr and f"ctl.{what}" in r.stderr
        assert q.counters["ctl_drain"] == 0 and q.counters["ctl_halt"] == 0
        assert user.run("echo", "still served", result_timeout=10) == "still served"
        root = peer(Client, "root")
        assert root.dlq("purge", dead.task_id)["tasks"] == [dead.task_id]
        root.drain("f1")
        wait_for(lambda: f.draining, 10, "the admin's drain")
    finally:
        for o in reversed(owned):
            o.close() if isinstance(o, Client) else o.stop()
        q.stop()
        ctx.destroy(linger=0)
