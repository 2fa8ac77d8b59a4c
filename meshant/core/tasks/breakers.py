"""The scheduler's circuit breakers: one per forager and one per capability (the
:class:`~meshant.core.policy.Breaker` policy), holding work back from a forager, or a
capability, that keeps failing."""

from __future__ import annotations

import math

from meshant.core.policy import OPEN, Breaker


class Breakers:
    """Breakers made on first use, with one threshold and cooldown for all."""

    __slots__ = ("capabilities", "cooldown", "due", "foragers", "threshold")

    def __init__(self, threshold: int = 5, cooldown: float = 30.0) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.foragers: dict[str, Breaker] = {}
        self.capabilities: dict[str, Breaker] = {}
        # When the next open circuit's cooldown ends: work held back may go then (a
        # trial), without waiting for other traffic to make the scheduler look again.
        self.due = math.inf

    def _of(self, table: dict[str, Breaker], key: str) -> Breaker:
        b = table.get(key)
        if b is None:
            b = table[key] = Breaker(self.threshold, self.cooldown)
        return b

    def outcome(self, forager: str, capability: str | None, ok: bool, now: float) -> None:
        """A run on ``forager`` ended well or badly; ``capability`` counts it too unless
        None (a lost forager says nothing about the capability)."""
        if ok:
            # A success on a breaker never made is one on a closed breaker without
            # failures: nothing to record (the plain path makes none, every task).
            fb = self.foragers.get(forager)
            if fb is not None:
                fb.success()
            cb = self.capabilities.get(capability) if capability is not None else None
            if cb is not None:
                cb.success()
            return
        for b in (self._of(self.foragers, forager),
                  self._of(self.capabilities, capability) if capability is not None else None):
            if b is None:
                continue
            b.failure(now)
            if b.state == OPEN:
                self.due = min(self.due, b.opened_at + b.cooldown)

    def cooled(self, now: float) -> bool:
        """True once (per cooldown) when an open circuit's cooldown has ended."""
        if now < self.due:
            return False
        ends = [b.opened_at + b.cooldown for t in (self.foragers, self.capabilities)
                for b in t.values() if b.state == OPEN and b.opened_at + b.cooldown > now]
        self.due = min(ends, default=math.inf)
        return True

    def settled(self, forager: str, capability: str | None) -> None:
        """A run ended with no outcome for the breakers (a failure that fails its task at
        once, a retry's, a task given up): if it was a half-open trial, the next work may
        be the trial instead; nothing else changes."""
        for b in (self.foragers.get(forager),
                  self.capabilities.get(capability) if capability is not None else None):
            if b is not None:
                b.trial = False

    def forager_allows(self, name: str, now: float) -> bool:
        b = self.foragers.get(name)
        return b is None or b.allow(now)

    def capability_allows(self, capability: str, now: float) -> bool:
        b = self.capabilities.get(capability)
        return b is None or b.allow(now)

    def started(self, forager: str, capability: str) -> None:
        """Work was sent through: in half-open, this assignment is the trial."""
        fb = self.foragers.get(forager)
        if fb is not None:
            fb.started()
        cb = self.capabilities.get(capability)
        if cb is not None:
            cb.started()

    def states(self) -> dict[str, dict[str, str]]:
        """Circuits that are not closed, for status."""
        return {"foragers": {k: b.state for k, b in self.foragers.items()
                             if b.state != "closed"},
                "capabilities": {k: b.state for k, b in self.capabilities.items()
                                 if b.state != "closed"}}


__all__ = ["Breakers"]
