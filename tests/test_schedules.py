"""Schedules (#32.4): the rules (core/schedules/model.py), the book that fires them
(book.py), the queen core's messages and journal, then real processes: the command
line, a queen killed and restarted, a PostgreSQL failover."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from meshant import AsyncClient, Client
from meshant.core.schedules import model
from meshant.core.schedules.book import ScheduleBook
from meshant.core.schedules.model import Schedule
from meshant.errors import BadInput
from meshant.storage import open_journal
from meshant.storage.journal import Journal

from .conftest import Colony, Procs, wait_for
from .inmemory import InMemoryColony
from .test_cli import meshant


def _wall(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# -- the rules ----------------------------------------------------------------------------


def test_ticks_follow_cron_in_a_time_zone_daylight_saving_included() -> None:
    t0 = _wall("2026-12-03T06:00:30+00:00")
    assert model.next_tick("*/15 * * * *", "UTC", t0) == _wall("2026-12-03T06:15:00+00:00")
    assert model.next_tick("*/15 * * * *", "UTC", _wall("2026-12-03T06:15:00+00:00")) == \
        _wall("2026-12-03T06:30:00+00:00")  # (strictly after)
    assert model.next_tick("*/10 * * * * *", "UTC", t0) == t0 + 10  # (6 fields: seconds first)
    assert model.latest_tick("*/15 * * * *", "UTC", _wall("2026-12-03T06:15:00+00:00")) == \
        _wall("2026-12-03T06:15:00+00:00")  # (at or before)
    # 02:30 does not exist in Riga on 29 March 2026 (clocks go 03:00 -> 04:00 there at
    # 03:00): cron's rule, as Debian's cron has it, fires it when the clock jumps.
    riga = model.next_tick("30 3 * * *", "Europe/Riga", _wall("2026-03-28T12:00:00+02:00"))
    assert datetime.fromtimestamp(riga, UTC) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    # 03:30 happens twice there on 25 October (clocks go back at 04:00): it fires once.
    once = model.next_tick("30 3 * * *", "Europe/Riga", _wall("2026-10-24T12:00:00+00:00"))
    assert model.next_tick("30 3 * * *", "Europe/Riga", once) - once == 86400 + 3600
    assert model.next_tick("0 9 * * *", "America/New_York", _wall(
        "2026-07-01T00:00:00+00:00")) == _wall("2026-07-01T09:00:00-04:00")


def test_what_a_schedule_may_say() -> None:
    good = {"name": "nightly", "cron": "0 3 * * *", "capability": "report"}
    assert model.spec_problem(good, 1.8e9) is None
    for change, says in (({"cron": "61 * * * *"}, "not a cron expression (Bad minute)"),
                         ({"cron": "* * *"}, "Wrong number of fields"),
                         ({"cron": 5}, "5 fields"),
                         ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
                         ({"tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
                         ({"tz": "../../etc/passwd"}, "unknown time zone"),
                         ({"name": "a b"}, "a schedule's name"),
                         ({"name": ""}, "a schedule's name"),
                         ({"capability": ""}, "names the capability"),
                         ({"overlap": "sometimes"}, "overlap is one of skip, queue, allow"),
                         ({"catch_up": "yes"}, "catch_up is one of none, latest, all"),
                         ({"options": {"at": 5}}, "'at' is not a task option"),
                         ({"options": {"priority": "high"}}, "option priority must be int"),
                         ({"options": {"priority": True}}, "option priority must be int")):
        problem = model.spec_problem({**good, **change}, 1.8e9)
        assert problem is not None and says in problem, (change, problem)


def _sched(cron: str = "* * * * *", *, at: float = 0.0, **kw: Any) -> Schedule:
    return model.new({"name": "s", "cron": cron, "capability": "c", **kw}, at, "me")


def test_catch_up_decides_what_a_gap_fires() -> None:
    t0 = _wall("2026-12-03T06:00:00+00:00")
    for policy, fired, skipped in (("all", 10, 0), ("latest", 1, 9), ("none", 0, 10)):
        s = _sched(at=t0 - 1, catch_up=policy)  # next tick: 06:00
        # The queen looks at 06:09:30: 06:00...06:09 passed, all more than 10 s ago.
        ticks, skip, cursor = model.due(s, t0 + 9 * 60 + 30)
        assert (len(ticks), skip) == (fired, skipped), policy
        assert cursor == t0 + 9 * 60
        if policy == "latest":
            assert ticks == [t0 + 9 * 60]
    # A tick late by less than the grace is late, not missed: it fires under every policy.
    s = _sched(at=t0 - 1, catch_up="none")
    assert model.due(s, t0 + 5)[0] == [t0]
    # A per-second cron and a day down: 'all' fires the oldest MAX_CATCH_UP missed ticks
    # and the late ones (within the grace); the rest are counted, not walked.
    s = _sched("* * * * * *", at=t0, catch_up="all")
    ticks, skip, cursor = model.due(s, t0 + 86400)
    assert ticks == [t0 + i for i in range(1, model.MAX_CATCH_UP + 1)] + \
        [t0 + i for i in range(86390, 86401)]
    assert cursor == t0 + 86400 and skip == 86389 - model.MAX_CATCH_UP
    for policy, fired in (("none", 11), ("latest", 11)):
        s = _sched("* * * * * *", at=t0, catch_up=policy)
        ticks, skip, cursor = model.due(s, t0 + 86400)
        assert (len(ticks), skip, cursor) == (fired, 86389, t0 + 86400), policy
    # Per minute, a day down: 'latest' fires the newest missed tick; the count of the
    # skipped is exact for a regular cron (from the walked ticks' spacing).
    s = _sched(at=t0 - 1, catch_up="latest")
    ticks, skip, cursor = model.due(s, t0 + 86400 + 30)
    assert ticks == [t0 + 86400] and skip == 1440 and cursor == t0 + 86400
    # An irregular cron (weekdays at 9), a year down: the newest missed weekday 09:00.
    s = _sched("0 9 * * MON-FRI", at=t0, catch_up="latest")
    ticks, skip, cursor = model.due(s, t0 + 365 * 86400)
    assert ticks == [cursor] and datetime.fromtimestamp(cursor, UTC).weekday() < 5
    assert cursor == model.latest_tick("0 9 * * MON-FRI", "UTC", t0 + 365 * 86400)
    assert 255 <= skip <= 265
    # A grace wider than MAX_LOOK late ticks: the rest are skipped, the cursor is the newest.
    s = _sched("* * * * * *", at=t0, catch_up="none")
    ticks, skip, cursor = model.due(s, t0 + 20_000, grace=50_000)
    assert len(ticks) == model.MAX_LOOK and skip == 10_000 and cursor == t0 + 20_000


class _Tasks:
    """What a firing does, for the book's tests: tasks by id, live until ended."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.keys: list[str] = []

    def fire(self, s: Schedule, tick: float, key: str) -> str:
        task = f"t{len(self.keys)}"
        self.keys.append(key)
        self.live.add(task)
        return task

    def end_all(self, book: ScheduleBook) -> None:
        """Every task ends (and the book hears of it, as the scheduler's hook tells it)."""
        for task in self.live:
            book.task_ended(task)
        self.live.clear()


def test_overlap_skip_queue_and_allow() -> None:
    t0 = _wall("2026-12-03T06:00:00+00:00")
    for overlap, after_three, after_end in (("skip", 1, 1), ("queue", 1, 2),
                                            ("allow", 3, 3)):
        book, tasks = ScheduleBook(), _Tasks()
        book.add(_sched("* * * * * *", at=t0 - 0.5, overlap=overlap))
        for i in range(3):
            book.tick(t0 + i, tasks.fire, tasks.live.__contains__)
        assert len(tasks.keys) == after_three, overlap
        tasks.end_all(book)
        book.tick(t0 + 2.5, tasks.fire, tasks.live.__contains__)
        assert len(tasks.keys) == after_end, overlap
        s = book.schedules["s"]
        assert s.fired + s.skipped + len(s.queued) == 3
        assert tasks.keys[0] == f"schedule:s:{model.stamp(t0)}"


def test_pause_resume_and_the_heap_between_ticks() -> None:
    t0 = _wall("2026-12-03T06:00:00+00:00")
    book, tasks = ScheduleBook(), _Tasks()
    book.add(_sched(at=t0 - 1))
    assert book.soonest() == t0
    book.pause(book.schedules["s"])
    assert book.soonest() == math.inf
    book.tick(t0 + 300, tasks.fire, tasks.live.__contains__)
    assert tasks.keys == []
    book.resume(book.schedules["s"], t0 + 300)  # from now: the paused ticks never fire
    assert book.soonest() == t0 + 360
    book.tick(t0 + 360, tasks.fire, tasks.live.__contains__)
    assert tasks.keys == [f"schedule:s:{model.stamp(t0 + 360)}"]
    book.remove("s")
    assert book.soonest() == math.inf and book.take_changes() == []  # (no journal)
    # Pause and resume over and over between two ticks: the heap stays bounded.
    book.add(_sched(at=t0 + 360))
    for _ in range(1000):
        book.pause(book.schedules["s"])
        book.resume(book.schedules["s"], t0 + 361)
    assert len(book._heap) <= 2 * len(book) + 65 and book.soonest() == t0 + 420


def test_queued_ticks_wait_for_the_running_task_not_a_poll() -> None:
    # Overlap 'queue': a waiting schedule is looked at again only when the task it waits
    # for ends (the book is told), not at every turn; a refused firing keeps its reason.
    t0 = _wall("2026-12-03T06:00:00+00:00")
    book, tasks = ScheduleBook(), _Tasks()
    watched: list[str] = []
    book.on_block = watched.append
    looked: list[str] = []

    def live(task: str) -> bool:
        looked.append(task)
        return task in tasks.live

    book.add(_sched("* * * * * *", at=t0 - 0.5, overlap="queue"))
    for i in range(4):
        book.tick(t0 + i, tasks.fire, live)
    s = book.schedules["s"]
    assert (s.fired, len(s.queued), watched) == (1, 3, ["t0"])
    looked.clear()
    for _ in range(100):
        book.tick(t0 + 3.5, tasks.fire, live)  # (turns with nothing due: no look)
    assert looked == [] and not book.ready
    tasks.end_all(book)
    book.tick(t0 + 3.6, tasks.fire, live)
    assert (s.fired, len(s.queued), watched) == (2, 2, ["t0", "t1"])

    def refuse(s: Schedule, tick: float, key: str) -> None:
        s.refused += 1
        s.last_refusal = f"{model.stamp(tick)}: queue full: 100 tasks queued"

    tasks.end_all(book)
    book.tick(t0 + 3.7, refuse, live)
    assert (s.fired, s.refused, len(s.queued)) == (2, 1, 1) and book.ready
    assert "queue full" in (s.last_refusal or "") and s.view()["refused"] == 1


# -- the queen core: messages and journal -----------------------------------------------


def _add(c: Any, **body: Any) -> Any:
    c.send("schedule", {"op": "add", "name": "s", "cron": "* * * * * *",
                        "capability": "echo", **body})
    return c


def test_a_schedule_fires_once_a_tick_and_a_restarted_queen_carries_on(
        tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    j = Journal(db)
    sim = InMemoryColony(journal=j)
    c = sim.client()
    _add(c, payload={"n": 1}, catch_up="all", overlap="allow")
    sim.advance(0.01)
    s = c.one("schedule.reply").b["schedule"]
    assert s["name"] == "s" and s["next"] > s["created"]
    f = sim.forager("f", slots=4)
    sim.advance(3.0)
    got = [a["payload"] for a in sim.assigns(f)]
    assert 2 <= len(got) <= 4 and all(p == {"n": 1} for p in got)
    st = sim.core.status(sim.now)
    assert st["schedules"] == 1 and st["next_schedules"][0]["name"] == "s"
    keys = [r["idem_key"] for r in j.tasks(limit=100)]
    assert len(keys) == len(set(keys)) == len(got)
    j.close()
    # A new queen on the journal (its clocks start where the first's did, so it starts
    # behind the cursor): it fires the ticks after the cursor, once each, and none of
    # those the first one fired.
    j2 = Journal(db)
    sim2 = InMemoryColony(journal=j2)
    try:
        sim2.forager("f", slots=8)
        sim2.advance(6.0)
        keys2 = [r["idem_key"] for r in j2.tasks(limit=200)]
        assert len(keys2) == len(set(keys2)) and set(keys) < set(keys2)
        ticks = sorted(_wall(k.split(":", 2)[2].replace("Z", "+00:00")) for k in keys2)
        assert ticks == [ticks[0] + i for i in range(len(ticks))]  # none lost between
        c2 = sim2.client()
        c2.send("schedule", {"op": "list"})
        (item,) = c2.one("schedule.reply").b["items"]
        assert item["fired"] == len(keys2)
    finally:
        j2.close()


def test_bad_schedules_are_refused_and_nothing_is_journaled(tmp_path: Path) -> None:
    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j, limits=("echo:payload.tenant=2",))
    try:
        c = sim.client()
        for body, code, says in (
                ({"cron": "61 * * * *"}, "bad-value", "Bad minute"),
                ({"tz": "Nowhere/City"}, "bad-value", "unknown time zone"),
                ({"overlap": "x"}, "bad-value", "overlap is one of"),
                ({"cron": 7}, "bad-type", "'cron' has the wrong type"),
                ({"options": {"key": "k"}}, "bad-value", "'key' is not a task option"),
                ({"payload": {"no": "tenant"}}, "bad-value", "tenant")):
            _add(c, **body)
            err = c.one("error").b
            assert err["code"] == code and says in err["message"], (body, err)
        c.send("schedule", {"op": "pause", "name": "nope"})
        assert c.one("error").b["code"] == "unknown-schedule"
        c.send("schedule", {"op": "explode", "name": "s"})
        assert "schedule op is one of" in c.one("error").b["message"]
        sim.advance(0.01)
        assert j.schedules() == []
        _add(c, payload={"tenant": "a"})
        c.one("schedule.reply")
        _add(c, payload={"tenant": "a"})
        assert c.one("error").b["code"] == "schedule-exists"
        sim.advance(0.01)
        assert [r["name"] for r in j.schedules()] == ["s"]
    finally:
        j.close()


# -- over real sockets: the API, the command line -----------------------------------------


def test_the_python_api_over_loopback(colony: Colony) -> None:
    colony.start_queen()
    seen: list[Any] = []
    colony.forager({"echo": lambda x: seen.append(x) or x})
    c = colony.client()
    s = c.add_schedule("fast", "* * * * * *", "echo", {"k": 1}, overlap="allow", priority=10,
                       timeout=30)
    assert s["options"] == {"priority": 10, "timeout": 30} and s["next"] <= time.time() + 1.01
    wait_for(lambda: len(seen) >= 2, 10, what="two ticks run")
    assert seen[0] == {"k": 1}
    with pytest.raises(BadInput, match="unknown time zone"):
        c.add_schedule("x", "* * * * *", "echo", tz="Atlantis/Capital")
    with pytest.raises(BadInput, match="exists"):
        c.add_schedule("fast", "* * * * *", "echo")
    assert c.add_schedule("fast", "0 0 1 1 *", "echo", replace=True)["cron"] == "0 0 1 1 *"

    async def from_asyncio() -> list[dict[str, Any]]:
        async with AsyncClient(colony.endpoint, context=colony.ctx) as ac:
            await ac.add_schedule("later", "0 * * * *", "echo", tz="Europe/Paris")
            await ac.schedule("pause", "later")
            return await ac.schedules()
    items = asyncio.run(from_asyncio())
    assert [(x["name"], x["paused"]) for x in items] == [("fast", False), ("later", True)]
    assert c.schedule("remove", "later")["schedule"]["name"] == "later"
    assert [x["name"] for x in c.schedules()] == ["fast"]


@pytest.mark.slow
def test_cli_schedules_a_task_kill_the_queen_and_each_tick_runs_once(
        procs: Procs, tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    q, ep = procs.queen("--journal", str(db))
    procs.forager(ep, "--slots", "4")
    r = meshant("schedule", "add", "--queen", ep, "every2", "*/2 * * * * *", "echo",
                '{"hi": 1}', "--catch-up", "all", "--overlap", "allow", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["next"] > time.time()
    for args, says in ((["bad", "61 * * * *", "echo"], "Bad minute"),
                       (["bad", "* * * * *", "echo", "--tz", "Mars/Base"],
                        "unknown time zone"),
                       (["bad", "* * * * *", "echo", "--overlap", "maybe"], "'maybe' is not"),
                       (["every2", "* * * * *", "echo"], "exists")):
        r = meshant("schedule", "add", "--queen", ep, *args)
        assert r.returncode in (1, 2) and says in r.stderr and "Traceback" not in r.stderr, \
            r.stderr
    with Client(ep) as c:
        wait_for(lambda: c.schedules()[0]["fired"] >= 2, 20, what="two ticks")
        with pytest.raises(BadInput, match="no schedule named 'nope'"):
            c.schedule("pause", "nope")
    listed = meshant("schedule", "list", "--queen", ep)
    assert listed.returncode == 0 and "every2" in listed.stdout and "next" in listed.stdout
    shown = meshant("schedule", "show", "--queen", ep, "every2", "--json")
    line = json.loads(meshant("schedule", "list", "--queen", ep, "--json").stdout)
    assert set(json.loads(shown.stdout)) == set(line) and line["name"] == "every2"
    assert "schedules: 1 (next: every2 at" in meshant("status", "--queen", ep).stdout
    q.send_signal(signal.SIGKILL)
    q.wait(10)
    time.sleep(4.5)  # (the queen is down: ticks pass unfired, to be caught up)
    _, ep = procs.queen("--journal", str(db), "--bind", ep)
    with Client(ep) as c:
        wait_for(lambda: c.schedules()[0]["fired"] >= 6, 30, what="ticks caught up")
        trig = c.schedule("trigger", "every2")["task"]
        assert trig.startswith("every2.")
        assert c.schedule("pause", "every2")["schedule"]["paused"] is True
        fired = c.schedules()[0]["fired"]
    r = meshant("schedule", "remove", "--queen", ep, "every2")
    assert r.returncode == 0 and "removed" in r.stderr
    db_ = sqlite3.connect(db)
    rows = db_.execute("SELECT idem_key, created FROM tasks WHERE idem_key LIKE "
                       "'schedule:every2:2%'").fetchall()
    db_.close()
    ticks = sorted(_wall(k.split(":", 2)[2].replace("Z", "+00:00")) for k, _ in rows)
    assert len(ticks) == len(set(ticks)) == fired - 1  # (the trigger's key is its own)
    assert ticks == [ticks[0] + 2 * i for i in range(len(ticks))]  # none lost, none twice
    assert all(created >= _wall(k.split(":", 2)[2].replace("Z", "+00:00")) - 0.01
               for k, created in rows)  # none early


@pytest.mark.slow
def test_one_task_per_tick_across_a_postgresql_failover(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    from .test_failover import LEASE, Pair

    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    procs.forager(pair.both, "--name", "f0", "--slots", "8")
    with Client(pair.both, queen_wait=60) as c:
        c.add_schedule("tick", "* * * * * *", "echo", {"x": 1}, catch_up="all",
                       overlap="allow")
        wait_for(lambda: c.schedules()[0]["fired"] >= 3, 20, what="ticks on qa")
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        wait_for(lambda: pair.leads("qb"), timeout=LEASE + 10, what="qb to lead")
        # (The first request after the takeover waits for the client to find qb.)
        first = c.schedules(timeout=LEASE + 10)[0]["fired"]
        wait_for(lambda: c.schedules(timeout=10)[0]["fired"] >= first + 3, 30,
                 what="ticks on qb")
        c.schedule("remove", "tick")
    j = open_journal(pg_url, readonly=True)
    try:
        rows = [r for r in j.tasks(limit=1000) if (r["idem_key"] or "").startswith(
            "schedule:tick:")]
    finally:
        j.close()
    ticks = sorted(_wall(r["idem_key"].split(":", 2)[2].replace("Z", "+00:00")) for r in rows)
    assert len(ticks) == len(set(ticks))  # one task per tick
    assert ticks == [ticks[0] + i for i in range(len(ticks))]  # caught up: none lost


@pytest.mark.slow
def test_requests_in_flight_when_the_queen_dies_are_asked_again_or_fail_as_queen_lost(
        procs: Procs, tmp_path: Path) -> None:
    # From an outsider's failover run: a trigger in flight when its queen died came back
    # as a plain Timeout ("no answer within 10 s", after 5 s) instead of the queen-lost
    # failure its session decided; a list in flight must be answered by the next queen.
    import threading

    from meshant.errors import QueenUnreachable

    db = tmp_path / "q.db"
    q, ep = procs.queen("--journal", str(db))
    with Client(ep) as c:
        c.add_schedule("later", "0 0 1 1 *", "echo")
        q.send_signal(signal.SIGSTOP)  # (what it is sent now, it never answers)
        got: dict[str, Any] = {}

        def call(name: str, fn: Any) -> None:
            t0 = time.monotonic()
            try:
                got[name] = fn()
            except Exception as e:  # (the outcome under test)
                got[name] = e
            got[name + "_s"] = time.monotonic() - t0
        threads = [threading.Thread(target=call, args=(n, f)) for n, f in (
            ("trigger", lambda: c.schedule("trigger", "later", timeout=30)),
            ("list", lambda: c.schedules(timeout=30)))]
        for t in threads:
            t.start()
        wait_for(lambda: len(c._cs.requests) == 2 and not c._cs.outbox, 10,
                 what="both requests sent")
        q.send_signal(signal.SIGKILL)
        q.wait(10)
        procs.queen("--journal", str(db), "--bind", ep)
        for t in threads:
            t.join(40)
    err = got["trigger"]
    assert isinstance(err, QueenUnreachable) and err.code == "queen-lost", err
    assert "may have been carried out" in str(err)
    assert [s["name"] for s in got["list"]] == ["later"]
    assert got["trigger_s"] < 25 and got["list_s"] < 25  # (not their 30 s timeouts)
