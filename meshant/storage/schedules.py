"""Schedules in the journal (:mod:`meshant.core.schedules`): one row per schedule — its
spec and where it stands (the cursor: the last tick it handled) — written in the same
transaction as the tasks its ticks fired, so a queen that restarts or takes over fires
each tick after the cursor once and none before it.

Backend-neutral, as :mod:`meshant.storage.graphs`: the rows travel in a
:class:`~meshant.storage.records.Batch`'s ``extra`` statements; portable SQL only; the
table is created if missing on every writable open.
"""

from __future__ import annotations

import time
from typing import Any

from meshant.storage.records import Batch, pack, unpack

TABLES = (
    """CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    updated REAL NOT NULL
)""",
)

UPSERT = ("INSERT INTO schedules (name, spec, updated) VALUES (?, ?, ?) ON CONFLICT (name) "
          "DO UPDATE SET spec = excluded.spec, updated = excluded.updated")
DELETE = "DELETE FROM schedules WHERE name = ?"


def batch(changes: list[tuple[str, dict[str, Any] | None]]) -> Batch:
    """The rows for what changed (``ScheduleBook.take_changes``: a row, or None for a
    schedule removed), in order."""
    now = time.time()
    b = Batch()
    for name, row in changes:
        if row is None:
            b.extra.append((DELETE, [(name,)]))
        else:
            b.extra.append((UPSERT, [(name, pack(row), now)]))
    return b


def rows(j: Any) -> list[dict[str, Any]]:
    """Every schedule journal ``j`` holds (what ``ScheduleBook.restore`` takes); none from
    a journal older than schedules."""
    if getattr(j, "readonly", False):
        try:
            found = j._all("SELECT spec FROM schedules ORDER BY name")
        except Exception:  # (an older journal opened read-only: no such table)
            return []
    else:  # (a writable journal made the table: an error here is the journal's, raised)
        found = j._all("SELECT spec FROM schedules ORDER BY name")
    return [unpack(r[0]) for r in found]


__all__ = ["DELETE", "TABLES", "UPSERT", "batch", "rows"]
