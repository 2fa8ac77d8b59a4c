"""Heartbeat monitor: who has gone silent for N intervals. Sans-IO: time is passed in.

A peer is *offline* once ``misses`` whole intervals have passed since it was last heard
(``now - last >= interval * misses``). ``check`` reports each peer going offline exactly
once; hearing it again brings it back online (reported by ``beat``). Callbacks are the
caller's business: the monitor only returns what changed, so nothing runs under a lock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass


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

    @property
    def timeout(self) -> float:
        return self.interval * self.misses

    def add(self, peer: Hashable, now: float, timeout: float | None = None) -> None:
        """Start watching ``peer`` (heard at ``now``); ``timeout`` overrides interval*misses."""
        self._peers[peer] = _Peer(now, timeout if timeout is not None else self.timeout)

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
        gone = []
        for key, p in self._peers.items():
            if p.online and now - p.last >= p.timeout:
                p.online = False
                gone.append(key)
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
