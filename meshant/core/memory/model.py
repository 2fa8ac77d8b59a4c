"""Colony memory: a small key-value map every agent sees consistently (the Clone pattern).

Sans-IO. The queen holds the authoritative :class:`MemoryStore`; every change gets the
next sequence number and is published to all agents. Each agent keeps a
:class:`MemoryReplica` that applies updates strictly in sequence; a gap (a missed update)
or a late join makes it ask for a snapshot, then apply only the updates newer than it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import msgpack

MAX_KEY = 256


class _Deleted:
    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()  # a journaled memory change that deletes its key


class MemoryError_(Exception):
    """A memory request the store refuses; ``code`` is stable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise MemoryError_("bad-key", f"memory keys are strings of 1-{MAX_KEY} characters")
    return key


@dataclass
class MemoryStore:
    """The queen's authoritative map with a sequence number per update."""

    max_keys: int = 10_000
    max_value: int = 64 * 1024
    seq: int = 0
    items: dict[str, Any] = field(default_factory=dict)
    expires: dict[str, float] = field(default_factory=dict)
    _timers: list[tuple[float, str]] = field(default_factory=list)

    def set(self, key: str, value: Any, now: float, ttl: float | None = None) -> dict[str, Any]:
        """Set ``key``; returns the update to publish. Raises MemoryError_, changing nothing."""
        check_key(key)
        try:
            size = len(msgpack.packb(value))
        except (TypeError, ValueError, OverflowError) as e:
            raise MemoryError_("bad-value", f"memory values must be msgpack-able: {e}")
        if size > self.max_value:
            raise MemoryError_("too-large", f"the value of {key!r} is {size} bytes; the limit "
                               f"is {self.max_value}")
        if key not in self.items and len(self.items) >= self.max_keys:
            raise MemoryError_("memory-full", f"the memory holds {len(self.items)} keys, its "
                               "limit: delete some first")
        if ttl is not None and ttl <= 0:
            raise MemoryError_("bad-value", "ttl must be > 0 seconds")
        self.seq += 1
        self.items[key] = value
        update: dict[str, Any] = {"op": "update", "seq": self.seq, "key": key, "value": value}
        if ttl is not None:
            self.expires[key] = now + ttl
            heapq.heappush(self._timers, (now + ttl, key))
            update["ttl"] = ttl
        else:
            self.expires.pop(key, None)
        return update

    def delete(self, key: str) -> dict[str, Any] | None:
        """Delete ``key``; the update to publish, or None when there was no such key."""
        check_key(key)
        if key not in self.items:
            return None
        del self.items[key]
        self.expires.pop(key, None)
        self.seq += 1
        return {"op": "update", "seq": self.seq, "key": key, "deleted": True}

    def expire(self, now: float) -> list[dict[str, Any]]:
        """Deletions for keys whose TTL has run out."""
        out = []
        while self._timers and self._timers[0][0] <= now:
            when, key = heapq.heappop(self._timers)
            if self.expires.get(key) == when:
                update = self.delete(key)
                if update is not None:
                    out.append(update)
        return out

    def restore(self, rows: Any, now: float, wall_now: float) -> None:
        """Take back journaled items ``(key, value, expires_wall, seq)`` after a restart
        or a takeover; a key whose time ran out meanwhile expires at the first tick (so
        its deletion is journaled too)."""
        for key, value, expires, seq in rows:
            self.items[key] = value
            self.seq = max(self.seq, seq)
            if expires is not None:
                when = now + max(0.0, expires - wall_now)
                self.expires[key] = when
                heapq.heappush(self._timers, (when, key))

    def snapshot(self) -> dict[str, Any]:
        return {"op": "snap", "seq": self.seq, "items": dict(self.items)}


RESYNC = "resync"


@dataclass
class MemoryReplica:
    """An agent's copy. ``apply`` returns the changes as ``(key, value, deleted)`` tuples,
    or RESYNC when the agent must fetch a snapshot (it keeps buffering meanwhile)."""

    seq: int = 0
    synced: bool = False
    items: dict[str, Any] = field(default_factory=dict)
    pending: list[dict[str, Any]] = field(default_factory=list)
    resyncs: int = 0

    def apply(self, update: dict[str, Any]) -> list[tuple[str, Any, bool]] | str:
        seq = update.get("seq")
        if not isinstance(seq, int):
            return []
        if not self.synced:
            self.pending.append(update)
            return []
        if seq <= self.seq:
            return []  # already seen (or from before our snapshot)
        if seq != self.seq + 1:
            self.synced = False
            self.resyncs += 1
            self.pending.append(update)
            return RESYNC
        return [self._apply(update)]

    def behind(self, queen_seq: int) -> bool:
        """The queen's heartbeat says it is at ``queen_seq``: are we missing updates?"""
        if self.synced and queen_seq > self.seq:
            self.synced = False
            self.resyncs += 1
            return True
        return False

    def _apply(self, update: dict[str, Any]) -> tuple[str, Any, bool]:
        key = str(update.get("key"))
        self.seq = update["seq"]
        if update.get("deleted"):
            self.items.pop(key, None)
            return key, None, True
        self.items[key] = update.get("value")
        return key, update.get("value"), False

    def load(self, snap: dict[str, Any]) -> list[tuple[str, Any, bool]] | str:
        """Install a snapshot, then the buffered updates newer than it."""
        old = self.items
        self.items = dict(snap.get("items") or {})
        self.seq = int(snap.get("seq", 0))
        self.synced = True
        changes = [(k, v, False) for k, v in self.items.items() if old.get(k, _NONE) != v]
        changes += [(k, None, True) for k in old if k not in self.items]
        pending, self.pending = sorted(self.pending, key=lambda u: u["seq"]), []
        for u in pending:
            r = self.apply(u)
            if r == RESYNC:
                return RESYNC
            changes.extend(r)  # type: ignore[arg-type]
        return changes

    def reset(self) -> None:
        """The queen restarted: forget everything and wait for a snapshot."""
        self.seq = 0
        self.synced = False
        self.pending.clear()


_NONE = object()
