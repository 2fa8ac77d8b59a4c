"""Finding and following the queen by discovery (zeroconf), and checking that a
discovered queen holds the CURVE key we pinned: the part of a peer that only
``--discover`` uses."""

from __future__ import annotations

import logging
from typing import Any

from meshant.errors import MeshantError
from meshant.protocol.codes import Code

log = logging.getLogger("meshant")


class QueenFinder:
    """Mixed into :class:`meshant.actors._peer.Peer`: where the queen is."""

    queen: str
    name: str
    colony: str | None
    _follower: Any
    _curve: tuple[bytes, bytes] | None
    _queen_key: bytes | None
    _sub_endpoint: str

    def _open_socket(self) -> Any:
        raise NotImplementedError

    def _find_queen(self, timeout: float | None) -> None:
        """Discovery mode: wait (here, not in the I/O loop) for the colony's queen."""
        if self.queen:
            return
        from meshant.edges.discovery import Follower, env_interfaces

        if self._follower is None:
            self._follower = Follower(self.colony, env_interfaces())
        try:
            rec = self._follower.first(timeout if timeout is not None else 3600.0)
            self._check_queen_key(rec)
        except MeshantError:
            self._follower.close()
            self._follower = None
            raise
        self.queen = rec.router
        log.info("%s: found queen %r of colony %r at %s", self.name, rec.name, rec.colony,
                 rec.router)

    def _check_queen_key(self, rec: Any) -> None:
        """A discovered queen must prove the key we pinned; one with another key is refused."""
        if self._curve is None:
            return
        advertised = rec.curve.encode() if rec.curve else None
        if self._queen_key is None:
            if advertised is None:
                raise MeshantError(f"the queen at {rec.router} advertises no CURVE key, but "
                                   "this peer has one: give --queen-key", code=Code.BAD_KEY)
            self._queen_key = advertised  # trust on first use, from the TXT record
        elif advertised != self._queen_key:
            raise MeshantError(
                f"refusing the queen of colony {rec.colony!r} at {rec.router}: it advertises "
                f"the CURVE key {rec.curve or '(none)'}, not the pinned --queen-key "
                "(a rogue or reconfigured queen)", code=Code.WRONG_QUEEN_KEY)

    def _follow_queen(self) -> None:
        """(I/O thread) A discovering peer follows its queen to a new address."""
        if self._follower is None:
            return
        rec = self._follower.current()
        if rec is not None and rec.router != self.queen:
            try:
                self._check_queen_key(rec)
            except MeshantError as e:
                log.error("%s: %s", self.name, e)
                return
            log.info("%s: the queen moved to %s", self.name, rec.router)
            self.queen = rec.router
            self._sub_endpoint = ""
            self._open_socket()
