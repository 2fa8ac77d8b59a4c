"""What the scheduler decides during a turn, as typed values (the queen's outbox holds
them as its ``work``): :class:`Assign` an attempt, :class:`Revoke` an abandoned one,
:class:`Deliver` an update or result to a submitter, :class:`Watch` (the result for a
later submission with the same idempotency key). At the end of the turn the queen turns
work into sends, batched per peer (``core/queen/delivery.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshant.core.nodes.registry import Node
from meshant.core.tasks.model import Attempt, Task


@dataclass(slots=True)
class Assign:
    """Send ``task.assign`` for ``attempt`` to ``node``."""

    node: Node
    attempt: Attempt


@dataclass(slots=True)
class Revoke:
    """Send ``task.cancel`` for an abandoned ``attempt`` to ``node``."""

    node: Node
    attempt: Attempt


@dataclass(slots=True)
class Deliver:
    """Send ``kind`` (progress, a question, a partial or final result) to the task's
    submitter."""

    task: Task
    kind: str
    body: dict[str, Any]


@dataclass(slots=True)
class Watch:
    """Send a final result to a later submission with the same idempotency key."""

    identity: bytes
    name: str
    body: dict[str, Any]


Work = Assign | Revoke | Deliver | Watch


__all__ = ["Assign", "Deliver", "Revoke", "Watch", "Work"]
