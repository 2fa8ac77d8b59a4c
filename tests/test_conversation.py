"""Agents in conversation, the queen's side, whole and without a socket (tests/inmemory.py):
questions and answers, attachable update logs with cursors, durable inboxes, rights."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from meshant import protocol as p
from meshant.core.conversations.inbox import Inboxes, Kept
from meshant.core.conversations.model import UpdateLogs
from meshant.core.rights import OPERATIONS, permits
from meshant.protocol.codec import JSON
from meshant.storage import open_journal

from .inmemory import InMemoryColony, InMemoryPeer


@pytest.fixture(params=["sqlite", "postgresql"])
def journal_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a journal goes: an SQLite file, then a PostgreSQL database (as test_journal)."""
    if request.param == "sqlite":
        return str(tmp_path / "q.db")
    return str(request.getfixturevalue("pg_url"))


def _running(sim: InMemoryColony, c: InMemoryPeer, f: InMemoryPeer) -> dict[str, Any]:
    c.send("task.submit", {"capability": "echo", "payload": 1})
    (a,) = sim.assigns(f)
    f.send("task.accept", None, ref=a["id"])
    return a


def _ask(f: InMemoryPeer, a: dict[str, Any], n: int, prompt: str = "which?") -> str:
    request = f"{a['id']}.q{n}"
    f.send("task.ask", {"request": request, "prompt": prompt, "data": {"n": n}}, ref=a["id"])
    return request


def _state(sim: InMemoryColony, task_id: str) -> str:
    task = sim.core.scheduler.find_live(task_id)
    assert task is not None
    return task.state


def test_ask_answer_resume_and_each_answer_to_its_question_once() -> None:
    sim = InMemoryColony()
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    q1, q2 = _ask(f, a, 1, "first?"), _ask(f, a, 2, "second?")
    asks = c.take("task.ask")
    assert [m.b["request"] for m in asks] == [q1, q2]
    assert asks[0].b["prompt"] == "first?" and asks[0].b["data"] == {"n": 1}
    assert asks[0].b["seq"] < asks[1].b["seq"]
    assert _state(sim, a["task"]) == "input-required"
    # The second question first: each answer reaches its own question.
    c.send("task.answer", {"task": a["task"], "request": q2, "value": "two"})
    assert c.one("task.answered").b == {"task": a["task"], "request": q2}
    got = f.one("task.answer")
    assert got.ref == a["id"] and got.b["request"] == q2 and got.b["value"] == "two"
    assert _state(sim, a["task"]) == "input-required"  # q1 still waits
    c.send("task.answer", {"task": a["task"], "value": "one"})  # the oldest waiting: q1
    assert f.one("task.answer").b["request"] == q1
    c.one("task.answered")
    assert _state(sim, a["task"]) == "accepted"
    c.send("task.answer", {"task": a["task"], "request": q1, "value": "again"})
    err = c.one("error").b
    assert err["code"] == "already-answered" and q1 in err["message"]
    assert f.take("task.answer") == []
    c.send("task.answer", {"task": a["task"], "request": "nope", "value": 1})
    assert c.one("error").b["code"] == "unknown-question"
    f.send("task.result", {"status": "ok", "result": "done"}, ref=a["id"])
    assert sim.results(c)[a["task"]]["result"] == "done"
    c.send("task.answer", {"task": a["task"], "value": 1})
    assert "finished" in c.one("error").b["message"]
    task = sim.core.scheduler.find_live(a["task"])
    assert task is not None
    whats = [w for _, w, _ in task.history]
    assert whats.count("input-required") == 1 and whats.count("answered") == 2


def test_a_withdrawn_question_takes_no_answer_and_the_task_runs_on() -> None:
    sim = InMemoryColony()
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    q = _ask(f, a, 1)
    f.send("task.ask", {"request": q, "withdraw": True}, ref=a["id"])
    assert [m.b.get("withdraw") for m in c.take("task.ask")] == [None, True]
    assert _state(sim, a["task"]) == "accepted"
    c.send("task.answer", {"task": a["task"], "request": q, "value": 1})
    assert c.one("error").b["code"] == "unknown-question"


def test_a_pending_question_survives_a_queen_restart(journal_at: str) -> None:
    j = open_journal(journal_at)
    sim = InMemoryColony(journal=j)
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    f.send("task.progress", {"fraction": 0.5}, ref=a["id"])
    q = _ask(f, a, 1)
    seq = c.take("task.ask")[0].b["seq"]
    j.close()
    j2 = open_journal(journal_at)
    sim2 = InMemoryColony(journal=j2)  # the queen restarted on its journal
    assert _state(sim2, a["task"]) == "input-required"
    assert [x.request for x in sim2.core.conversations.questions.pending(a["task"])] == [q]
    c2 = sim2.client()
    c2.send("task.answer", {"task": a["task"], "value": "late"})
    c2.one("task.answered")
    # Its forager comes back, still running the task, and asks again: answered now.
    f2 = sim2.forager("f", running=[a["id"]])
    _ask(f2, a, 1)
    assert f2.one("task.answer").b["value"] == "late"
    # Sequence numbers go on from before the restart.
    f2.send("task.result", {"status": "ok", "result": 1}, ref=a["id"])
    task = sim2.core.scheduler.find_live(a["task"])
    assert task is not None and task.final is not None and task.final["seq"] > seq
    j2.close()


def test_attach_from_a_cursor_gets_exactly_what_follows_then_live_updates() -> None:
    sim = InMemoryColony()
    c, f = sim.client(), sim.forager("f")
    w = sim.client("watcher")
    a = _running(sim, c, f)
    for i in range(5):
        f.send("task.result", {"partial": True, "value": i}, ref=a["id"])
    c.take()
    w.send("task.attach", {"task": a["task"], "after": 2})
    info = w.one("task.attached").b
    assert info["state"] == "accepted" and info["last"] == 5
    ups = w.take("task.update")
    assert [(u.b["seq"], u.b["body"]["value"]) for u in ups] == [(3, 2), (4, 3), (5, 4)]
    _ask(f, a, 1, "more?")
    f.send("task.result", {"status": "ok", "result": "end"}, ref=a["id"])
    ups = w.take("task.update")
    assert [u.b["kind"] for u in ups] == ["task.ask", "task.result"]
    assert ups[1].b["body"]["result"] == "end" and ups[1].b["seq"] == 7
    # A finished task: its log and its result, from any cursor still kept.
    w.send("task.attach", {"task": a["task"], "after": 5})
    assert w.one("task.attached").b["state"] == "completed"
    assert [u.b["seq"] for u in w.take("task.update")] == [6, 7]


def test_a_cursor_older_than_the_log_is_refused_with_what_was_dropped() -> None:
    sim = InMemoryColony()
    sim.core.conversations.update_logs.max_count = 3
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    for i in range(6):
        f.send("task.progress", {"fraction": i / 10}, ref=a["id"])
    c.send("task.attach", {"task": a["task"], "after": 1})
    err = c.one("error").b
    assert err["code"] == "cursor-expired" and "updates 2-3" in err["message"]
    assert err["cursor"] == 3  # the lowest cursor that works, as a field (spec §6a)
    assert c.take("task.update") == []
    c.send("task.attach", {"task": a["task"], "after": err["cursor"]})
    c.one("task.attached")
    assert [u.b["seq"] for u in c.take("task.update")] == [4, 5, 6]


def test_messages_to_an_offline_name_wait_in_order_and_are_delivered_once() -> None:
    sim = InMemoryColony()
    c = sim.client()
    ids = []
    for i in range(3):
        m = c.send("msg", {"i": i}, to="late", extra={"receipt": True} if i == 0 else None)
        ids.append(m.id)
    assert c.take("error") == []
    assert [k.id for k in sim.core.conversations.inboxes.peek("late")] == ids
    f = sim.forager("late")
    got = f.take("msg")
    assert [m.b["i"] for m in got] == [0, 1, 2] and [m.id for m in got] == ids
    assert got[0].frm == "client"
    r = c.one("msg.receipt").b
    assert r["message"] == ids[0] and r["status"] == "delivered" and r["to"] == "late"
    assert sim.core.conversations.inboxes.peek("late") == []
    f2 = sim.forager("late-again")
    assert f2.take("msg") == []


def test_kept_messages_expire_with_a_receipt_and_a_full_inbox_refuses() -> None:
    sim = InMemoryColony()
    sim.core.conversations.inboxes.max_count = 2
    c = sim.client()
    m = c.send("note", {"text": "soon gone"}, to="away", extra={"receipt": True, "ttl": 2.0})
    c.send("msg", {}, to="away")
    c.send("msg", {}, to="away")  # one too many
    err = c.one("error").b
    assert err["code"] == "inbox-full" and "'away'" in err["message"]
    sim.pass_time(3.0, c)
    r = c.one("msg.receipt").b
    assert r["message"] == m.id and r["status"] == "expired"
    assert len(sim.core.conversations.inboxes.peek("away")) == 1
    c.send("inbox", {"op": "purge", "name": "away"})
    assert c.one("inbox.reply").b["purged"] == 1


def test_inboxes_are_journaled_and_kept_across_a_restart(journal_at: str) -> None:
    j = open_journal(journal_at)
    sim = InMemoryColony(journal=j)
    c = sim.client()
    for i in range(3):
        c.send("msg", {"i": i}, to="later")
    j.close()
    j2 = open_journal(journal_at)
    sim2 = InMemoryColony(journal=j2)
    f = sim2.forager("later")
    assert [m.b["i"] for m in f.take("msg")] == [0, 1, 2]
    j2.close()
    j3 = open_journal(journal_at)
    sim3 = InMemoryColony(journal=j3)
    assert sim3.forager("later").take("msg") == []  # delivered once, not again
    j3.close()


class _Grants:
    """Keys as an --authorized folder would grant them: b"admin" is an admin."""

    def check(self, key: bytes | None, name: str, role: str) -> str | None:
        return None

    def roles_of(self, key: bytes) -> tuple[str, ...]:
        return ("client", "admin") if key == b"admin" else ("client", "forager")


def test_rights_per_operation_with_keys() -> None:
    sim = InMemoryColony()
    sim.core.state.authorized = _Grants()
    f = sim.forager("f", key=b"fk", slots=1, tools=["echo"])
    user = sim.client("user", key=b"uk", features=["mem.sync"])
    other = sim.client("other", key=b"ok")
    admin = sim.client("root", key=b"admin")
    for kind in ("ctl.drain", "ctl.halt"):
        user.send(kind, {}, to="f")
        err = user.one("error").b
        assert err["code"] == "forbidden" and err["operation"] == kind and kind in err["message"]
    assert f.take("ctl.drain") == [] and f.take("ctl.halt") == []
    user.send("dlq", {"op": "purge", "all": True})
    assert user.one("error").b["operation"] == "dlq.purge"
    user.send("mem.sync", {"op": "set", "key": "meshant.mode", "value": 1})
    assert user.one("error").b["operation"] == "mem.reserved"
    user.send("mem.sync", {"op": "set", "key": "mine", "value": 1})
    assert user.one("mem.sync").b["op"] == "ok"
    user.send("inbox", {"op": "purge", "name": "x"})
    assert user.one("error").b["operation"] == "inbox.purge"
    # A task: its submitter (and an admin) may answer and attach; another client not.
    user.send("task.submit", {"capability": "echo"})
    (a,) = sim.assigns(f)
    _ask(f, a, 1, "?")
    for kind, body in (("task.attach", {"task": a["task"]}),
                       ("task.answer", {"task": a["task"], "value": 1})):
        other.send(kind, body)
        assert other.one("error").b["code"] == "forbidden"
    admin.send("task.attach", {"task": a["task"]})
    admin.one("task.attached")
    user.send("task.answer", {"task": a["task"], "value": 1})
    user.one("task.answered")
    admin.send("ctl.drain", {}, to="f")
    assert f.one("ctl.drain")
    assert sim.core.counters["forbidden"] == 7


def test_without_keys_everything_stays_allowed() -> None:
    assert all(permits(op, None) for op in OPERATIONS)
    assert not permits("ctl.drain", frozenset({"client"}))
    assert permits("task.answer", frozenset({"client"}), owner=True)
    assert permits("dlq.purge", frozenset({"admin"}))


def test_update_logs_and_inboxes_are_bounded_in_bytes() -> None:
    logs = UpdateLogs(max_count=1000, max_bytes=10_000, total_bytes=25_000)
    for t in range(5):
        for s in range(1, 50):
            logs.add(f"t{t}", s, "task.result", {"partial": True, "value": "x" * 500})
    assert all(log.bytes <= 10_000 for log in logs.logs.values())
    assert logs.bytes <= 25_000 and logs.bytes == sum(x.bytes for x in logs.logs.values())
    ib = Inboxes(max_count=10, max_bytes=1000, max_names=2)
    ib.put(Kept("1", "a", "msg", "c", None, 0.0, 10.0, 600))
    assert not ib.fits("a", 600) and ib.fits("b", 600) and not ib.fits("a", 401)
    ib.put(Kept("2", "b", "msg", "c", None, 0.0, 10.0, 10))
    assert not ib.fits("c", 1)  # at most two names
    assert [k.id for k in ib.expire(10.0)] == ["1", "2"] and ib.boxes == {}


def test_a_tasks_updates_and_questions_are_pruned_with_it(journal_at: str) -> None:
    j = open_journal(journal_at)
    sim = InMemoryColony(journal=j)
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    f.send("task.progress", {"fraction": 0.5}, ref=a["id"])
    _ask(f, a, 1)
    assert [k for _, k, _ in j.conversation.updates(a["task"])] == ["task.progress", "task.ask"]
    assert len(j.conversation.questions(a["task"])) == 1
    f.send("task.result", {"status": "ok", "result": 1}, ref=a["id"])
    assert j.prune(time.time() + 60, 0) == 1
    assert j.conversation.updates(a["task"]) == [] and j.conversation.questions() == []
    j.close()


def test_questions_are_bounded_and_a_1_1_agent_gets_its_inbox_too() -> None:
    sim = InMemoryColony()
    c, f = sim.client(), sim.forager("f")
    a = _running(sim, c, f)
    big = "x" * (sim.core.config.mem_max_value + 1)
    f.send("task.ask", {"request": "r-big", "prompt": big}, ref=a["id"])
    err = f.one("error").b
    assert err["code"] == "too-large" and "--mem-max-value" in err["message"]
    assert _state(sim, a["task"]) == "accepted" and c.take("task.ask") == []
    # An IACP 1.1 forager registers with its first heartbeat: what waited comes then.
    c.send("note", {"text": "hi"}, to="old-agent")
    old = sim.raw("old-agent")
    hb = p.Message("hb", {"slots": 1, "tools": ["echo"]}, frm="old-agent", to="queen", ts=1.0,
                   v="1.1")
    old.send_frames(p.encode_for(hb, JSON))
    (note,) = old.take("note")
    assert note.b == {"text": "hi"} and note.frm == "client"
