"""Delayed tasks (#32.1): submit(at=/after=), `meshant submit --in/--at`. The rules are
core/tasks/delays.py's; the scheduler moves a task DELAYED -> QUEUED at its time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from meshant.core.tasks import delays
from meshant.core.tasks.model import DELAYED, QUEUED
from meshant.errors import BadInput
from meshant.storage.journal import Journal

from .conftest import Colony, Procs, wait_for
from .inmemory import InMemoryColony
from .test_cli import meshant
from .test_scheduler import Colony as Sched

# -- the rules ----------------------------------------------------------------------------


def test_durations_and_times_a_person_writes() -> None:
    assert delays.parse_duration("90") == 90
    assert delays.parse_duration("5m") == 300
    assert delays.parse_duration("1h30m") == 5400
    assert delays.parse_duration("2d") == 172800
    assert delays.parse_duration("250ms") == 0.25
    for bad in ("5x", "", "m5", "-3", "5m 3", "1e9"):
        with pytest.raises(ValueError, match="duration"):
            delays.parse_duration(bad)
    assert delays.parse_time("2026-12-24T17:00Z") == delays.parse_time(
        "2026-12-24T18:00:00+01:00")
    with pytest.raises(ValueError, match="ISO-8601"):
        delays.parse_time("tomorrow")


def test_what_a_submission_may_say() -> None:
    assert delays.delay_problem({}) is None
    assert delays.delay_problem({"after": 5}) is None
    assert "not both" in (delays.delay_problem({"at": 1e9, "after": 5}) or "")
    assert "seconds" in (delays.delay_problem({"after": -1}) or "")
    assert "number" in (delays.delay_problem({"at": "noon"}) or "")
    assert "number" in (delays.delay_problem({"after": True}) or "")
    assert delays.not_before({"after": 5}, 1000.0) == 1005.0
    assert delays.not_before({"at": 900.0}, 1000.0) is None  # past: no delay
    assert delays.too_far(1000.0 + 400 * 86400, 1000.0) is not None


# -- the scheduler --------------------------------------------------------------------------


def test_a_delayed_task_waits_apart_and_never_starts_early() -> None:
    c = Sched()
    c.s.to_wall = 1000.0  # wall = monotonic + 1000
    f = c.forager("f1", slots=2)
    t = c.submit("late", not_before=1000.0 + 5.0, timeout=2.0)
    c.submit("now")
    assert t.state == DELAYED and c.s.delayed == 1 and c.s.queued == 1
    assert c.assigns(c.step()) == [("f1", "now")]
    assert "late" not in c.s.depths() and c.s.depths() == {}
    assert c.assigns(c.step(4.999)) == []
    out = c.step(0.001)
    assert c.assigns(out) == [("f1", "late")]
    assert c.s.delayed == 0 and [s for _, s, _ in t.history][:3] == [DELAYED, QUEUED,
                                                                     "assigned"]
    # Its run-time limit counts from its release, not its submission.
    assert t.deadline == pytest.approx(c.now + 2.0)
    assert f.busy == 2


def test_a_delayed_task_is_cancelled_at_once() -> None:
    c = Sched()
    c.forager("f1")
    c.submit("late", not_before=50.0)
    c.s.cancel("late", c.now)
    out = c.step(100.0)
    assert c.assigns(out) == [] and c.s.delayed == 0
    (final,) = [b for b in c.finals(out)] or [c.s.done["late"].final]
    assert final["state"] == "cancelled"


def test_a_delayed_task_counts_against_the_queue_bound() -> None:
    from meshant.errors import QueueFull

    c = Sched(max_queue=2)
    c.submit("a", not_before=50.0)
    c.submit("b", not_before=50.0)
    with pytest.raises(QueueFull):
        c.submit("c")


# -- the queen core -----------------------------------------------------------------------


def test_bad_delays_are_refused_and_nothing_is_journaled(tmp_path: Path) -> None:
    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j, journal_defer=0)
    try:
        c = sim.client()
        for body, says in (({"after": -5}, "'after' is seconds"),
                           ({"at": "noon"}, "field 'at' has the wrong type"),
                           ({"at": 2e9, "after": 1}, "not both"),
                           ({"at": 1e12}, "not milliseconds")):
            c.send("task.submit", {"capability": "echo", **body})
            err = c.one("error").b
            assert err["code"] in ("bad-value", "bad-type") and says in err["message"], err
        assert j.tasks(limit=10) == []
    finally:
        j.close()


def test_a_delay_is_journaled_and_kept_by_a_restarted_queen(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    j = Journal(db)
    sim = InMemoryColony(journal=j)  # (a delayed task is written at once: no defer)
    c = sim.client()
    f = sim.forager("f", slots=1)
    sub = c.send("task.submit", {"capability": "echo", "payload": 1, "after": 10.0})
    sim.advance(0.01)
    assert sim.assigns(f) == []
    (row,) = j.tasks(limit=10)
    assert row["state"] == "delayed" and row["not_before"] is not None
    c.send("task.status", {"task": sub.id})
    st = c.one("task.state").b
    assert st["state"] == "delayed" and st["not_before"] == row["not_before"]
    assert sim.core.status(sim.now)["delayed"] == 1
    assert sim.core.status(sim.now)["queued"] == 0
    j.close()
    # A new queen on the journal (its clocks start where the first's did): the task
    # waits out its delay on the wall clock, as journaled.
    j2 = Journal(db)
    sim2 = InMemoryColony(journal=j2)
    try:
        assert sim2.core.restored == 1
        f2 = sim2.forager("f", slots=1)
        sim2.advance(5.0)
        assert sim2.assigns(f2) == []
        wall = sim2.now + sim2.queen.wall_offset
        sim2.advance(row["not_before"] - wall - 0.1)
        assert sim2.assigns(f2) == []  # (not a tick early)
        sim2.advance(0.5)  # (the queen ticks every 0.1 s)
        (a,) = sim2.assigns(f2)
        assert a["task"] == sub.id
    finally:
        j2.close()


# -- over real sockets ------------------------------------------------------------------


def test_submit_after_and_at_over_loopback(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": lambda x: x})
    c = colony.client()
    t0 = time.time()
    fut = c.submit("echo", "later", after=0.3, ack=True)
    assert fut.result(timeout=10) == "later"
    st = c.task_status(fut.task_id)
    states = [s for _, s, _ in st["history"]]
    assert states[:2] == ["delayed", "queued"]
    # Never early: its release is no sooner than its delay after it was submitted.
    released = next(t for t, s, _ in st["history"] if s == "queued")
    assert released >= 0.3 - 1e-3 and time.time() - t0 >= 0.3
    assert c.submit("echo", "at", at=time.time() + 0.2).result(timeout=10) == "at"
    # Cancelled while it waits.
    late = c.submit("echo", "never", after="1h", ack=True)
    wait_for(lambda: late.acknowledged, what="the delayed task's ack")
    assert c.task_status(late.task_id)["state"] == "delayed"
    assert c.status()["delayed"] == 1
    assert c.cancel(late.task_id) == "cancelled"
    with pytest.raises(BadInput, match="duration"):
        c.submit("echo", 1, after="soon")
    with pytest.raises(BadInput, match="not both"):
        c.submit("echo", 1, after=1, at=time.time())


# -- the command line -------------------------------------------------------------------


@pytest.mark.slow
def test_cli_submit_in_at_status_and_cancel(procs: Procs, tmp_path: Path) -> None:
    _, ep = procs.queen("--journal", str(tmp_path / "q.db"))
    r = meshant("submit", "--queen", ep, "echo", '"x"', "--in", "1h", "--no-wait", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["state"] == "delayed" and rec["not_before"] > time.time() + 3000
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
    r = meshant("submit", "--queen", ep, "echo", '"y"', "--at", soon, "--no-wait")
    assert r.returncode == 0 and " delayed until " in r.stdout, r.stdout
    st = json.loads(meshant("status", "--queen", ep, "--json").stdout)
    assert st["delayed"] == 2 and st["queued"] == 0
    assert "2 delayed" in meshant("status", "--queen", ep).stdout
    listed = meshant("tasks", "--queen", ep, "--state", "delayed", "--json").stdout
    assert {json.loads(x)["id"] for x in listed.splitlines()} >= {rec["task"]}
    assert "delayed until" in meshant("task", "--queen", ep, rec["task"]).stdout
    r = meshant("cancel", "--queen", ep, rec["task"])
    assert r.returncode == 0, r.stderr
    for args, says in ((["--in", "5x"], "is not a duration"),
                       (["--at", "noon"], "is not an ISO-8601 time"),
                       (["--in", "5m", "--at", "2099-01-01T00:00Z"], "not both")):
        r = meshant("submit", "--queen", ep, "echo", "1", *args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    st = json.loads(meshant("status", "--queen", ep, "--json").stdout)
    assert st["delayed"] == 1  # the cancelled one gone, no bad one journaled
