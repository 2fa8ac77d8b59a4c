"""Rate limits by key (#32.3): token buckets (core/tasks/rates.py) in the scheduler,
a submission's cost, a handler's charge, and real foragers over loopback."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from meshant.core.tasks.limits import parse_rule, parse_rules
from meshant.core.tasks.rates import RateRule
from meshant.errors import BadInput

from .conftest import Colony
from .inmemory import InMemoryColony
from .test_limits import _finish, _running
from .test_scheduler import Colony as Sched


def test_rates_as_written() -> None:
    r = parse_rule("llm=600/min")
    assert isinstance(r, RateRule) and r.rate == 10.0 and r.burst == 600
    r = parse_rule("llm:payload.tenant=10/s,burst=20")
    assert isinstance(r, RateRule) and (r.rate, r.burst, r.field) == (10.0, 20.0, "tenant")
    assert r.text == "llm:payload.tenant=10/s,burst=20" and not r.by_cost
    r = parse_rule("llm=90000/min,cost,burst=20000")
    assert isinstance(r, RateRule) and r.by_cost and (r.rate, r.burst) == (1500.0, 20000)
    for bad, says in (("llm=0/min", "above zero"), ("llm=5/fortnight", "is not a rate"),
                      ("llm=-5/min", "is not a rate"), ("llm=5/s,burst=0", "above zero")):
        with pytest.raises(ValueError, match=says):
            parse_rule(bad)


def _rated(*rules: str, **kw: Any) -> Sched:
    c = Sched(**kw)
    rs = parse_rules(rules)
    c.s.limits.configure(rs)
    c.s.rates.configure(rs)
    return c


def test_a_bucket_lets_its_burst_through_then_its_rate() -> None:
    c = _rated("llm=2/s,burst=3")
    c.forager("f", slots=100, tools=("llm",))
    for i in range(10):
        c.submit(f"t{i}", "llm")
    c.step()
    assert _running(c) == ["t0", "t1", "t2"]
    assert c.s.queued == 7
    assert "llm=2/s,burst=3: 0 of 1 tokens, frees in 0.500 s" in (
        c.s.rates.why(c.s.tasks["t3"], c.now) or "")
    c.step(0.499)
    assert len(_running(c)) == 3
    c.step(0.002)
    assert _running(c) == ["t0", "t1", "t2", "t3"]
    c.step(1.0)
    assert len(_running(c)) == 6  # two more a second


def test_keys_have_buckets_of_their_own_and_cost_counts() -> None:
    c = _rated("llm:payload.tenant=1/s,burst=5,cost")
    c.forager("f", slots=100, tools=("llm",))
    c.submit("a-big", "llm", payload={"tenant": "a"}, cost=5)
    c.submit("a-next", "llm", payload={"tenant": "a"})
    c.submit("b", "llm", payload={"tenant": "b"})
    c.step()
    assert _running(c) == ["a-big", "b"]
    c.step(1.0)
    assert _running(c) == ["a-big", "a-next", "b"]


def test_a_charge_makes_the_bucket_follow_real_use() -> None:
    c = _rated("llm=1/s,burst=10,cost", "llm=100/s")  # (tokens, and requests)
    c.forager("f", slots=100, tools=("llm",))
    c.submit("t0", "llm", cost=1)
    c.submit("t1", "llm", cost=5)
    c.step()
    assert _running(c) == ["t0", "t1"]  # 10 - 1 - 5 = 4 tokens left
    (att,) = [a for runs in c.s.running.values() for a in runs.values() if a.task.id == "t0"]
    c.s.progress(att, {"charge": 4, "n": 1}, c.now)  # it really took 4: 1 left
    assert c.s.work == []  # (a charge alone is not relayed)
    c.submit("t2", "llm", cost=2)
    c.step()
    assert "t2" not in _running(c)
    c.s.progress(att, {"charge": 4, "n": 1}, c.now)  # sent again: taken once
    c.step(1.0)
    assert "t2" in _running(c)
    _finish(c, "t2")


def _taken_over(newest_event_ago: float) -> Any:
    """A queen that took over a journal whose newest event was that long ago, 12 tasks
    of its rated capability submitted and dispatched."""
    c = _rated("llm=2/s,burst=10")
    c.now = 100.0
    c.s.rates.resume(c.now - newest_event_ago)
    c.forager("f", slots=100, tools=("llm",))
    for i in range(12):
        c.submit(f"t{i}", "llm")
    c.step()
    return c


def test_a_queen_taking_over_refills_its_buckets_from_the_journals_newest_event() -> None:
    # The last queen may have let tasks through until the journal's newest event, 1.5 s
    # ago: the buckets hold what 1.5 s refilled (3 of 10), not a second burst of 10.
    c = _taken_over(1.5)
    assert _running(c) == ["t0", "t1", "t2"]
    c.step(0.5)
    assert len(_running(c)) == 4  # then the rate, as ever
    # A bucket first used long after that event starts full: nothing recent to count.
    assert len(_running(_taken_over(5.0))) == 10


def test_the_queen_core_resumes_its_buckets_from_what_the_journal_says() -> None:
    # (No sockets.) A core built on a journal whose newest event is at wall 1000.0 — 2 s before
    # its own wall-clock 1002.0 — counts the deferral window too: 1.9 s of refill.
    from meshant.core.journal.archive import Restored
    from meshant.core.queen.router import QueenConfig, QueenCore

    cfg = QueenConfig(limits=("llm=10/s,burst=100",), journal_defer=0.1)
    core = QueenCore(cfg, epoch="e", wall_offset=1000.0, now=2.0,
                     restored=Restored(last_event=1000.0))
    rates = core.scheduler.rates
    assert rates.since == pytest.approx(0.1)
    assert rates._bucket((0, ""), 2.0).tokens == pytest.approx(19.0)
    fresh = QueenCore(cfg, epoch="e", wall_offset=1000.0, now=2.0, restored=Restored())
    assert fresh.scheduler.rates._bucket((0, ""), 2.0).tokens == 100  # an empty journal


def test_a_submission_lacking_its_rates_key_or_with_a_bad_cost_is_refused() -> None:
    sim = InMemoryColony(limits=("llm:labels.tenant=5/s",))
    c = sim.client()
    for body, says in (({}, "needs a label 'tenant'"),
                       ({"labels": {"tenant": "a"}, "cost": -1}, "'cost' is a number")):
        c.send("task.submit", {"capability": "llm", **body})
        err = c.one("error").b
        assert err["code"] == "bad-value" and says in err["message"], err


def test_rates_and_charges_over_loopback(colony: Colony) -> None:
    colony.start_queen(limits=("work=5/s,burst=2", "work=100/s,cost"))
    ran: list[float] = []
    lock = threading.Lock()

    def work(x: int, ctx: Any) -> int:
        with lock:
            ran.append(time.monotonic())
        ctx.charge(1)
        return x

    colony.forager({"work": work}, slots=8)
    c = colony.client()
    t0 = time.monotonic()
    futs = [c.submit("work", i) for i in range(6)]
    assert sorted(f.result(timeout=20) for f in futs) == list(range(6))
    # A burst of 2, then 5 a second: the 6th no sooner than 0.8 s after the first.
    assert ran[-1] - t0 >= 0.8 - 0.05
    with pytest.raises(BadInput, match="cost is"):
        c.submit("work", 1, cost=0)
