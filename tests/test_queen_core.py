"""The queen's logic, whole, without a socket: a QueenCore, its peers' real sessions and
a virtual clock (tests/inmemory.py). Each scenario runs in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshant import protocol as p
from meshant.core.queen.router import Publish, QueenConfig, QueenCore, Record, Send
from meshant.storage.journal import Journal

from .inmemory import InMemoryColony


def _submit(sim: InMemoryColony, client, cap: str = "echo", payload: object = None, **kw: object):
    return client.send("task.submit", {"capability": cap, "payload": payload, **kw})


def _finish(forager, assign: dict, result: object = "ok") -> None:
    forager.send("task.result", {"status": "ok", "result": result}, ref=assign["id"])


def test_the_core_reads_no_clock_and_returns_typed_actions() -> None:
    core = QueenCore(QueenConfig(), epoch="e", wall_offset=1000.0, now=5.0)
    core.beat(5.0)
    (a,) = core.take()
    assert isinstance(a, Publish) and a.topic == b"$hb"
    hb = p.binary.decode(a.frames)
    assert hb.ts == 1005.0 and hb.b["epoch"] == "e"  # the driver's time, not a clock's


def test_priority_then_fifo_and_slots() -> None:
    sim = InMemoryColony()
    c = sim.client()
    for payload, prio in [("a", 50), ("b", 10), ("c", 50), ("d", 0)]:
        _submit(sim, c, payload=payload, priority=prio)
    f = sim.forager("f1", slots=1)
    order = []
    for _ in range(4):
        (a,) = sim.assigns(f)  # never more than its one slot
        order.append(a["payload"])
        _finish(f, a, a["payload"])
    assert order == ["d", "b", "a", "c"]
    assert sorted(r["result"] for r in sim.results(c).values()) == ["a", "b", "c", "d"]


def test_routing_by_capability_labels_and_name() -> None:
    sim = InMemoryColony()
    cpu = sim.forager("cpu", slots=5, tools=["echo", "crawl"], labels={"gpu": False})
    gpu = sim.forager("gpu", slots=5, tools=["echo"], labels={"gpu": True})
    c = sim.client()
    _submit(sim, c, "crawl", "x")
    _submit(sim, c, payload="needs-gpu", labels={"gpu": True})
    _submit(sim, c, payload="named", to="cpu")
    assert sorted(a["payload"] for a in sim.assigns(cpu)) == ["named", "x"]
    assert [a["payload"] for a in sim.assigns(gpu)] == ["needs-gpu"]


def test_a_silent_forager_is_declared_offline_its_task_reissued_and_fenced() -> None:
    sim = InMemoryColony(assign_timeout=60)
    c = sim.client()
    f1 = sim.forager("f1")
    submit = _submit(sim, c, payload=1)
    (a1,) = sim.assigns(f1)
    f2 = sim.forager("f2")
    f1.pause(10.0)  # f1 goes silent (SIGSTOP); the others keep beating
    sim.advance(4.0)
    assert "f1" not in sim.core.registry.by_name
    (a2,) = sim.assigns(f2)
    assert a2["task"] == submit.id and a2["attempt"] == 2
    _finish(f2, a2, "from f2")
    # The old attempt's result, sent by f1 before it stopped, arrives late: f1 is not
    # registered any more, so it is dropped and counted.
    f1.send("task.result", {"status": "ok", "result": "late"}, ref=a1["id"])
    assert f1.one("error").b["code"] == "not-registered"
    (r,) = sim.results(c).values()
    assert r["result"] == "from f2"
    assert sim.core.scheduler.counters["duplicates"] == 1
    # f1 resumes and, the queen silent for it all along, says hello again: welcomed,
    # with nothing to run, and the task's one result stands.
    sim.advance(6.0)
    f1.one("welcome")
    assert sim.assigns(f1) == [] and sim.results(c) == {}


def test_a_forager_back_from_a_pause_cannot_finish_the_attempt_it_lost() -> None:
    sim = InMemoryColony(assign_timeout=60)
    c = sim.client()
    f1 = sim.forager("f1")
    submit = _submit(sim, c, payload=1)
    (a1,) = sim.assigns(f1)
    f2 = sim.forager("f2")
    sim.pass_time(4.0, f2, c)  # f1 stopped: declared offline, its task reissued
    (a2,) = sim.assigns(f2)
    assert a2["task"] == submit.id and a2["attempt"] == 2
    # f1 resumes to the queen's silence and says hello again, listing the attempt it
    # still runs: welcomed, and told to stop that attempt.
    f1.one("welcome")
    assert f1.one("task.cancel").ref == a1["id"]
    # Its result comes all the same (the handler had finished): registered again, f1
    # still cannot finish the task in f2's place.
    f1.send("task.result", {"status": "ok", "result": "late"}, ref=a1["id"])
    assert sim.results(c) == {} and sim.core.scheduler.counters["duplicates"] == 1
    _finish(f2, a2, "from f2")
    assert sim.results(c)[submit.id]["result"] == "from f2"


def test_a_lease_renewed_by_heartbeats_is_never_reissued() -> None:
    sim = InMemoryColony(assign_timeout=2)
    c = sim.client()
    f = sim.forager("f")
    f2 = sim.forager("f2")
    _submit(sim, c, payload="long", to="f")
    (a,) = sim.assigns(f)
    # 5 s: over twice the lease. f's session beats every second while it runs a task,
    # listing it; nothing else comes from f.
    sim.advance(5.0)
    assert sim.core.scheduler.attempts[a["id"]].lease > sim.now
    assert sim.assigns(f2) == [] and sim.core.scheduler.counters["reissued"] == 0
    _finish(f, a, "done")
    assert next(iter(sim.results(c).values()))["result"] == "done"


def test_drain_takes_nothing_new_and_halt_reissues() -> None:
    sim = InMemoryColony()
    c = sim.client()
    f1 = sim.forager("f1", slots=2)
    f2 = sim.forager("f2", slots=2)
    c.send("ctl.drain", {}, frm="client")  # no target: refused
    assert c.one("error").b["code"] == "unknown-recipient"
    c.send("ctl.drain", {}, to="f1")
    assert f1.one("ctl.drain")
    for i in range(2):
        _submit(sim, c, payload=i)
    assert len(sim.assigns(f2)) == 2 and sim.assigns(f1) == []
    c.send("ctl.halt", {}, to="f2")
    assert f2.one("ctl.halt")
    assert "f2" not in sim.core.registry.by_name
    assert sim.core.scheduler.counters["reissued"] == 2


def test_memory_set_is_published_and_answered() -> None:
    sim = InMemoryColony()
    c = sim.client()
    c.send("mem.sync", {"op": "set", "key": "config", "value": {"rate": 5}})
    assert c.one("mem.sync").b["op"] == "ok"
    (update,) = [m for t, m in c.heard if t == b"$mem"]
    assert update.b["key"] == "config" and update.b["value"] == {"rate": 5}
    c.send("mem.sync", {"op": "snapshot"})
    assert c.one("mem.sync").b["items"]["config"] == {"rate": 5}


def test_dead_letters_listed_and_retried() -> None:
    sim = InMemoryColony()
    c = sim.client()
    f = sim.forager("f")
    sub = _submit(sim, c, payload="bad", max_attempts=1)
    (a,) = sim.assigns(f)
    f.send("task.result", {"status": "error", "error": {"type": "ValueError",
                                                        "message": "no"}}, ref=a["id"])
    assert sim.results(c)[sub.id]["error"]["code"] == "handler-error"
    c.send("dlq", {"op": "list"})
    (item,) = c.one("dlq.reply").b["items"]
    assert item["task"] == sub.id
    c.send("dlq", {"op": "retry", "task": sub.id})
    (new_id,) = c.one("dlq.reply").b["tasks"]
    (a2,) = sim.assigns(f)
    assert a2["task"] == new_id and a2["payload"] == "bad"


def test_an_idempotency_key_runs_once() -> None:
    sim = InMemoryColony()
    c = sim.client()
    f = sim.forager("f")
    first = _submit(sim, c, payload=1, key="k")
    second = _submit(sim, c, payload=1, key="k")
    (a,) = sim.assigns(f)  # one run for both
    _finish(f, a, "once")
    results = sim.results(c)
    assert results[first.id]["result"] == results[second.id]["result"] == "once"
    assert results[second.id]["original"] == first.id


def test_a_resubmitted_id_is_the_same_task_and_gets_a_missed_result_again() -> None:
    sim = InMemoryColony()
    c = sim.client()
    f = sim.forager("f")
    sub = _submit(sim, c, payload=1)
    (a,) = sim.assigns(f)
    _finish(f, a, "r")
    assert sim.results(c)[sub.id]["result"] == "r"
    # The client lost that result with its connection and sends the submission again:
    # the same id is the same task, answered with its result, not run again.
    c.send("task.submit", {"capability": "echo", "payload": 1}, id=sub.id)
    assert sim.results(c)[sub.id]["result"] == "r"
    assert sim.assigns(f) == [] and sim.core.counters["resubmitted"] == 1
    # Another client reusing the id is refused.
    other = sim.client("other")
    other.send("task.submit", {"capability": "echo"}, id=sub.id)
    assert other.one("error").b["code"] == "duplicate-task"


def test_a_rejoining_forager_is_told_to_stop_what_the_queen_does_not_hold() -> None:
    sim = InMemoryColony()
    f = sim.forager("f", session="s1")
    f.send("hello", {"role": "forager", "name": "f", "versions": [2], "slots": 1,
                     "tools": ["echo"], "session": "s1", "running": ["gone.1"]})
    assert f.one("welcome")
    cancel = f.one("task.cancel")
    assert cancel.ref == "gone.1" and cancel.b["task"] == "gone"


def test_restart_recovery_from_a_journal(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    j = Journal(db)
    sim = InMemoryColony(journal=j, journal_defer=0)  # every task written as it arrives
    c = sim.client()
    f = sim.forager("f", slots=1)
    subs = [_submit(sim, c, payload=i) for i in range(3)]
    (a,) = sim.assigns(f)
    _finish(f, a, "first")
    assert sim.records > 0
    j.close()
    # A new core on the same journal: the two unfinished tasks are back, the finished one
    # stays on disk and still answers its submitter.
    j2 = Journal(db)
    sim2 = InMemoryColony(journal=j2)
    try:
        assert sim2.core.restored == 2
        c2 = sim2.client()
        c2.send("task.submit", {"capability": "echo", "payload": 0}, id=subs[0].id,
                frm="client")
        assert sim2.results(c2)[subs[0].id]["result"] == "first"
        f2 = sim2.forager("f", slots=2)
        # The queued one at once; the one that was assigned is held for its forager to
        # report it, and reissued when the grace period ends without that.
        assert [x["payload"] for x in sim2.assigns(f2)] == [2]
        sim2.pass_time(7.0, f2, c2)
        assert [x["payload"] for x in sim2.assigns(f2)] == [1]
    finally:
        j2.close()


def test_records_come_before_the_sends_of_their_turn() -> None:
    sim = InMemoryColony()
    sim.core.scheduler.track_changes = True  # as with a journal
    c = sim.client()
    sim.forager("f")
    frames = [c.identity, *p.binary.encode(p.Message(
        "task.submit", {"capability": "echo", "ack": True}, frm="client", id="t1"))]
    sim.core.receive(frames, None, sim.now)
    sim.core.end_turn(sim.now)
    actions = sim.core.take()
    kinds = [type(a).__name__ for a in actions]
    # The new task is made durable first; then its assignment and the acknowledgement.
    assert kinds == ["Record", "Send", "Send"], kinds
    assert isinstance(actions[0], Record) and [t.id for t in actions[0].tasks] == ["t1"]
    sent = [a.msg.kind for a in actions if isinstance(a, Send)]
    assert sent == ["task.assign", "task.submitted"]


def _journaled(j: Journal) -> dict[str, str]:
    return {t["id"]: t["state"] for t in j.tasks(limit=100)}


def test_a_young_submission_is_written_once_when_it_ends(tmp_path: Path) -> None:
    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j)  # journal_defer: 0.1 s by default
    try:
        c = sim.client()
        f = sim.forager("f", slots=1)
        quick = _submit(sim, c, payload=1)
        (a,) = sim.assigns(f)  # assigned with nothing written yet: no commit ahead of it
        assert sim.records == 0 and _journaled(j) == {}
        _finish(f, a, "r")
        assert sim.results(c)[quick.id]["result"] == "r"
        # One write, of the finished task with its whole history, before its result left.
        assert sim.records == 1 and _journaled(j) == {quick.id: "completed"}
        row = j.find(quick.id)
        assert row is not None and row["payload"] == 1  # its input is kept, as before
        assert sim.core.scheduler.done[quick.id].payload is None  # (and memory let go)
        assert [e["state"] for e in j.task(quick.id)["events"]] == [
            "queued", "assigned", "accepted", "completed"]
        # Not deferred: an acknowledged submission, one with an idempotency key, and a
        # task that lives past the window (queued here: no forager is free).
        acked = _submit(sim, c, payload=2, ack=True)
        keyed = _submit(sim, c, payload=3, key="k3")
        assert set(_journaled(j)) == {quick.id, acked.id, keyed.id}
        slow = _submit(sim, c, payload=4)
        assert slow.id not in _journaled(j)
        sim.advance(0.05)
        assert slow.id not in _journaled(j)
        sim.advance(0.1)
        assert _journaled(j)[slow.id] == "queued"
        assert j.verify() == []
    finally:
        j.close()


def test_a_re_sent_submission_asking_for_an_ack_is_written_before_the_ack() -> None:
    sim = InMemoryColony(journal_defer=5.0)
    sim.core.scheduler.track_changes = True  # as with a journal
    c = sim.client()
    sub = _submit(sim, c, payload=1)  # no ack: its write waits
    assert sim.records == 0
    frames = [c.identity, *p.binary.encode(p.Message(
        "task.submit", {"capability": "echo", "payload": 1, "ack": True}, frm="client",
        id=sub.id))]
    sim.core.receive(frames, None, sim.now)
    sim.core.end_turn(sim.now)
    actions = sim.core.take()
    kinds = [a.msg.kind if isinstance(a, Send) else type(a).__name__ for a in actions]
    assert kinds == ["Record", "task.submitted"], kinds
    assert isinstance(actions[0], Record) and [t.id for t in actions[0].tasks] == [sub.id]


def test_a_status_or_attach_carrying_a_result_waits_for_its_record() -> None:
    sim = InMemoryColony()
    sim.core.scheduler.track_changes = True
    c = sim.client()
    f = sim.forager("f")
    sub = _submit(sim, c, payload=1)
    (a,) = sim.assigns(f)
    # The result, then the submitter asking about the task (and attaching to it), all in
    # one turn: what carries the result leaves after the task's record.
    for peer, kind, body, ref in (
            (f, "task.result", {"status": "ok", "result": 1}, a["id"]),
            (c, "task.status", {"task": sub.id}, None),
            (c, "task.attach", {"task": sub.id}, None)):
        msg = p.Message(kind, body, ref=ref, frm=peer.name, to="queen")
        sim.core.receive([peer.identity, *p.binary.encode(msg)], None, sim.now)
    sim.core.end_turn(sim.now)
    kinds = [a.msg.kind if isinstance(a, Send) else type(a).__name__
             for a in sim.core.take()]
    assert kinds.index("Record") < kinds.index("task.state"), kinds
    assert kinds.index("Record") < kinds.index("task.attached"), kinds


def test_a_task_accepted_by_its_forager_is_written_at_once(tmp_path: Path) -> None:
    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j, journal_defer=5.0)
    try:
        c = sim.client()
        f = sim.forager("f", slots=1)
        sub = _submit(sim, c, payload=1)
        (a,) = sim.assigns(f)
        assert _journaled(j) == {}
        f.send("task.accept", {}, ref=a["id"])  # a handler running past the accept delay
        assert _journaled(j) == {sub.id: "accepted"}
    finally:
        j.close()


def test_a_clean_stop_writes_the_waiting_tasks(tmp_path: Path) -> None:
    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j, journal_defer=5.0)
    try:
        c = sim.client()
        sub = _submit(sim, c, payload=1)
        assert _journaled(j) == {}
        sim.core.farewell(sim.now)
        for a in sim.core.take():
            if isinstance(a, Record):
                j.record(a.tasks, 1e9)
        assert _journaled(j) == {sub.id: "queued"}
    finally:
        j.close()


# -- standing by, and colony memory in the journal --------------------------------------

def test_a_standby_core_answers_everything_not_leader_naming_the_leader() -> None:
    sim = InMemoryColony()
    sim.core.lead(4, {"role": "standby", "term": 4, "queen": "qb", "leader": "tcp://a:1",
                      "message": "queen 'qb' is a standby: queen 'qa' leads (term 4)"})
    f = sim.raw("f1")  # (a session would go on to another queen: this one says hello once)
    hello = f.send("hello", {"role": "forager", "name": "f1", "versions": [2],
                             "codecs": ["msgpack"], "slots": 1, "tools": ["echo"]})
    err = f.one("error")
    assert err.ref == hello.id and err.b["code"] == "not-leader"
    assert err.b["leader"] == "tcp://a:1" and err.b["term"] == 4 and "standby" in err.b["message"]
    assert not sim.core.registry.by_id  # nobody registered with a standby
    f.send("task.result", {"result": 1}, ref="t.1")
    assert f.one("error").b["code"] == "not-leader"
    f.send("error", {"code": "bad-value", "message": "x"})
    assert f.take() == []  # an error is never answered (no ping-pong)
    assert sim.core.status(sim.now)["role"] == "standby"
    sim.core.lead(4)
    assert sim.core.status(sim.now)["role"] == "leader"


def test_colony_memory_is_journaled_and_comes_back_with_its_ttls(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    sim = InMemoryColony(journal=Journal(path))
    c = sim.client("c")
    for op in ({"op": "set", "key": "plan", "value": {"step": 3}},
               {"op": "set", "key": "lease", "value": "x", "ttl": 30.0},
               {"op": "set", "key": "gone", "value": 1},
               {"op": "delete", "key": "gone"},
               {"op": "set", "key": "short", "value": 2, "ttl": 0.5}):
        c.send("mem.sync", op)
        assert c.one("mem.sync").b["op"] == "ok"
    seq = sim.core.memory.seq
    assert sim.journal is not None
    sim.journal.close()
    again = InMemoryColony(journal=Journal(path))  # (the same wall clock: no time went by)
    mem = again.core.memory
    assert mem.items == {"plan": {"step": 3}, "lease": "x", "short": 2} and mem.seq == seq
    assert mem.expires["lease"] - again.now == pytest.approx(30.0)
    assert mem.expires["short"] - again.now == pytest.approx(0.5)
    again.advance(0.6)  # its time runs out: gone, and journaled so
    assert "short" not in mem.items
    assert again.journal is not None
    assert [k for k, *_ in again.journal.memory()] == ["plan", "lease"]
    again.journal.close()


def test_keys_expiring_together_are_one_journal_record() -> None:
    sim = InMemoryColony(journal=None)
    sim.core.memory_service.journaled = True  # journaled (records counted, not written)
    c = sim.client("c")
    for i in range(50):
        c.send("mem.sync", {"op": "set", "key": f"k{i}", "value": i, "ttl": 0.5})
        assert c.one("mem.sync").b["op"] == "ok"
    before = sim.records
    assert before == 50  # one a turn: each set came in its own turn
    sim.advance(0.6)
    assert not sim.core.memory.items and sim.records == before + 1


def test_a_queen_stopping_cleanly_says_so_to_every_peer() -> None:
    import random

    from meshant.core.peers.peer_session import PeerSession

    sim = InMemoryColony()
    sim.core.farewell(sim.now)
    (a,) = sim.core.take()
    assert isinstance(a, Publish)
    msg = p.binary.decode(a.frames)
    assert msg.b["state"] == "stopping" and msg.b["epoch"] != sim.core.epoch
    s = PeerSession(rng=random.Random(1))
    s.start(0.0)
    s.take()
    s.hello_sent("h", 0.0)
    s.on_welcome("h", {"version": 2, "features": [], "hb_interval": 1.0, "hb_misses": 5,
                       "assign_timeout": 30.0, "epoch": sim.core.epoch}, 0.0)
    s.take()
    s.on_queen_beat(msg.b["epoch"], 0.1)  # at once, not after 5 s of silence
    assert [type(x).__name__ for x in s.take()] == ["Lost", "SayHello"]


def test_progress_travels_in_batches_only_between_peers_that_negotiated_it() -> None:
    # #26: with batch.progress, a forager's progress reports ride in its task.batch and
    # the queen's per-turn batch to a client carries them too, in order with the
    # partials; a client without it gets them one by one, a forager without it that
    # batches one anyway is refused unsupported for that item only.
    from meshant.protocol.negotiation import FEATURES

    sim = InMemoryColony()
    plain = [f for f in FEATURES if f != "batch.progress"]
    c = sim.client("c")
    old = sim.client("old", features=plain)
    f = sim.forager("f")
    sub = _submit(sim, c, payload=1)
    (a,) = sim.assigns(f)
    f.send("task.batch", {"results": [
        {"ref": a["id"], "kind": "task.progress", "fraction": 0.5, "n": 1},
        {"ref": a["id"], "partial": True, "value": "tok", "n": 2},
        {"ref": a["id"], "status": "ok", "result": "done"}]})
    (batch,) = c.take("task.batch")
    items = batch.b["results"]
    assert [(i.get("kind"), i.get("partial"), i.get("state")) for i in items] == [
        ("task.progress", None, None), (None, True, None), (None, None, "completed")]
    assert [i["seq"] for i in items] == [1, 2, 3]
    assert items[0]["task"] == sub.id and items[0]["fraction"] == 0.5
    assert f.take("error") == []
    sub2 = _submit(sim, old, payload=2)
    (a2,) = sim.assigns(f)
    f.send("task.batch", {"results": [
        {"ref": a2["id"], "kind": "task.progress", "fraction": 0.25, "n": 1},
        {"ref": a2["id"], "partial": True, "value": "t", "n": 2}]})
    got = old.take()
    assert [m.kind for m in got] == ["task.progress", "task.result"]
    assert got[0].b["task"] == sub2.id and got[1].b["partial"]
    g = sim.forager("g", features=plain)
    sub3 = _submit(sim, c, "echo", payload=3)
    (a3,) = sim.assigns(g)
    g.send("task.batch", {"results": [
        {"ref": a3["id"], "kind": "task.progress", "fraction": 0.5},
        {"ref": a3["id"], "kind": "task.nope"},
        {"ref": a3["id"], "status": "ok", "result": 3}]})
    assert [(e.b["code"], e.b["assign"]) for e in g.take("error")] == [
        ("unsupported", a3["id"]), ("bad-value", a3["id"])]
    assert sim.results(c)[sub3.id]["result"] == 3
