"""What the journal keeps of conversations: tasks' questions and answers, their update
logs (pruned with the task), and the durable inboxes of names that are not connected.

Portable SQL only (TEXT, INTEGER, REAL, BLOB; ``?`` placeholders; ``ON CONFLICT ... DO
UPDATE/NOTHING``), so either journal backend carries it: writes are a
:class:`~meshant.storage.records.Batch`'s ``extra`` statements (written, and fenced, like
the rest of a batch), reads go through the backend's ``_all``. The tables are created,
if missing, on every writable open (``create``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshant.storage.records import Batch, pack, unpack

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS questions (
        task_id TEXT NOT NULL,
        request TEXT NOT NULL,
        attempt TEXT NOT NULL,
        prompt BLOB,
        data BLOB,
        asked REAL NOT NULL,
        answered INTEGER NOT NULL,
        answer BLOB,
        answered_by TEXT NOT NULL,
        withdrawn INTEGER NOT NULL,
        PRIMARY KEY (task_id, request)
    )""",
    """CREATE TABLE IF NOT EXISTS task_updates (
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (task_id, seq)
    )""",
    """CREATE TABLE IF NOT EXISTS task_steps (
        task_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        n INTEGER NOT NULL,
        record BLOB NOT NULL,
        PRIMARY KEY (task_id, position)
    )""",
    """CREATE TABLE IF NOT EXISTS inbox (
        id TEXT NOT NULL,
        to_name TEXT NOT NULL,
        kind TEXT NOT NULL,
        from_name TEXT NOT NULL,
        body BLOB,
        sent REAL NOT NULL,
        expires REAL NOT NULL,
        size INTEGER NOT NULL,
        receipt INTEGER NOT NULL,
        ord INTEGER NOT NULL,
        PRIMARY KEY (to_name, id)
    )""",
)

# A task's journaled log keeps at most this many updates (the newest), like its log in
# the queen's memory.
KEEP_UPDATES = 1000

_UPSERT_QUESTION = (
    "INSERT INTO questions (task_id, request, attempt, prompt, data, asked, answered, answer, "
    "answered_by, withdrawn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (task_id, request) DO UPDATE SET attempt=excluded.attempt, "
    "answered=excluded.answered, answer=excluded.answer, answered_by=excluded.answered_by, "
    "withdrawn=excluded.withdrawn")
_INSERT_UPDATE = ("INSERT INTO task_updates (task_id, seq, kind, body) VALUES (?, ?, ?, ?) "
                  "ON CONFLICT (task_id, seq) DO NOTHING")
_INSERT_STEP = ("INSERT INTO task_steps (task_id, position, attempt, n, record) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT (task_id, position) DO NOTHING")
_INSERT_KEPT = ("INSERT INTO inbox (id, to_name, kind, from_name, body, sent, expires, size, "
                "receipt, ord) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (to_name, id) DO NOTHING")


def create(execute: Callable[[str], Any]) -> None:
    """Add the tables if missing (additive and idempotent: on every writable open);
    ``execute`` runs one statement on the backend (translated for it)."""
    for stmt in SCHEMA:
        execute(stmt)


def batch(questions: list[dict[str, Any]],
          updates: list[tuple[str, int, str, dict[str, Any]]],
          kept: list[dict[str, Any]], unkept: list[str], to: str,
          steps: list[tuple[str, int, int, dict[str, Any]]] | None = None) -> Batch:
    """The rows of one queen ``Remember`` action, as a batch for the journal's ``write``
    (``steps``: (task, attempt, n, record) of steps recorded)."""
    b = Batch()
    if steps:
        b.extra.append((_INSERT_STEP, [(t, rec["position"], a, n, pack(rec))
                                       for t, a, n, rec in steps]))
    if questions:
        b.extra.append((_UPSERT_QUESTION, [
            (q["task"], q["request"], q["attempt"], pack(q["prompt"]), pack(q["data"]),
             q["asked"], int(q["answered"]), pack(q["answer"]), q["by"], int(q["withdrawn"]))
            for q in questions]))
    if updates:
        b.extra.append((_INSERT_UPDATE, [(t, s, k, pack(body)) for t, s, k, body in updates]))
        last: dict[str, int] = {}
        for t, s, _, _ in updates:
            last[t] = max(last.get(t, 0), s)
        old = [(t, s - KEEP_UPDATES) for t, s in last.items() if s > KEEP_UPDATES]
        if old:
            b.extra.append(("DELETE FROM task_updates WHERE task_id=? AND seq<=?", old))
    if kept:
        b.extra.append((_INSERT_KEPT, [
            (k["id"], k["to"], k["kind"], k["from"], pack(k["body"]), k["sent"], k["expires"],
             k["size"], int(k["receipt"]), k["ord"]) for k in kept]))
    if unkept:
        b.extra.append(("DELETE FROM inbox WHERE to_name=? AND id=?", [(to, i) for i in unkept]))
    return b


def prune_rows(task_ids: list[str]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Statements forgetting what belonged to those of ``task_ids`` the journal no longer
    holds (run after its tasks are deleted, in the same transaction)."""
    args = [(t, t) for t in task_ids]
    gone = " AND NOT EXISTS (SELECT 1 FROM tasks WHERE id=?)"
    return [("DELETE FROM questions WHERE task_id=?" + gone, args),
            ("DELETE FROM task_updates WHERE task_id=?" + gone, args),
            ("DELETE FROM task_steps WHERE task_id=?" + gone, args)]


# The same for a backend that prunes in one statement: every row whose task is gone.
SWEEP = ("DELETE FROM questions WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE "
         "tasks.id = questions.task_id)",
         "DELETE FROM task_updates WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE "
         "tasks.id = task_updates.task_id)",
         "DELETE FROM task_steps WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE "
         "tasks.id = task_steps.task_id)")


class ConversationStore:
    """Reads of the conversation tables, through a journal backend's ``_all``."""

    def __init__(self, journal: Any) -> None:
        self._all: Callable[..., list[tuple[Any, ...]]] = journal._all

    # -- reading --------------------------------------------------------------------------
    def questions(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """Questions, in the order asked (of one task, or of all)."""
        q = ("SELECT task_id, request, attempt, prompt, data, asked, answered, answer, "
             "answered_by, withdrawn FROM questions")
        args: tuple[Any, ...] = ()
        if task_id is not None:
            q += " WHERE task_id=?"
            args = (task_id,)
        rows = self._all(q + " ORDER BY asked, request", args)
        return [{"task": r[0], "request": r[1], "attempt": r[2], "prompt": unpack(r[3]),
                 "data": unpack(r[4]), "asked": r[5], "answered": bool(r[6]),
                 "answer": unpack(r[7]), "by": r[8], "withdrawn": bool(r[9])} for r in rows]

    def updates(self, task_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        rows = self._all("SELECT seq, kind, body FROM task_updates WHERE task_id=? "
                         "ORDER BY seq", (task_id,))
        return [(r[0], r[1], unpack(r[2])) for r in rows]

    def last_seqs(self, task_ids: list[str]) -> dict[str, int]:
        """The newest update's sequence number of each of ``task_ids`` that has one (one
        query, whatever their number: a queen taking over asks it for all it restores)."""
        wanted = set(task_ids)
        rows = self._all("SELECT task_id, MAX(seq) FROM task_updates GROUP BY task_id")
        return {r[0]: int(r[1]) for r in rows if r[0] in wanted and r[1] is not None}

    def steps(self, task_id: str) -> list[dict[str, Any]]:
        """A task's recorded steps, in order (durable agents)."""
        return [unpack(r[0]) for r in self._all(
            "SELECT record FROM task_steps WHERE task_id=? ORDER BY position", (task_id,))]

    def steps_of(self, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The recorded steps of each of ``task_ids`` that has some (one query)."""
        wanted = set(task_ids)
        out: dict[str, list[dict[str, Any]]] = {}
        for task_id, raw in self._all("SELECT task_id, record FROM task_steps "
                                      "ORDER BY task_id, position"):
            if task_id in wanted:
                out.setdefault(task_id, []).append(unpack(raw))
        return out

    def marks(self, task_ids: list[str]) -> dict[str, tuple[int, int]]:
        """For each of ``task_ids`` whose forager numbered its updates: ``(attempt, n)`` of
        its newest journaled progress report or partial result (one query)."""
        wanted = set(task_ids)
        rows = self._all(
            "SELECT u.task_id, u.body FROM task_updates u JOIN (SELECT task_id, MAX(seq) "
            "AS s FROM task_updates WHERE kind IN ('task.progress', 'task.result') GROUP BY "
            "task_id) m ON u.task_id = m.task_id AND u.seq = m.s")
        out: dict[str, tuple[int, int]] = {}
        for task_id, raw in rows:
            if task_id not in wanted:
                continue
            body = unpack(raw)
            if isinstance(body, dict) and isinstance(body.get("n"), int) and isinstance(
                    body.get("attempt"), int):
                out[task_id] = (body["attempt"], body["n"])
        # A step's record is numbered with the run's updates too: the newest of either.
        for task_id, attempt, n in self._all(
                "SELECT task_id, attempt, MAX(n) FROM task_steps GROUP BY task_id, attempt"):
            if task_id in wanted and n is not None and (int(attempt), int(n)) > out.get(
                    task_id, (0, 0)):
                out[task_id] = (int(attempt), int(n))
        return out

    def kept(self, name: str | None = None) -> list[dict[str, Any]]:
        """Inbox messages, oldest first (for one name, or all)."""
        q = ("SELECT id, to_name, kind, from_name, body, sent, expires, size, receipt, ord "
             "FROM inbox")
        args: tuple[Any, ...] = ()
        if name is not None:
            q += " WHERE to_name=?"
            args = (name,)
        rows = self._all(q + " ORDER BY ord", args)
        return [{"id": r[0], "to": r[1], "kind": r[2], "from": r[3], "body": unpack(r[4]),
                 "sent": r[5], "expires": r[6], "size": r[7], "receipt": bool(r[8]),
                 "ord": r[9]}
                for r in rows]


__all__ = ["KEEP_UPDATES", "SCHEMA", "SWEEP", "ConversationStore", "batch", "create",
           "prune_rows"]
