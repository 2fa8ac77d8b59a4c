"""The simulator's invariants for limits and time (#32), each proven by a mutant it
catches within a bound (as tests/test_sim.py does for the rest): a patch applied here,
never a switch in the package."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from meshant.core.tasks import delays, limits, rates
from meshant.core.tasks import scheduler as scheduler_mod
from meshant.sim.run import Result, run_seed
from meshant.sim.weather import DEFAULT, Profile


def _caught(profile: Profile, seeds: int, invariant: str) -> tuple[int, Result]:
    for seed in range(seeds):
        r = run_seed(seed, profile=profile)
        if r.violation is not None:
            assert r.violation.invariant == invariant, r.violation
            print(f"caught by seed {seed} (of at most {seeds}): {r.violation}")  # (pytest -s)
            return seed, r
    raise AssertionError(f"the mutant survived {seeds} seeds")


DELAYS = dataclasses.replace(DEFAULT, delays=1.0)


@pytest.mark.slow
def test_mutant_a_delay_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # The queen takes a delayed submission for a plain one: it starts at once.
    monkeypatch.setattr(delays, "not_before", lambda body, wall_now: None)
    _caught(DELAYS, 20, "delay-kept")


@pytest.mark.slow
def test_mutant_a_restarted_queen_starts_delayed_tasks_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A queen that takes a delayed task back from the journal forgets when it is due.
    real = scheduler_mod.Scheduler._delay

    def _delay(self: Any, task: Any, now: float) -> None:
        if task.restored:
            self.delayed += 1
            self.timers.set(now, task, "delay")
            return
        real(self, task, now)
    monkeypatch.setattr(scheduler_mod.Scheduler, "_delay", _delay)
    _caught(DELAYS.only("kill-queen", "crash-mid-turn", "pause-queen", faults=(1, 4)), 60,
            "delay-kept")


LIMITS = dataclasses.replace(DEFAULT, limits=1.0)
# The same with queens killed, crashed and paused (their tasks taken back).
RESTARTS = LIMITS.only("kill-queen", "crash-mid-turn", "pause-queen", faults=(1, 4))


@pytest.mark.slow
def test_mutant_a_limit_lets_one_more_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # The off-by-one: a slot counts as full only past its max.
    real = limits.Limits.max_of
    monkeypatch.setattr(limits.Limits, "max_of", lambda self, slot: real(self, slot) + 1)
    real_plan = limits.Limits._plan

    def _plan(self: Any, capability: str) -> Any:
        keyed, whole = real_plan(self, capability)
        return ([(i, f, name, n + 1) for i, f, name, n in keyed],
                [(slot, n + 1) for slot, n in whole])
    monkeypatch.setattr(limits.Limits, "_plan", _plan)
    _caught(LIMITS, 20, "limit-running")


@pytest.mark.slow
def test_mutant_a_freed_token_wakes_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    # A task's end gives its token back but lets no waiting task of its key go on: the
    # key starves (until another of its tasks happens to be admitted).
    monkeypatch.setattr(limits.Limits, "_wake", lambda self, slot, out: None)
    _caught(LIMITS, 20, "limit-fair")


@pytest.mark.slow
def test_mutant_a_restarted_queen_forgets_what_runs_holds_tokens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A queen taking tasks back from the journal gives the running ones no tokens: queued
    # tasks of their keys start beside them.
    monkeypatch.setattr(limits.Limits, "hold", lambda self, task: None)
    _caught(RESTARTS, 60,
            "limit-running")


@pytest.mark.slow
def test_mutant_a_bucket_refills_twice_as_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    real = rates.Rates._bucket

    def _bucket(self: Any, slot: Any, now: float) -> Any:
        b = self.buckets.get(slot)
        if b is not None and now > b.at:
            b.at -= now - b.at  # as if twice the time had passed since its last refill
        return real(self, slot, now)
    monkeypatch.setattr(rates.Rates, "_bucket", _bucket)
    _caught(LIMITS, 40, "rate-window")


@pytest.mark.slow
def test_mutant_a_take_forgets_the_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    # A submission's cost is not what its take counts: a cost of 0.5 takes 0.25.
    real = rates.Rates.take

    def take(self: Any, task: Any, now: float) -> bool:
        cost = task.cost
        if cost is not None:
            task.cost = cost / 2
        try:
            return bool(real(self, task, now))
        finally:
            task.cost = cost
    monkeypatch.setattr(rates.Rates, "take", take)
    _caught(LIMITS, 60, "rate-window")


@pytest.mark.slow
def test_mutant_a_queen_taking_over_starts_its_buckets_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The rule before rates.resume: a restarted or taking-over queen forgets what the
    # last one let through just before, and lets a second burst through in the window
    # that holds the first (a burst of 6 at 2/s outlasts a restart).
    monkeypatch.setattr(rates.Rates, "resume", lambda self, since: None)
    _caught(RESTARTS, 40,
            "rate-takeover")
