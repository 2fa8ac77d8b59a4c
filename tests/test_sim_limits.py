"""The simulator's invariants for limits and time (#32), each proven by a mutant it
catches within a bound (as tests/test_sim.py does for the rest): a patch applied here,
never a switch in the package."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from meshant.core.tasks import delays
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
