"""Heartbeat monitor: who has gone silent for N intervals. Sans-IO: time is passed in.

A peer is *offline* once ``misses`` whole intervals have passed since it was last heard
(``now - last >= interval * misses``). ``check`` reports each peer going offline exactly
once; hearing it again brings it back online (reported by ``beat``). Callbacks are the
caller's business: the monitor only returns what changed, so nothing runs under a lock.

``check`` is called often (the queen: every 50 ms) and there may be thousands of peers,
so it keeps the earliest time any peer could go offline and scans only from then on:
a beat only moves a peer's deadline later, so that time stays a safe lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

_EARLY = 1e-6  # scan this much early: float rounding never delays a verdict


@dataclass(slots=True)
class _Peer:
    last: float
    timeout: float
    online: bool = True


class HeartbeatMonitor:
    """Tracks when each peer was last heard and which ones are online."""

    def __init__(self, interval: float, misses: int) -> None:
        if interval <= 0 or misses < 1:
            raise ValueError("interval must be > 0 and misses >= 1")
        self.interval = interval
        self.misses = misses
        self._peers: dict[Hashable, _Peer] = {}
        self._due = math.inf  # no online peer can go offline before this

    @property
    def timeout(self) -> float:
        return self.interval * self.misses

    def add(self, peer: Hashable, now: float, timeout: float | None = None) -> None:
        """Start watching ``peer`` (heard at ``now``); ``timeout`` overrides interval*misses."""
        p = self._peers[peer] = _Peer(now, timeout if timeout is not None else self.timeout)
        self._due = min(self._due, now + p.timeout - _EARLY)

    def remove(self, peer: Hashable) -> None:
        self._peers.pop(peer, None)

    def beat(self, peer: Hashable, now: float) -> bool:
        """Record a sign of life. Returns True when this brings an offline peer back."""
        p = self._peers.get(peer)
        if p is None:
            return False
        p.last = now
        if not p.online:
            p.online = True
            self._due = min(self._due, now + p.timeout - _EARLY)
            return True
        return False

    def is_online(self, peer: Hashable) -> bool:
        p = self._peers.get(peer)
        return p is not None and p.online

    def last_seen(self, peer: Hashable) -> float | None:
        p = self._peers.get(peer)
        return None if p is None else p.last

    def missed(self, peer: Hashable, now: float) -> int:
        """Whole intervals missed since the peer was last heard."""
        p = self._peers.get(peer)
        return 0 if p is None else int((now - p.last) // self.interval)

    def check(self, now: float) -> list[Hashable]:
        """Peers that went offline since the last check; each is reported once."""
        if now < self._due:
            return []
        gone = []
        due = math.inf
        for key, p in self._peers.items():
            if p.online:
                # The same sum as next_deadline: at that very instant, it is due (a
                # difference could round below the timeout, and the wakeup would be
                # wasted: in the simulator, repeated for ever at one virtual time).
                if now >= p.last + p.timeout:
                    p.online = False
                    gone.append(key)
                elif p.last + p.timeout < due:
                    due = p.last + p.timeout
        self._due = due - _EARLY
        return gone

    def next_deadline(self) -> float | None:
        """The earliest time a peer that is online now could go offline."""
        times = [p.last + p.timeout for p in self._peers.values() if p.online]
        return min(times) if times else None

    def __contains__(self, peer: Hashable) -> bool:
        return peer in self._peers

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._peers))

    def __len__(self) -> int:
        return len(self._peers)
