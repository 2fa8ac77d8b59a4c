"""Backoff and circuit breaker with an injected clock and seeded randomness."""

from __future__ import annotations

import random

from meshant.core.policy import CLOSED, HALF_OPEN, OPEN, Backoff, Breaker


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(7))
    assert [b.ceiling(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for n in range(8):
        delays = [b.delay(n) for _ in range(200)]
        assert all(0.0 <= d <= b.ceiling(n) for d in delays)
        assert max(delays) > 0.8 * b.ceiling(n)  # full jitter spreads over the range
        assert min(delays) < 0.2 * b.ceiling(n)
    again = Backoff(base=0.5, cap=4.0, rng=random.Random(7))
    assert again.delay(0) == Backoff(base=0.5, cap=4.0, rng=random.Random(7)).delay(0)


def test_breaker_opens_half_opens_and_closes() -> None:
    br = Breaker(threshold=3, cooldown=10.0)
    for t in range(2):
        br.failure(float(t))
    assert br.state == CLOSED and br.allow(2.0)
    br.failure(2.0)
    assert br.state == OPEN and not br.allow(5.0)
    assert br.allow(12.0) and br.state == HALF_OPEN  # one trial after the cool-down
    br.started()
    assert not br.allow(12.5)  # only one
    br.failure(13.0)
    assert br.state == OPEN and not br.allow(20.0)
    assert br.allow(23.0)
    br.started()
    br.success()
    assert br.state == CLOSED and br.failures == 0 and br.allow(23.1)


def test_a_success_resets_the_count() -> None:
    br = Breaker(threshold=2, cooldown=1.0)
    br.failure(0.0)
    br.success()
    br.failure(1.0)
    assert br.state == CLOSED
