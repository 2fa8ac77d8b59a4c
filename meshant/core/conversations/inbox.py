"""Durable inboxes, sans-IO: directed messages for a name that is not connected, kept in
order, bounded per recipient in count and bytes and with a time to live, and handed over
oldest first when that name registers. The journal keeps them
(``meshant.storage.conversation``); times here are wall-clock seconds, since a kept
message outlives the queen's process and its monotonic clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


class InboxFull(Exception):
    """The recipient's inbox is at its bound."""


@dataclass(slots=True)
class Kept:
    """One kept message: enough to rebuild it as sent, and who wants a receipt."""

    id: str
    to: str
    kind: str
    frm: str
    body: Any
    sent: float  # wall
    expires: float  # wall
    size: int
    receipt: bool = False
    ord: int = 0  # arrival order across the queen's lifetimes (set by ``Inboxes.put``)

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "to": self.to, "kind": self.kind, "from": self.frm,
                "body": self.body, "sent": self.sent, "expires": self.expires,
                "size": self.size, "receipt": self.receipt, "ord": self.ord}


class Inboxes:
    """Every name's inbox. ``max_count`` and ``max_bytes`` bound each; ``max_names``
    bounds how many names have one."""

    def __init__(self, max_count: int = 1000, max_bytes: int = 4 << 20, ttl: float = 86_400.0,
                 max_names: int = 10_000) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.max_names = max_names
        self.boxes: dict[str, deque[Kept]] = {}
        self.sizes: dict[str, int] = {}
        self.next_ord = 1

    def put(self, k: Kept) -> None:
        """Keep ``k``; InboxFull (and nothing kept) when its recipient's inbox is full."""
        box = self.boxes.get(k.to)
        if box is None:
            if len(self.boxes) >= self.max_names:
                raise InboxFull(f"the queen keeps inboxes for at most {self.max_names} names")
            box = self.boxes[k.to] = deque()
            self.sizes[k.to] = 0
        size = self.sizes[k.to]
        if len(box) >= self.max_count or size + k.size > self.max_bytes:
            if not box:
                del self.boxes[k.to], self.sizes[k.to]
            raise InboxFull(f"the inbox of {k.to!r} is full ({len(box)} messages, {size:,} "
                            f"bytes; at most {self.max_count}, {self.max_bytes:,} bytes)")
        if k.ord == 0:
            k.ord = self.next_ord
        self.next_ord = max(self.next_ord, k.ord) + 1
        box.append(k)
        self.sizes[k.to] = size + k.size

    def take(self, name: str) -> list[Kept]:
        """Everything kept for ``name``, oldest first, and forget it."""
        box = self.boxes.pop(name, None)
        self.sizes.pop(name, None)
        return list(box) if box else []

    def peek(self, name: str) -> list[Kept]:
        return list(self.boxes.get(name, ()))

    def expire(self, wall: float) -> list[Kept]:
        """Forget the messages whose time to live has passed; returns them."""
        gone: list[Kept] = []
        for name in list(self.boxes):
            box = self.boxes[name]
            keep = deque(k for k in box if k.expires > wall)
            if len(keep) != len(box):
                gone.extend(k for k in box if k.expires <= wall)
                if keep:
                    self.boxes[name] = keep
                    self.sizes[name] = sum(k.size for k in keep)
                else:
                    del self.boxes[name], self.sizes[name]
        return gone

    def fits(self, to: str, size: int) -> bool:
        box = self.boxes.get(to)
        if box is None:
            return len(self.boxes) < self.max_names and size <= self.max_bytes
        return len(box) < self.max_count and self.sizes[to] + size <= self.max_bytes


__all__ = ["InboxFull", "Inboxes", "Kept"]
