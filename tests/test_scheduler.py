"""The scheduler and registry, driven deterministically with an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from meshant.core.nodes.registry import Node, Registry
from meshant.core.tasks.model import COMPLETED, FAILED, QUEUED, Task
from meshant.core.tasks.scheduler import Scheduler
from meshant.core.tasks.work import Assign, Deliver, Revoke, Watch, Work
from meshant.errors import QueueFull


class Colony:
    """A registry and a scheduler with helpers to add foragers and read what was sent."""

    def __init__(self, **kw: Any) -> None:
        self.reg = Registry(hb_interval=1.0, hb_misses=3)
        self.s = Scheduler(self.reg, assign_timeout=kw.pop("assign_timeout", 10.0), **kw)
        self.now = 0.0

    def forager(self, name: str, slots: int = 1, tools: tuple[str, ...] = ("echo",),
                labels: dict[str, Any] | None = None, identity: bytes | None = None) -> Node:
        node = Node(name=name, identity=identity or name.encode(), role="forager", codec="iacp2",
                    slots=slots, tools=frozenset(tools), labels=labels or {})
        self.reg.add(node, self.now)
        self.s.forager_joined(node)
        return node

    def submit(self, tid: str, cap: str = "echo", **kw: Any) -> Task:
        return self.s.submit(Task(id=tid, capability=cap, client=b"c", **kw), self.now)

    def step(self, dt: float = 0.0) -> list[tuple[Any, ...]]:
        self.now += dt
        self.s.tick(self.now)
        self.s.dispatch(self.now)
        out = self.s.work[:]
        self.s.work.clear()
        return [_tuple(w) for w in out]

    @staticmethod
    def assigns(out: list[tuple[Any, ...]]) -> list[tuple[str, str]]:
        return [(a[1].name, a[2].task.id) for a in out if a[0] == "assign"]

    @staticmethod
    def finals(out: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        return [a[3] for a in out if a[0] == "deliver" and a[2] == "task.result"
                and not a[3].get("partial")]


def _tuple(w: Work) -> tuple[Any, ...]:
    """The scheduler's typed work as tuples, for short assertions."""
    match w:
        case Assign(node=node, attempt=att):
            return ("assign", node, att)
        case Revoke(node=node, attempt=att):
            return ("cancel", node, att)
        case Deliver(task=task, kind=kind, body=body):
            return ("deliver", task, kind, body)
        case Watch(identity=identity, name=name, body=body):
            return ("watch", identity, name, body)
    raise AssertionError(w)


def test_priority_then_fifo() -> None:
    c = Colony()
    for tid, prio in [("a", 50), ("b", 10), ("c", 50), ("d", 0), ("e", 10)]:
        c.submit(tid, priority=prio)
    f = c.forager("f1", slots=1)
    order = []
    for _ in range(5):
        out = c.step()
        (_name, tid), = c.assigns(out)
        order.append(tid)
        att = c.s.running_on(f)[f"{tid}.1"]
        c.s.result(att, {"status": "ok", "result": tid}, c.now)
    assert order == ["d", "b", "e", "a", "c"]


def test_slots_never_exceeded_and_least_loaded() -> None:
    c = Colony()
    f1 = c.forager("f1", slots=2)
    f2 = c.forager("f2", slots=3)
    for i in range(20):
        c.submit(f"t{i}")
    out = c.step()
    names = [n for n, _ in c.assigns(out)]
    assert len(c.s.running_on(f1)) == 2 and len(c.s.running_on(f2)) == 3
    assert names.count("f1") == 2 and names.count("f2") == 3
    assert c.s.queued == 15
    # Nothing more is assigned until a slot frees.
    assert c.assigns(c.step()) == []
    att = next(iter(c.s.running_on(f1).values()))
    c.s.result(att, {"status": "ok"}, c.now)
    assert [n for n, _ in c.assigns(c.step())] == ["f1"]


def test_routing_by_capability_labels_and_name() -> None:
    c = Colony()
    c.forager("cpu", slots=5, tools=("echo", "crawl"), labels={"gpu": False})
    c.forager("gpu", slots=5, tools=("echo",), labels={"gpu": True})
    c.submit("crawl1", "crawl")
    c.submit("needs-gpu", labels={"gpu": True})
    c.submit("named", to="cpu")
    got = dict((tid, n) for n, tid in c.assigns(c.step()))
    assert got == {"crawl1": "cpu", "needs-gpu": "gpu", "named": "cpu"}


def test_reject_goes_to_another_forager_and_all_rejected_fails() -> None:
    c = Colony()
    f1 = c.forager("f1", slots=2)
    f2 = c.forager("f2", slots=1)
    c.submit("blocker", to="f2")
    c.submit("t")
    assert sorted(c.assigns(c.step())) == [("f1", "t"), ("f2", "blocker")]
    c.s.reject(c.s.running_on(f1)["t.1"], "busy elsewhere", c.now)
    assert c.assigns(c.step()) == []  # f1 has room but is skipped; f2 is full
    c.s.result(c.s.running_on(f2)["blocker.1"], {"status": "ok"}, c.now)
    assert c.assigns(c.step()) == [("f2", "t")]
    c.s.reject(c.s.running_on(f2)["t.2"], "no thanks", c.now)
    out = c.step()
    (final,) = c.finals(out)
    assert final["state"] == FAILED and final["error"]["code"] == "rejected"
    assert "no thanks" in final["error"]["message"]


def test_lease_expiry_reissues_to_a_different_forager_and_fences_the_old_attempt() -> None:
    c = Colony(assign_timeout=5.0)
    f1 = c.forager("f1")
    c.submit("t")
    assert c.assigns(c.step()) == [("f1", "t")]
    old = c.s.running_on(f1)["t.1"]
    f2 = c.forager("f2")
    out = c.step(5.1)
    assert ("cancel", f1, old) in out
    assert c.assigns(out) == [("f2", "t")]
    # The old attempt's late result is a duplicate; the current one is delivered once.
    verdict, att = c.s.lookup(f1, "t.1")
    assert verdict == "duplicate"
    verdict, att = c.s.lookup(f2, "t.2")
    assert verdict == "ok"
    c.s.result(att, {"status": "ok", "result": 42}, c.now)
    (final,) = c.finals(c.step())
    assert final["state"] == COMPLETED and final["result"] == 42 and final["attempt"] == 2
    assert c.s.lookup(f2, "t.2")[0] == "duplicate"


def test_progress_and_heartbeat_renew_the_lease() -> None:
    c = Colony(assign_timeout=5.0)
    f1 = c.forager("f1")
    c.forager("f2")
    c.submit("t")
    c.step()
    node = f1 if "t.1" in c.s.running_on(f1) else c.reg.by_name["f2"]
    att = c.s.running_on(node)["t.1"]
    for _ in range(4):
        c.step(3.0)
        c.s.renew(node, ["t.1"], c.now)
    c.step(3.0)
    c.s.progress(att, {"fraction": 0.5}, c.now)
    out = c.step(4.0)
    assert not [a for a in out if a[0] in ("assign", "cancel")]
    assert att.live and c.s.counters["reissued"] == 0


def test_attempts_exhausted_fails_with_reason() -> None:
    c = Colony(assign_timeout=1.0)
    for i in range(3):
        c.forager(f"f{i}")
    c.submit("t", max_attempts=2)
    c.step()
    c.step(1.1)
    out = c.step(1.1)
    (final,) = c.finals(out)
    assert final["error"]["code"] == "attempts-exhausted"
    assert "assign timeout" in final["error"]["message"]


def test_deadline_and_no_forager_wait() -> None:
    c = Colony()
    c.submit("slow", timeout=2.0, wait=100)
    c.submit("orphan", cap="nobody", wait=1.0)
    f = c.forager("f1")
    c.step()
    assert "slow.1" in c.s.running_on(f)
    out = c.step(1.5)
    (final,) = c.finals(out)
    assert final["task"] == "orphan" and final["error"]["code"] == "no-forager"
    out = c.step(1.0)
    (final,) = c.finals(out)
    assert final["task"] == "slow" and final["error"]["code"] == "deadline-exceeded"
    assert any(a[0] == "cancel" for a in out)


def test_cancel_queued_and_running() -> None:
    c = Colony()
    f = c.forager("f1")
    c.submit("run")
    c.submit("wait")
    c.step()
    c.s.cancel("wait", c.now)
    c.s.cancel("run", c.now)
    out = c.step()
    finals = {b["task"]: b["state"] for b in c.finals(out)}
    assert finals == {"wait": "cancelled", "run": "cancelled"}
    assert any(a[0] == "cancel" and a[2].id == "run.1" for a in out)
    # The cancelled attempt keeps its slot until the forager answers.
    assert "run.1" in c.s.running_on(f)
    att = c.s.attempts["run.1"]
    c.s.release(att)
    assert not c.s.running_on(f)


def test_forager_lost_reissues_in_flight() -> None:
    c = Colony()
    f1 = c.forager("f1", slots=2)
    c.submit("a")
    c.submit("b")
    c.step()
    c.reg.remove(f1, c.now)
    c.s.forager_lost(f1, c.now)
    f2 = c.forager("f2", slots=2)
    out = c.step()
    assert sorted(c.assigns(out)) == [("f2", "a"), ("f2", "b")]
    assert {a.number for a in c.s.running_on(f2).values()} == {2}


def test_rejoin_adopts_running_attempts() -> None:
    c = Colony()
    f1 = c.forager("f1", slots=2)
    c.submit("a")
    c.submit("b")
    c.step()
    again = Node(name="f1", identity=b"f1", role="forager", codec="iacp2", slots=2,
                 tools=frozenset({"echo"}))
    c.reg.add(again, c.now)
    c.s.forager_rejoined(f1, again, ["a.1"], c.now)
    out = c.step()
    assert "a.1" in c.s.running_on(again)
    assert c.assigns(out) == [("f1", "b")]  # b was not reported running: reissued
    assert c.s.running_on(again)["b.2"].number == 2


def test_hung_forager_is_avoided_but_a_restarted_one_is_not() -> None:
    c = Colony(assign_timeout=1.0)
    hung = c.forager("f1", identity=b"conn-1")
    c.submit("t")
    c.step()
    busy = c.forager("f2")  # another forager could take it, once free
    c.submit("blocker", to="f2")
    assert c.assigns(c.step()) == [("f2", "blocker")]
    c.s.renew(busy, ["blocker.1"], c.now + 1.5)
    assert c.assigns(c.step(1.5)) == []  # the hung forager is not given its task again
    assert c.s.tasks["t"].state == QUEUED
    c.reg.remove(hung, c.now)
    c.s.forager_lost(hung, c.now)
    c.forager("f1", identity=b"conn-2")  # the same forager restarted: a new connection
    assert c.assigns(c.step()) == [("f1", "t")]


def test_a_task_only_its_avoided_forager_can_take_goes_back_to_it() -> None:
    # Found by the simulator (seed 1754): a task sent to f1 by name was reissued when f1
    # went silent for a moment; f1 came back on the same connection, which the task
    # avoided, and no other forager may take it: it waited for ever.
    c = Colony(assign_timeout=1.0)
    c.forager("f1", slots=2, identity=b"conn-1")
    c.forager("f2")
    c.submit("t", to="f1")
    c.submit("u", labels={"gpu": True})
    c.s.registry.by_name["f1"].labels = {"gpu": True}
    c.step()
    assert c.assigns(c.step(1.5)) == [("f1", "t"), ("f1", "u")]  # each back, attempt 2
    assert c.s.tasks["t"].attempt == 2 and c.s.tasks["u"].attempt == 2


def test_queue_full_changes_nothing() -> None:
    c = Colony(max_queue=2)
    c.submit("a")
    c.submit("b")
    with pytest.raises(QueueFull):
        c.submit("c")
    assert c.s.queued == 2 and set(c.s.tasks) == {"a", "b"}


def test_partial_results_carry_increasing_seq() -> None:
    c = Colony()
    f = c.forager("f1")
    c.submit("t")
    c.step()
    att = c.s.running_on(f)["t.1"]
    c.s.progress(att, {"fraction": 0.1}, c.now)
    c.s.result(att, {"partial": True, "value": "a"}, c.now)
    c.s.result(att, {"partial": True, "value": "b"}, c.now)
    c.s.result(att, {"status": "ok", "result": "ab"}, c.now)
    out = c.step()
    seqs = [a[3]["seq"] for a in out if a[0] == "deliver"]
    assert seqs == [1, 2, 3, 4]


def test_handler_error_is_a_failed_result_with_type() -> None:
    c = Colony()
    f = c.forager("f1")
    c.submit("t", max_attempts=1)
    c.step()
    c.s.result(c.s.running_on(f)["t.1"], {"status": "error",
                                     "error": {"type": "ValueError", "message": "bad"}}, c.now)
    (final,) = c.finals(c.step())
    assert final["error"] == {"code": "handler-error", "type": "ValueError", "message": "bad",
                              "forager": "f1", "cause": "handler-error", "attempts": 1,
                              "reasons": ["f1: ValueError: bad"]}
    assert "t" in c.s.dlq  # and it is a dead letter


def test_a_handler_error_fails_the_task_at_once_unless_one_to_retry() -> None:
    c = Colony()
    f = c.forager("f1", slots=4)
    c.submit("plain", max_attempts=5)
    c.submit("named", max_attempts=5, retry_on=("TimeoutError",))
    c.submit("other", max_attempts=5, retry_on=("TimeoutError",))
    c.submit("any", max_attempts=5, retry_on=("*",))
    c.step()
    tb = [{"file": "app.py", "line": 3, "function": "handle", "source": "x['b']"}]
    on = c.s.running_on(f)
    c.s.result(on["plain.1"], {"status": "error", "error": {
        "type": "KeyError", "message": "'b'", "traceback": tb}}, c.now)
    c.s.result(on["named.1"], {"status": "error", "error": {"type": "TimeoutError"}}, c.now)
    c.s.result(on["other.1"], {"status": "error", "error": {"type": "KeyError"}}, c.now)
    c.s.result(on["any.1"], {"status": "error", "error": {"type": "KeyError"}}, c.now)
    finals = {m["task"]: m for m in c.finals(c.step())}
    assert sorted(finals) == ["other", "plain"]  # the others wait out a backoff
    assert finals["plain"]["error"]["attempts"] == 1
    assert finals["plain"]["error"]["traceback"] == tb  # where it failed, passed on
    assert c.s.tasks["named"].state == c.s.tasks["any"].state == "queued"
    assert sorted(c.s.dlq) == ["other", "plain"]


def test_handler_errors_retry_with_backoff_then_dead_letter() -> None:
    c = Colony()
    f = c.forager("f1")
    c.submit("t", max_attempts=3)
    c.step()
    for n in (1, 2):  # the handler asks for a retry (its retry_on)
        c.s.result(c.s.running_on(f)[f"t.{n}"], {"status": "error", "error": {
            "type": "E", "retry": True}}, c.now)
        assert c.assigns(c.step()) == []  # waiting out a jittered backoff, not hammering
        assert c.s.tasks["t"].state == "queued" and c.s.queued == 1
        ceiling = c.s.backoff.ceiling(n - 1)
        assert c.assigns(c.step(ceiling + 0.01)) == [("f1", "t")]
    c.s.result(c.s.running_on(f)["t.3"], {"status": "error", "error": {"type": "E"}}, c.now)
    (final,) = c.finals(c.step())
    assert final["state"] == "failed" and final["error"]["attempts"] == 3
    assert list(c.s.dlq) == ["t"] and c.s.counters["retried"] == 2
    new = c.s.dlq_retry("t", b"c", "client", c.now)
    assert new.id == "t.r1" and "t" not in c.s.dlq
    assert c.assigns(c.step()) == [("f1", "t.r1")]


def _outage(c: Colony, f: Any, tasks: int, failures: int) -> None:
    """Submit ``tasks`` one-attempt tasks to ``f``; the first ``failures`` of them fail
    with an infrastructure error (retry: true), as an outage would."""
    for i in range(tasks):
        c.submit(f"t{i}", max_attempts=1)
    c.step()
    for i in range(failures):
        c.s.result(c.s.running_on(f)[f"t{i}.1"], {"status": "error", "error": {
            "retry": True}}, c.now)
    c.step()


def test_breakers_open_on_an_outage_and_half_open_after_cooldown() -> None:
    c = Colony(breaker_threshold=3, breaker_cooldown=10.0, assign_timeout=100.0)
    f = c.forager("f1", slots=5)
    _outage(c, f, tasks=5, failures=3)  # three different tasks: an outage, not a payload
    assert c.s.breakers.states() == {"foragers": {"f1": "open"}, "capabilities": {"echo": "open"}}
    c.submit("later")
    assert c.assigns(c.step(1.0)) == []  # held while open
    c.s.dirty = False
    c.s.tick(c.now + 10.0)  # the cooldown's end alone makes the scheduler look again
    assert c.s.dirty
    out = c.step(10.0)  # half-open: exactly one trial goes through
    assert len(c.assigns(out)) == 1
    (_name, tid), = c.assigns(out)
    c.s.result(c.s.running_on(f)[f"{tid}.1"], {"status": "ok"}, c.now)
    c.step()
    assert c.s.breakers.states() == {"foragers": {}, "capabilities": {}}


def test_handler_errors_that_fail_at_once_open_no_circuit() -> None:
    # A buggy handler fails its own tasks at once; it must not hold back the forager's
    # other capabilities (found by trying it: five KeyErrors stopped every echo).
    c = Colony(breaker_threshold=3)
    f = c.forager("f1", slots=5, tools=("buggy", "echo"))
    for i in range(5):
        c.submit(f"t{i}", cap="buggy")
    c.step()
    for i in range(5):
        c.s.result(c.s.running_on(f)[f"t{i}.1"], {"status": "error", "error": {
            "type": "KeyError"}}, c.now)
    c.step()
    assert c.s.breakers.states() == {"foragers": {}, "capabilities": {}}
    c.submit("e", cap="echo")
    assert c.assigns(c.step()) == [("f1", "e")]


def test_a_trial_that_ends_without_an_outcome_frees_the_half_open_circuit() -> None:
    # (A fail-at-once error as the trial once left the circuit half-open for good.)
    c = Colony(breaker_threshold=2, breaker_cooldown=5.0, assign_timeout=100.0)
    f = c.forager("f1", slots=4)
    _outage(c, f, tasks=2, failures=2)
    assert c.s.breakers.states()["capabilities"] == {"echo": "open"}
    c.submit("trial")
    c.submit("next")
    (trial,) = c.assigns(c.step(5.0))
    c.s.result(c.s.running_on(f)[f"{trial[1]}.1"], {"status": "error", "error": {
        "type": "KeyError"}}, c.now)  # fails its task at once: no outcome
    assert len(c.assigns(c.step())) == 1  # the next task is the new trial


def test_registry_liveness_reports_each_node_once() -> None:
    reg = Registry(hb_interval=1.0, hb_misses=3)
    n = Node(name="f", identity=b"f", role="forager", codec="iacp2", slots=1)
    reg.add(n, 0.0)
    assert reg.expired(2.9) == []
    assert reg.expired(3.1) == [n]
    assert reg.expired(10.0) == []
    assert not reg.name_taken("f", b"other")


def test_registry_name_taken_by_live_peer() -> None:
    reg = Registry()
    reg.add(Node(name="f", identity=b"a", role="forager", codec="iacp2", slots=1), 0.0)
    assert reg.name_taken("f", b"b")
    assert not reg.name_taken("f", b"a")


def test_no_forager_wait_starts_when_the_last_capable_forager_leaves() -> None:
    c = Colony()
    f = c.forager("only", slots=1)
    c.submit("busy", wait=2.0)
    c.submit("queued", wait=2.0)
    c.step()
    assert not c.s.tasks["queued"].waiting  # someone serves it: no timer at all
    c.reg.remove(f, c.now)
    c.s.forager_lost(f, c.now)
    out = c.step(1.0)
    assert c.finals(out) == []
    out = c.step(1.5)
    assert sorted(b["task"] for b in c.finals(out)) == ["busy", "queued"]
    assert {b["error"]["code"] for b in c.finals(out)} == {"no-forager"}


def test_a_tasks_own_retry_policy_overrides_the_queens() -> None:
    import random

    c = Colony()
    c.s.backoff.rng = random.Random(3)
    expected = random.Random(3).uniform(0.0, min(200.0, 100.0))  # its base, not 0.5 s
    f = c.forager("f1")
    c.submit("t", max_attempts=5, retry_base=100.0, retry_cap=200.0)
    c.step()
    c.s.result(c.s.running_on(f)["t.1"], {"status": "error", "error": {"retry": True}}, c.now)
    c.step()
    assert c.s.tasks["t"].history[-1][2].endswith(f"retry in {expected:.2f} s")
    assert c.assigns(c.step(expected - 0.01)) == []
    assert c.assigns(c.step(0.02)) == [("f1", "t")]


def _finish_all(c: Colony, f: Node) -> None:
    """Complete whatever ``f`` runs, then let the scheduler hand it more, until none is left."""
    for _ in range(10_000):
        running = [att for att in c.s.running_on(f).values() if att.live]
        if not running and not c.s.queued:
            return
        for att in running:
            c.s.result(att, {"status": "ok", "result": None}, c.now)
        c.step()
    raise AssertionError("the queue did not drain")


def test_wait_timers_go_when_their_tasks_leave_the_queue() -> None:
    c = Colony()
    for i in range(500):
        c.submit(f"t{i}", wait=3600.0)  # nobody serves echo yet: each gets a wait timer
    assert len(c.s.timers.heap) == 500 and all(t.waiting for t in c.s.tasks.values())
    f = c.forager("f1", slots=8)
    c.step()
    _finish_all(c, f)
    assert c.s.tasks == {} and c.s.queued == 0
    assert c.s.timers.heap == []  # nothing left for tasks that are gone
    assert c.s.queues.heaps == {}


def test_timers_of_assigned_tasks_are_compacted_while_others_still_wait() -> None:
    c = Colony()
    for i in range(300):
        c.submit(f"a{i}", wait=3600.0)
    c.submit("other", cap="nobody", wait=3600.0)
    f = c.forager("f1", slots=300)
    c.step()
    assert len(c.s.running_on(f)) == 300
    # Running, not queued: only the task still waiting keeps a timer. Stale entries are
    # deleted lazily, but never outnumber the live ones.
    assert "other" in [e[2] for e in c.s.timers.heap] and len(c.s.timers.heap) <= 2
    assert not any(t.waiting for t in c.s.tasks.values() if t.id != "other")
    out = c.step(3600.0)
    assert [b["task"] for b in c.finals(out)] == ["other"]
    assert c.s.timers.heap == []


def test_cancelled_and_expired_tasks_leave_nothing_behind() -> None:
    c = Colony()
    for i in range(200):
        c.submit(f"d{i}", cap="nobody", timeout=5.0, wait=3600.0)  # deadline + wait timers
    for i in range(200):
        c.submit(f"c{i}", cap="nobody", wait=3600.0)
    assert len(c.s.timers.heap) == 600
    for i in range(200):
        c.s.cancel(f"c{i}", c.now)
    c.s.work.clear()
    assert len(c.s.timers.heap) <= 2 * 400  # compacted as they go stale
    out = c.step(5.0)
    # Their timeout ended the wait, but what failed them is that nobody serves "nobody".
    assert {b["error"]["code"] for b in c.finals(out)} == {"no-forager"}
    assert c.s.tasks == {} and c.s.timers.heap == [] and c.s.queues.heaps == {}


def test_wait_timer_still_fires_and_deadline_still_fires_after_requeue() -> None:
    c = Colony()
    c.submit("t", timeout=10.0, wait=2.0)
    assert c.s.tasks["t"].waiting  # nobody serves it yet
    c.step(0.5)
    f = c.forager("f1")
    c.step()
    assert "t.1" in c.s.running_on(f) and not c.s.tasks["t"].waiting
    assert len(c.s.timers.heap) <= 2  # its deadline, and perhaps the stale wait
    c.step(1.0)
    # Its forager goes: the task is queued again and waits afresh for another one.
    c.reg.remove(f, c.now)
    c.s.forager_lost(f, c.now)
    c.step()
    assert c.s.tasks["t"].state == QUEUED and c.s.tasks["t"].waiting
    out = c.step(1.9)
    assert c.finals(out) == []  # 3.4 s since submitted, 1.9 s since it waits again
    out = c.step(0.2)
    (final,) = c.finals(out)
    assert final["error"]["code"] == "no-forager"
    assert c.s.timers.heap == []
    # A deadline fires while the task runs.
    f2 = c.forager("f2")
    c.submit("u", timeout=3.0)
    c.step()
    assert "u.1" in c.s.running_on(f2)
    out = c.step(3.0)
    (final,) = c.finals(out)
    assert final["task"] == "u" and final["error"]["code"] == "deadline-exceeded"
    assert c.s.timers.heap == []


def test_a_wait_timer_that_finds_a_forager_lets_a_later_wait_start() -> None:
    c = Colony()
    busy = c.forager("busy", slots=1)
    c.submit("first", wait=100.0)
    c.step()
    c.reg.remove(busy, c.now)
    c.s.forager_lost(busy, c.now)  # both tasks nobody serves now: they wait
    c.submit("second", wait=1.0)
    other = c.forager("other", slots=1)
    c.step()
    assert c.s.tasks["second"].state == QUEUED  # "first" took the only slot
    c.step(1.0)  # its wait ends, but a capable forager is there: no failure
    assert c.s.tasks["second"].state == QUEUED and not c.s.tasks["second"].waiting
    c.reg.remove(other, c.now)
    c.s.forager_lost(other, c.now)
    out = c.step(0.5)
    assert c.finals(out) == []
    out = c.step(0.6)  # a new wait began when the forager left, and it ends now
    assert [b["task"] for b in c.finals(out)] == ["second"]


def test_a_queued_task_carries_no_per_task_containers() -> None:
    c = Colony()
    a = c.submit("a", cap="".join(["ec", "ho"]))
    b = c.submit("b", cap="".join(["ec", "ho"]))
    assert a.capability is b.capability  # interned
    assert a.labels is b.labels  # the shared empty one
    for t in (a, b):
        assert t.avoid is None and t.rejected is None and t.reasons is None
        assert t._watchers is None


def test_liveness_checks_skip_until_due_but_never_miss_a_deadline() -> None:
    from meshant.core.nodes.heartbeat import HeartbeatMonitor

    m = HeartbeatMonitor(interval=1.0, misses=3)
    m.add("a", 0.0)
    m.add("b", 0.5)
    assert m.check(2.9) == []
    m.beat("a", 2.0)
    assert m.check(3.4) == []
    assert m.check(3.5) == ["b"]  # exactly misses x interval after it was last heard
    m.add("short", 3.5, timeout=0.5)  # added after the last scan, with an earlier deadline
    assert m.check(4.0) == ["short"]
    assert m.check(5.0) == ["a"]
    m.beat("b", 6.0)  # back online: its new deadline counts
    assert m.check(8.9) == [] and m.check(9.0) == ["b"]
    assert m.check(100.0) == []


def test_lease_checks_skip_until_due_but_never_miss_a_lease() -> None:
    c = Colony(assign_timeout=5.0)
    f = c.forager("f1", slots=2)
    c.submit("early")
    c.step()  # lease until 5
    c.step(3.0)
    c.submit("late")
    c.step()  # lease until 8
    c.step(1.0)
    c.s.renew(f, ["early.1"], c.now)  # moved to 9, later than "late"'s
    assert c.step(3.9) == []
    out = c.step(0.1)
    assert [a[2].id for a in out if a[0] == "cancel"] == ["late.1"]
    assert "early.1" in c.s.running_on(f)
    assert c.step(0.9) == []
    out = c.step(0.1)
    assert [a[2].id for a in out if a[0] == "cancel"] == ["early.1"]


def test_a_task_nobody_serves_fails_no_forager_when_its_timeout_ends_the_wait() -> None:
    c = Colony()
    c.submit("t", cap="nosuch", timeout=2.0, wait=30.0)
    (body,) = c.finals(c.step(2.0))
    assert body["error"]["code"] == "no-forager" and "'nosuch'" in body["error"]["message"]
    # One that ran and then ran out of time is still deadline-exceeded.
    f = c.forager("f1")
    c.submit("u", timeout=1.0)
    assert c.assigns(c.step()) == [("f1", "u")]
    (body,) = c.finals(c.step(1.0))
    assert body["error"]["code"] == "deadline-exceeded" and c.s.running_on(f) == {}


def test_a_result_too_large_to_send_fails_at_once_without_retry() -> None:
    c = Colony()
    f = c.forager("f1")
    c.forager("f2")
    c.submit("t", max_attempts=5)
    (name, _), = c.assigns(c.step())
    node = f if name == "f1" else c.reg.by_name["f2"]
    c.s.result(c.s.running_on(node)["t.1"], {"status": "error", "error": {
        "type": "TooLarge", "code": "too-large", "message": "120,000 bytes, over 100,000"}},
        c.now)
    out = c.step(60.0)
    (body,) = c.finals(out)
    assert body["error"]["code"] == "too-large" and "100,000" in body["error"]["message"]
    assert c.assigns(out) == [] and c.s.counters["retried"] == 0
    assert "t" in c.s.dlq
