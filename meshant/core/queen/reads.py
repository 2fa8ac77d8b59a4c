"""Requests that wait for the journal. A handler that needs a journal read declares it
(a *needs* function beside the handler, pure: which reads, given what is in memory and
what was fetched already); the router parks the request until every declared read is
answered — each goes out as an effect (:class:`~meshant.core.queen.outbox.Read`) — and
only then calls the handler, once, the answers in hand (``Request.fetched``, read with
:meth:`Reads.value`). A handler never runs twice for one message.

Order per peer holds: while one of a peer's requests waits, the peer's later messages
wait behind it (a re-sent submission and the cancel that follows it stay in order).
Other peers go on. Everything here is bounded: a peer with ``PER_PEER`` messages waiting
is told to slow down.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from meshant.core.queen.outbox import Outbox, Read, ReadWhat
from meshant.core.queen.state import Request

PER_PEER = 1000  # messages of one peer waiting behind a read, at most
# Read tokens, unique in the process: an answer meant for a core that has since been
# replaced (a takeover, a step-down) finds no request of the new core waiting for it.
_TOKENS = itertools.count(1)


ReadKey = tuple[ReadWhat, str]


class UndeclaredRead(RuntimeError):
    """A handler read what its needs function did not declare: a bug."""


@dataclass(slots=True)
class _Pending:
    what: ReadWhat
    key: str
    requests: list[Request] = field(default_factory=list)


class Reads:
    """Reads in flight and the requests (and peers) waiting for them."""

    __slots__ = ("_by_query", "_pending", "out", "peers")

    def __init__(self, out: Outbox) -> None:
        self.out = out
        self._pending: dict[int, _Pending] = {}
        self._by_query: dict[tuple[str, str], int] = {}
        # Peers with a request parked: their later messages, (frames, key), in order.
        self.peers: dict[bytes, deque[tuple[list[bytes], bytes | None]]] = {}

    @staticmethod
    def value(req: Request, what: ReadWhat, key: str) -> Any:
        """The journal's answer for ``what``/``key``, which ``req`` carries (its handler's
        needs declared the read). UndeclaredRead otherwise."""
        fetched = req.fetched
        if fetched is None or (what, key) not in fetched:
            raise UndeclaredRead(f"{req.msg.kind} read {what} {key!r} without declaring it")
        return fetched[(what, key)]

    def wait_for(self, req: Request, wanted: list[ReadKey]) -> bool:
        """Park ``req`` on the first read of ``wanted`` it does not carry yet (True), or
        say it carries them all (False: handle it now). Reads are asked one at a time:
        a later one may depend on an earlier's answer (a key, then its task)."""
        fetched = req.fetched
        for what, key in wanted:
            if fetched is None or (what, key) not in fetched:
                self.park(req, what, key)
                return True
        return False

    def park(self, req: Request, what: ReadWhat, key: str) -> None:
        token = self._by_query.get((what, key))
        if token is None:
            token = next(_TOKENS)
            self._by_query[(what, key)] = token
            self._pending[token] = _Pending(what, key)
            self.out.actions.append(Read(token, what, key))
        self._pending[token].requests.append(req)
        self.peers.setdefault(req.identity, deque())

    def held(self, identity: bytes) -> bool:
        """Whether this peer's messages wait behind a read."""
        return identity in self.peers

    def hold(self, identity: bytes, frames: list[bytes], key: bytes | None) -> bool:
        """Keep a message of a waiting peer; False when it has too many waiting."""
        q = self.peers[identity]
        if len(q) >= PER_PEER:
            return False
        q.append((frames, key))
        return True

    def answer(self, token: int, value: Any) -> list[Request]:
        """The journal answered read ``token``: the requests that waited for it, in order,
        each carrying the answer (the router checks their needs again)."""
        p = self._pending.pop(token, None)
        if p is None:
            return []
        del self._by_query[(p.what, p.key)]
        out = []
        for req in p.requests:
            fetched = dict(req.fetched or {})
            fetched[(p.what, p.key)] = value
            out.append(replace(req, fetched=fetched))
        return out

    def release(self, identity: bytes) -> deque[tuple[list[bytes], bytes | None]] | None:
        """The peer's parked request is handled: its waiting messages, to handle now
        (the caller parks the peer again if one of them needs a read)."""
        if any(r.identity == identity for p in self._pending.values() for r in p.requests):
            return None  # still waiting for another read
        return self.peers.pop(identity, None)

    @property
    def waiting(self) -> int:
        return len(self._pending)


__all__ = ["PER_PEER", "ReadKey", "Reads", "UndeclaredRead"]
