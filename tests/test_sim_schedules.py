"""The simulator's invariants for schedules (#32.4), each proven by a mutant it catches
within a bound: one task per tick across crashes and failovers, never before its time,
overlap 'skip' honoured, catch-up 'all' losing no tick. A mutant is a patch applied
here, never a switch in the package."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from meshant.core.queen import carry, outbox
from meshant.core.schedules import book as book_mod
from meshant.core.schedules import model
from meshant.sim.run import run_seed
from meshant.sim.weather import DEFAULT, PROFILES

from .test_sim_limits import _caught

SCHEDULES = dataclasses.replace(DEFAULT, schedules=1.0)
CRASHES = SCHEDULES.only("kill-queen", "crash-mid-turn", "crash-at-commit", "pause-queen",
                         faults=(1, 4))


def test_schedules_keep_their_promises_through_crashes_and_failovers() -> None:
    for profile in (SCHEDULES, CRASHES, dataclasses.replace(CRASHES, failover=1.0)):
        failures = [(s, r.violation) for s in range(25)
                    if (r := run_seed(s, profile=profile)).violation]
        assert failures == []


@pytest.mark.slow
def test_an_hour_of_ticks_each_minute_one_task_per_tick_through_every_fault() -> None:
    # (#32's target: one task per schedule per tick over an hour of virtual time.)
    hour = PROFILES["hour"]
    lives = 0
    for seed in range(8):
        r = run_seed(seed, profile=hour)
        assert r.violation is None, (seed, r.violation)
        lives += sum(" starts " in t for t in r.trace)
    assert lives > 16  # (queens did restart, and take over, in these hours)


@pytest.mark.slow
def test_mutant_a_ticks_cursor_is_not_journaled(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    # Only what a person changes (add, pause, resume) is journaled: the cursor its ticks
    # move is not, so a restarted queen (or the standby) fires again each tick since.
    real = book_mod.ScheduleBook.tick

    def tick(self: Any, wall: float, fire: Any, live: Any) -> None:
        before = dict(self.changed)
        real(self, wall, fire, live)
        self.changed = before
    monkeypatch.setattr(book_mod.ScheduleBook, "tick", tick)
    _caught(CRASHES, 60, "schedule-cursor")


@pytest.mark.slow
def test_mutant_a_tick_fires_early(monkeypatch: pytest.MonkeyPatch) -> None:
    # The book takes the clock for half a second later than it is (its heap's look too).
    real_tick, real_soonest = book_mod.ScheduleBook.tick, book_mod.ScheduleBook.soonest
    monkeypatch.setattr(book_mod.ScheduleBook, "tick",
                        lambda self, wall, fire, live: real_tick(self, wall + 0.5, fire, live))
    monkeypatch.setattr(book_mod.ScheduleBook, "soonest", lambda self: real_soonest(self) - 0.5)
    _caught(SCHEDULES, 20, "schedule-not-early")


@pytest.mark.slow
def test_mutant_overlap_skip_fires_while_the_last_task_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = book_mod.ScheduleBook._handle

    def _handle(self: Any, s: Any, tick: float, fire: Any, live: Any) -> None:
        real(self, s, tick, fire, (lambda task_id: False) if s.overlap == "skip" else live)
    monkeypatch.setattr(book_mod.ScheduleBook, "_handle", _handle)
    _caught(SCHEDULES, 40, "schedule-overlap")


@pytest.mark.slow
def test_mutant_catch_up_all_drops_the_missed_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    real = model.due

    def due(s: Any, wall: float, grace: float) -> Any:
        if s.catch_up == "all":
            s = dataclasses.replace(s, catch_up="none")
        return real(s, wall, grace)
    monkeypatch.setattr(book_mod, "due", due)
    _caught(CRASHES, 150, "schedule-every-tick")


@pytest.mark.slow
def test_mutant_a_ticks_task_and_its_cursor_are_two_transactions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The schedules' rows in a commit of their own, after the turn's task rows: a crash
    # between the two leaves a tick's task with the cursor before it (the tick's key
    # alone then keeps the restarted queen from firing it twice).
    real = outbox.grouped

    def grouped(actions: list[Any]) -> list[Any]:
        out: list[Any] = []
        for a in real(actions):
            if isinstance(a, outbox.Commit) and len(a.actions) > 1 and any(
                    isinstance(x, outbox.ScheduleRecord) for x in a.actions):
                out.extend(outbox.Commit([x]) for x in a.actions)
            else:
                out.append(a)
        return out
    monkeypatch.setattr(carry, "grouped", grouped)  # (what carries a turn's actions out)
    _caught(CRASHES, 20, "schedule-cursor")

