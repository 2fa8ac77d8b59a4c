"""Rights per operation: which roles a CURVE key must hold to do what.

With CURVE on, every key carries roles (``client``, ``forager``, ``admin``; see
:mod:`meshant.adapters.security`). Most operations are open to any registered peer; the
ones in ``OPERATIONS`` are not. Without CURVE (loopback only) there are no keys, and
everything stays allowed. One table, so docs/security.md and the queen cannot disagree.
"""

from __future__ import annotations

ADMIN = "admin"
OWNER = "owner"  # the task's submitter, for its own task, or an admin

# operation -> who may do it besides an admin key ("admin": nobody else).
OPERATIONS: dict[str, str] = {
    "ctl.drain": ADMIN,
    "ctl.halt": ADMIN,
    "dlq.retry": ADMIN,
    "dlq.purge": ADMIN,
    "inbox.purge": ADMIN,
    "schedule.change": ADMIN,  # add, pause, resume, remove or trigger a schedule
    "mem.reserved": ADMIN,  # set or delete a colony memory key under RESERVED_PREFIXES
    "task.answer": OWNER,
    "task.cancel": OWNER,
    "graph.cancel": OWNER,
    "task.attach": OWNER,
}

# Colony memory keys under these prefixes are the operators' (settings agents read).
RESERVED_PREFIXES = ("meshant.", "admin.")


def permits(operation: str, roles: frozenset[str] | None, owner: bool = False) -> bool:
    """Whether a peer whose key holds ``roles`` may do ``operation``.

    ``roles`` None: the connection has no CURVE key (CURVE is off), so it may.
    ``owner``: the peer submitted the task the operation is about."""
    if roles is None:
        return True
    rule = OPERATIONS.get(operation)
    if rule is None or ADMIN in roles:
        return True
    return rule == OWNER and owner


def reserved(key: object) -> bool:
    """Whether a colony memory key is under a reserved prefix."""
    return isinstance(key, str) and key.startswith(RESERVED_PREFIXES)


__all__ = ["ADMIN", "OPERATIONS", "OWNER", "RESERVED_PREFIXES", "permits", "reserved"]
