"""Leadership of a colony whose queens share a journal, sans-IO: the rules a queen
follows about its own lease, and the transitions between leading and standing by.

The lease itself lives in the shared database (``meshant.storage.leadership`` keeps it on
PostgreSQL; the simulator keeps one in memory): a term, a holder, and when it ends, on
the database's clock. A queen counts itself leader only until ``lease - margin`` after
it *sent* its last successful renewal, by its own monotonic clock (:class:`LeaseHold`):
the database's end of the lease is later than that, so a leader always knows it is
deposed before a standby can take over. Its journal writes are fenced by the term
besides.

:class:`Roles` says which core a queen runs as the lease comes and goes: a leader's
(restored from the journal: :class:`TakeOver`), a standby's (:class:`StepDown`), or the
standby's hint about who leads changed (:class:`Hint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LEADER = "leader"
STANDBY = "standby"


class LeaseHold:
    """A queen's view of its own lease, on its monotonic clock."""

    __slots__ = ("lease", "margin", "role", "term", "valid_until")

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self.margin = min(0.5, lease / 5)
        self.role = STANDBY
        self.term = 0
        self.valid_until = 0.0

    def won(self, term: int, sent: float) -> None:
        """The database gave us the lease at ``term``; the request left at ``sent``. A
        grant older than the term held is stale (its answer came late) and changes
        nothing: a term never goes back."""
        if term < self.term:
            return
        self.term = term
        self.role = LEADER
        self.valid_until = sent + self.lease - self.margin

    def renewed(self, sent: float) -> None:
        """A renewal sent at ``sent`` succeeded."""
        self.valid_until = sent + self.lease - self.margin

    def valid(self, now: float) -> bool:
        """Whether this queen may act as leader now (its lease surely still holds)."""
        return self.role == LEADER and now < self.valid_until

    def lost(self, term: int | None = None) -> bool:
        """The lease is gone (another queen took it, a renewal came too late, a write
        was refused). With ``term``: only if that is still the term held. True if this
        queen was leading."""
        if self.role == LEADER and (term is None or term == self.term):
            self.role = STANDBY
            return True
        return False


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Lead: build a core restored from the journal, serving ``term``."""

    term: int


@dataclass(frozen=True, slots=True)
class StepDown:
    """Stop leading: a standby's core; peers go to the leader."""

    term: int


@dataclass(frozen=True, slots=True)
class Hint:
    """Still a standby: the leader it names to peers changed (``leader``: whatever the
    driver knows of it)."""

    term: int
    leader: Any


Transition = TakeOver | StepDown | Hint


class Roles:
    """Which core a queen runs. ``leading``: a queen without a shared journal leads from
    the start and for good."""

    __slots__ = ("core_term", "hinted", "leading")

    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.core_term = 0
        self.hinted: tuple[int, Any] = (-1, None)

    def step(self, valid: bool, term: int, leader: Any) -> Transition | None:
        """The lease as it stands now (``valid``: this queen holds it; ``term``; who
        leads): what to do, if anything."""
        if valid and self.leading and term != self.core_term:
            # Lost and taken back between two looks (a new term): what this core did
            # under the old term is fenced; start again from the journal.
            self.leading = False
            return TakeOver(term)
        if valid and not self.leading:
            return TakeOver(term)
        if not valid and self.leading:
            self.leading = False
            self.hinted = (term, leader)
            return StepDown(term)
        if not self.leading and (term, leader) != self.hinted:
            self.hinted = (term, leader)
            return Hint(term, leader)
        return None

    def took_over(self, term: int) -> None:
        """The driver built the leader's core for ``term``."""
        self.leading = True
        self.core_term = term


__all__ = ["LEADER", "STANDBY", "Hint", "LeaseHold", "Roles", "StepDown", "TakeOver",
           "Transition"]
