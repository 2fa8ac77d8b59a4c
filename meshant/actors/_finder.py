"""Where the queen is: the next of several endpoints (a leader and its standbys) or the
leader a standby names; found and followed by discovery (zeroconf), with a check that a
discovered queen holds the CURVE key we pinned.

Held by a peer (:class:`meshant.actors._peer.Peer`), which opens the connections it
decides on.
"""

from __future__ import annotations

import logging
from typing import Any

from meshant.actors._endpoints import check_endpoint
from meshant.errors import ConfigError, MeshantError, QueenUnreachable, Refused
from meshant.protocol.codes import Code

log = logging.getLogger("meshant")


class QueenFinder:
    """The queen's endpoint as this peer knows it (``queen``), and where to go next."""

    def __init__(self, queens: list[str], *, name: str, colony: str | None, curve: bool,
                 queen_key: bytes | None, follow_leader: bool) -> None:
        self.queens = queens
        self.queen = queens[0] if queens else ""
        self.name = name
        self.colony = colony
        self.curve = curve
        self.queen_key = queen_key
        self.follow_leader = follow_leader
        self.follower: Any = None
        self.connected_to = ""  # where the current connection goes
        self.unanswered = False  # the last hello got no answer (yet)
        self.error_body: dict[str, Any] = {}  # the queen's last error
        self._qi = 0  # the index in ``queens`` of the endpoint last tried from the list

    def find(self, timeout: float | None) -> None:
        """Discovery mode: wait (here, not in the I/O loop) for the colony's queen."""
        if self.queen:
            return
        from meshant.adapters.discovery import Follower, env_interfaces

        if self.follower is None:
            self.follower = Follower(self.colony, env_interfaces())
        try:
            rec = self.follower.first(timeout if timeout is not None else 3600.0)
            self.check_key(rec)
        except MeshantError:
            self.follower.close()
            self.follower = None
            raise
        self.queen = rec.router
        log.info("%s: found queen %r of colony %r at %s", self.name, rec.name, rec.colony,
                 rec.router)

    def check_key(self, rec: Any) -> None:
        """A discovered queen must prove the key we pinned; one with another key is refused."""
        if not self.curve:
            return
        advertised = rec.curve.encode() if rec.curve else None
        if self.queen_key is None:
            if advertised is None:
                raise ConfigError(f"the queen at {rec.router} advertises no CURVE key, but "
                                   "this peer has one: give --queen-key", code=Code.BAD_KEY)
            self.queen_key = advertised  # trust on first use, from the TXT record
        elif advertised != self.queen_key:
            raise Refused(
                f"refusing the queen of colony {rec.colony!r} at {rec.router}: it advertises "
                f"the CURVE key {rec.curve or '(none)'}, not the pinned --queen-key "
                "(a rogue or reconfigured queen)", code=Code.WRONG_QUEEN_KEY)

    def next_queen(self, leader: str) -> None:
        """Go to ``leader`` (a standby's hint: one attempt), else back to the list of
        endpoints, to the one after the last tried (after the standby that gave a hint
        that led nowhere, so a leader that is in the list is always reached)."""
        if leader and leader != self.queen:
            try:
                self.queen = check_endpoint(leader)
            except ValueError:
                leader = ""
        else:
            leader = ""
        if not leader and self.queens and (len(self.queens) > 1
                                           or self.queen not in self.queens):
            self._qi = (self._qi + 1) % len(self.queens)
            self.queen = self.queens[self._qi]
        if self.queen != self.connected_to:
            log.info("%s: trying the queen at %s", self.name, self.queen)

    def unreachable(self, timeout: float) -> QueenUnreachable:
        hint = ("is it running, and is the endpoint right? (set --queen or MESHANT_QUEEN)")
        if self.curve:
            hint = ("CURVE is on: a wrong --queen-key, or a key the queen has not authorized, "
                    "looks exactly like this (the handshake fails silently); check both, "
                    "and that the queen is running")
        if self.error_body.get("code") == "not-leader":
            # Queens answered, but only as standbys.
            return QueenUnreachable(
                f"no queen leads at {', '.join(self.queens) or self.queen} (waited "
                f"{timeout:g} s): {self.error_body.get('message', 'a standby answered')}. "
                "Is their journal database reachable? (see docs/ha.md)")
        where = ", ".join(self.queens) if len(self.queens) > 1 else self.queen
        return QueenUnreachable(
            f"no answer from the queen at {where} within {timeout:g} s: {hint}")

    def redirect(self, leader: str) -> Refused | None:
        """A standby answered: go to ``leader`` (or the next endpoint); not following
        leaders, the standby's answer is a refusal (returned: the peer stops)."""
        self.unanswered = False
        if not self.follow_leader:
            b = self.error_body
            return Refused(str(b.get("message", "a standby queen")), code=Code.NOT_LEADER,
                           **{k: b.get(k) for k in ("role", "term", "leader", "queen")})
        self.next_queen(leader)
        return None

    def before_hello(self, fresh: bool) -> str | None:
        """Where the next hello goes: where discovery says the queen moved, else the next
        endpoint if the last hello got no answer. Returns why to open a fresh connection
        ("moved", "fresh": asked for one or the endpoint changed), or None."""
        moved = self.follower.current() if self.follower is not None else None
        if moved is not None and moved.router != self.queen and self.follow():
            return "moved"
        if self.unanswered and (len(self.queens) > 1 or (
                self.queens and self.queen not in self.queens)):
            self.next_queen("")  # no answer there: the next one
        return "fresh" if fresh or self.connected_to != self.queen else None

    def follow(self) -> bool:
        """A discovering peer follows its queen to a new address; True if it moved."""
        if self.follower is None:
            return False
        rec = self.follower.current()
        if rec is None or rec.router == self.queen:
            return False
        try:
            self.check_key(rec)
        except MeshantError as e:
            log.error("%s: %s", self.name, e)
            return False
        log.info("%s: the queen moved to %s", self.name, rec.router)
        self.queen = rec.router
        return True

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()


__all__ = ["QueenFinder"]
