"""Where the queen is: the next of several endpoints (a leader and its standbys) or the
leader a standby names; found and followed by discovery (zeroconf), with a check that a
discovered queen holds the CURVE key we pinned."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from meshant import protocol as p
from meshant.actors._endpoints import (
    check_endpoint,
    check_endpoints,
    default_name,
    resolve_queen,
)
from meshant.adapters.security import load_public, load_secret
from meshant.core.session import PeerSession
from meshant.errors import MeshantError, QueenUnreachable, Refused
from meshant.protocol.codes import Code

log = logging.getLogger("meshant")


class QueenFinder:
    """Mixed into :class:`meshant.actors._peer.Peer`: where the queen is."""

    role: str
    queen: str
    name: str
    _sess: PeerSession
    colony: str | None
    _follower: Any
    _curve: tuple[bytes, bytes] | None
    _queen_key: bytes | None
    _sub_endpoint: str
    queens: list[str]
    _qi: int  # the index in ``queens`` of the endpoint last tried from the list
    _connected_to: str
    _unanswered: bool
    _follow_leader: bool
    _error_body: dict[str, Any]
    _refusal: MeshantError | None
    _stopping: threading.Event
    _welcomed: threading.Event

    def _open_socket(self) -> Any:
        raise NotImplementedError

    def _settle(self, queen: str | None, name: str | None, colony: str | None,
                discover: bool | None, curve_secret: str | None, queen_key: str | None,
                follow_leader: bool) -> None:
        """The settings locating, securing and naming this peer: the constructor's, or a
        forager's ``configure`` before it starts."""
        if discover is None:
            discover = queen is None and not os.environ.get("MESHANT_QUEEN")
        self.colony = colony or os.environ.get("MESHANT_COLONY") or None
        self._follower: Any = None
        # Several endpoints: a leader and its standbys (docs/ha.md), tried in turn.
        self.queens = [] if discover else check_endpoints(resolve_queen(queen))
        self.queen = self.queens[0] if self.queens else ""
        self._qi = 0
        self._connected_to = ""
        self._follow_leader = follow_leader
        self._error_body: dict[str, Any] = {}
        self._unanswered = False  # the last hello got no answer (yet)
        # CURVE: our keypair, and the queen's public key (pinned, or learnt from discovery).
        curve_secret = curve_secret or os.environ.get("MESHANT_CURVE_SECRET") or None
        queen_key = queen_key or os.environ.get("MESHANT_QUEEN_KEY") or None
        self._curve = load_secret(curve_secret) if curve_secret else None
        self._queen_key = load_public(queen_key) if queen_key else None
        if self._queen_key is not None and self._curve is None:
            raise ValueError("--queen-key needs --curve-secret: this peer's own key pair")
        if self._curve is not None and self._queen_key is None and not discover:
            raise ValueError("--curve-secret needs --queen-key (the queen's public key), "
                             "unless the queen is found by discovery")
        self.name = name or default_name(self.role)
        if not p.valid_name(self.name):
            raise ValueError(f"invalid name {self.name!r}: use letters, digits and '._:@-'")
        # The lifecycle with the queen (hello, welcome, liveness, reconnects) is decided
        # by the sans-IO session; this class carries out what it says.
        self._sess = PeerSession(curve=self._curve is not None)

    def _find_queen(self, timeout: float | None) -> None:
        """Discovery mode: wait (here, not in the I/O loop) for the colony's queen."""
        if self.queen:
            return
        from meshant.adapters.discovery import Follower, env_interfaces

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

    def _next_queen(self, leader: str) -> None:
        """(I/O thread) Go to ``leader`` (a standby's hint: one attempt), else back to the
        list of endpoints, to the one after the last tried (after the standby that gave
        a hint that led nowhere, so a leader that is in the list is always reached)."""
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
        if self.queen != self._connected_to:
            log.info("%s: trying the queen at %s", self.name, self.queen)

    def _unreachable(self, timeout: float) -> QueenUnreachable:
        hint = ("is it running, and is the endpoint right? (set --queen or MESHANT_QUEEN)")
        if self._curve is not None:
            hint = ("CURVE is on: a wrong --queen-key, or a key the queen has not authorized, "
                    "looks exactly like this (the handshake fails silently); check both, "
                    "and that the queen is running")
        if self._error_body.get("code") == "not-leader":
            # Queens answered, but only as standbys.
            return QueenUnreachable(
                f"no queen leads at {', '.join(self.queens) or self.queen} (waited "
                f"{timeout:g} s): {self._error_body.get('message', 'a standby answered')}. "
                "Is their journal database reachable? (see docs/ha.md)")
        where = ", ".join(self.queens) if len(self.queens) > 1 else self.queen
        return QueenUnreachable(
            f"no answer from the queen at {where} within {timeout:g} s: {hint}")

    def _redirect(self, leader: str) -> bool:
        """(I/O thread) A standby answered: go to ``leader`` (or the next endpoint), or,
        not following leaders, stop with the standby's answer as the refusal. False: stop."""
        self._unanswered = False
        if not self._follow_leader:
            b = self._error_body
            self._refusal = Refused(str(b.get("message", "a standby queen")),
                                    code=Code.NOT_LEADER,
                                    **{k: b.get(k) for k in ("role", "term", "leader", "queen")})
            self._stopping.set()
            self._welcomed.set()
            return False
        self._next_queen(leader)
        return True

    def _before_hello(self, fresh: bool) -> None:
        """(I/O thread) Where the next hello goes: where discovery says the queen moved,
        else the next endpoint if the last hello got no answer; on a fresh connection
        when asked for one or when the endpoint changed."""
        moved = self._follower.current() if self._follower is not None else None
        if moved is not None and moved.router != self.queen:
            self._follow_queen()  # a fresh connection to where it went
            return
        if self._unanswered and (len(self.queens) > 1 or (
                self.queens and self.queen not in self.queens)):
            self._next_queen("")  # no answer there: the next one
        if fresh or self._connected_to != self.queen:
            self._open_socket()

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
