"""Storage: the queen's journal, on SQLite (embedded, the default) or PostgreSQL (shared
by several queens, one of which leads: see docs/ha.md)."""

from __future__ import annotations

from typing import Any

from meshant.errors import Deposed, JournalError

PG_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(spec: str | None) -> bool:
    """Whether a ``--journal`` value names a PostgreSQL database rather than a file."""
    return bool(spec) and str(spec).startswith(PG_SCHEMES)


def check_spec(spec: str) -> None:
    """Refuse a ``--journal`` value that looks like a database URL but is not one we
    read (a typo would otherwise make an SQLite file of that name, silently)."""
    low = spec.lower()
    if is_postgres(spec):
        return
    if "://" in spec or low.startswith(("postgres", "pg:")):
        raise JournalError(f"--journal {spec!r} looks like a database URL, but meshant reads "
                           "postgresql://USER@HOST:PORT/DB (lower case, with //) or an SQLite "
                           "file path")


def open_journal(spec: str, *, readonly: bool = False, timeout: float = 5.0,
                 durability: str = "process") -> Any:
    """The journal ``spec`` names: a PostgreSQL URL, or an SQLite file path. ``timeout``
    (PostgreSQL: the lease) bounds every statement and lock wait. ``durability``:
    ``process`` or ``power`` (see the backends)."""
    check_spec(spec)
    if is_postgres(spec):
        from meshant.storage.pg import PgJournal

        return PgJournal(spec, readonly=readonly, timeout=timeout, durability=durability)
    from meshant.storage.journal import Journal

    return Journal(spec, readonly=readonly, durability=durability)


__all__ = ["Deposed", "JournalError", "check_spec", "is_postgres", "open_journal"]
