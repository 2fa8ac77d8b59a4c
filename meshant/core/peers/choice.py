"""Which queen a peer says hello to: the next of several endpoints (a leader and its
standbys), the leader a standby names, or where discovery says the queen moved.
Sans-IO: the link asks before each hello; the driver opens the connection it names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _as_is(endpoint: str) -> str:
    return endpoint


class QueenChoice:
    """The queen's endpoint as this peer knows it (``queen``), and where to go next.

    ``queens``: the endpoints it was given, in order (empty: found by discovery);
    ``check``: turns a standby's hint into an endpoint, or raises ValueError for one
    that is not (a hint names an endpoint this peer cannot dial)."""

    def __init__(self, queens: list[str], *, follow_leader: bool = True,
                 check: Callable[[str], str] = _as_is) -> None:
        self.queens = queens
        self.queen = queens[0] if queens else ""
        self.follow_leader = follow_leader
        self.check = check
        self.connected_to = ""  # where the current connection goes
        self.unanswered = False  # the last hello got no answer (yet)
        self.error_body: dict[str, Any] = {}  # the queen's last error
        self._qi = 0  # the index in ``queens`` of the endpoint last tried from the list

    def next_queen(self, leader: str) -> bool:
        """Go to ``leader`` (a standby's hint: one attempt), else back to the list of
        endpoints, to the one after the last tried (after the standby that gave a hint
        that led nowhere, so a leader that is in the list is always reached). True if
        the next hello goes somewhere new."""
        if leader and leader != self.queen:
            try:
                self.queen = self.check(leader)
            except ValueError:
                leader = ""
        else:
            leader = ""
        if not leader and self.queens and (len(self.queens) > 1
                                           or self.queen not in self.queens):
            self._qi = (self._qi + 1) % len(self.queens)
            self.queen = self.queens[self._qi]
        return self.queen != self.connected_to

    def redirect(self, leader: str) -> bool:
        """A standby answered: go to ``leader`` (or the next endpoint). False when this
        peer does not follow leaders: the standby's answer is then a refusal."""
        self.unanswered = False
        if not self.follow_leader:
            return False
        self.next_queen(leader)
        return True

    def before_hello(self, fresh: bool, moved: str | None = None) -> str | None:
        """Where the next hello goes: where discovery says the queen moved (``moved``),
        else the next endpoint if the last hello got no answer. Returns why to open a
        fresh connection ("moved"; "fresh": asked for one or the endpoint changed), or
        None (the current connection will do)."""
        if moved is not None and moved != self.queen:
            self.queen = moved
            return "moved"
        if self.unanswered and (len(self.queens) > 1 or (
                self.queens and self.queen not in self.queens)):
            self.next_queen("")  # no answer there: the next one
        return "fresh" if fresh or self.connected_to != self.queen else None

    def connected(self) -> None:
        """A connection to ``queen`` was opened."""
        self.connected_to = self.queen


__all__ = ["QueenChoice"]
