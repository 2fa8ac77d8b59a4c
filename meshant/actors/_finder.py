"""Where the queen is, as discovery says: found and followed by zeroconf, with a check
that a discovered queen holds the CURVE key we pinned. Which of several endpoints comes
next is :mod:`meshant.core.peers.choice`'s, shared with every driver.

Held by a peer (:class:`meshant.actors._peer.Peer`), which opens the connections the
link decides on.
"""

from __future__ import annotations

import logging
from typing import Any

from meshant.actors._endpoints import check_endpoint
from meshant.core.peers.choice import QueenChoice
from meshant.errors import ConfigError, MeshantError, QueenUnreachable, Refused
from meshant.protocol.codes import Code

log = logging.getLogger("meshant")


class QueenFinder:
    """Discovery's side of finding the queen (waiting for the colony's record, checking
    its key, following it when it moves) beside the endpoint rotation every driver
    shares (``choice``: :class:`~meshant.core.peers.choice.QueenChoice`)."""

    def __init__(self, queens: list[str], *, name: str, colony: str | None, curve: bool,
                 queen_key: bytes | None, follow_leader: bool) -> None:
        self.choice = QueenChoice(queens, follow_leader=follow_leader, check=check_endpoint)
        self.name = name
        self.colony = colony
        self.curve = curve
        self.queen_key = queen_key
        self.follower: Any = None

    @property
    def queen(self) -> str:
        return self.choice.queen

    @property
    def queens(self) -> list[str]:
        return self.choice.queens

    def find(self, timeout: float | None) -> None:
        """Discovery mode: wait (here, not in the I/O loop) for the colony's queen."""
        if self.choice.queen:
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
        self.choice.queen = rec.router
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

    def unreachable(self, timeout: float) -> QueenUnreachable:
        hint = ("is it running, and is the endpoint right? (set --queen or MESHANT_QUEEN)")
        if self.curve:
            hint = ("CURVE is on: a wrong --queen-key, or a key the queen has not authorized, "
                    "looks exactly like this (the handshake fails silently); check both, "
                    "and that the queen is running")
        error = self.choice.error_body
        if error.get("code") == "not-leader":
            # Queens answered, but only as standbys.
            return QueenUnreachable(
                f"no queen leads at {', '.join(self.queens) or self.queen} (waited "
                f"{timeout:g} s): {error.get('message', 'a standby answered')}. "
                "Is their journal database reachable? (see docs/ha.md)")
        where = ", ".join(self.queens) if len(self.queens) > 1 else self.queen
        return QueenUnreachable(
            f"no answer from the queen at {where} within {timeout:g} s: {hint}")

    def moved(self) -> str | None:
        """Where discovery says the queen is now, if it moved there (its key checked)."""
        if self.follower is None:
            return None
        rec = self.follower.current()
        if rec is None or rec.router == self.choice.queen:
            return None
        try:
            self.check_key(rec)
        except MeshantError as e:
            log.error("%s: %s", self.name, e)
            return None
        log.info("%s: the queen moved to %s", self.name, rec.router)
        return str(rec.router)

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()


__all__ = ["QueenFinder"]
