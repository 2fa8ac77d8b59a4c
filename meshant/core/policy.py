"""Retry and circuit-breaking policy, sans-IO: time and randomness are passed in.

* Backoff: exponential with full jitter and a cap — a retry waits a random time in
  ``[0, min(cap, base * 2**n)]``, so failing work never hammers a service in lock-step.
* Breaker: after ``threshold`` consecutive failures it opens (nothing is sent through);
  after ``cooldown`` it is half-open and lets one trial through; a success closes it,
  a failure opens it again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def ceiling(self, retry: int, base: float | None = None, cap: float | None = None) -> float:
        """The longest wait before retry number ``retry`` (0 for the first retry).
        ``base`` and ``cap`` override this policy's (a task's own retry policy)."""
        ceiling: float = min(self.cap if cap is None else cap,
                             (self.base if base is None else base) * 2 ** retry)
        return ceiling

    def delay(self, retry: int, base: float | None = None, cap: float | None = None) -> float:
        """A random wait in ``[0, ceiling(retry, base, cap)]`` (full jitter)."""
        return self.rng.uniform(0.0, self.ceiling(retry, base, cap))


@dataclass
class Breaker:
    threshold: int = 5
    cooldown: float = 30.0
    state: str = CLOSED
    failures: int = 0
    opened_at: float = 0.0
    trial: bool = False  # a half-open trial is under way

    def allow(self, now: float) -> bool:
        """May work go through now? (A half-open breaker lets exactly one trial pass.)"""
        if self.state == CLOSED:
            return True
        if self.state == OPEN and now - self.opened_at >= self.cooldown:
            self.state = HALF_OPEN
            self.trial = False
        return self.state == HALF_OPEN and not self.trial

    def started(self) -> None:
        """Work was sent through: in half-open, that is the trial."""
        if self.state == HALF_OPEN:
            self.trial = True

    def success(self) -> None:
        self.state = CLOSED
        self.failures = 0
        self.trial = False

    def failure(self, now: float) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or self.failures >= self.threshold:
            self.state = OPEN
            self.opened_at = now
            self.trial = False
