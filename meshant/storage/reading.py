"""The journal's read side, the same SQL over either backend: what a restarted (or newly
leading) queen takes back, lookups of final tasks, and the ``meshant tasks``/``task``/
``journal verify`` views."""

from __future__ import annotations

from typing import Any

from meshant.core.journal.archive import Restored
from meshant.core.journal.idfilter import IdFilter
from meshant.core.lifecycle import TaskState
from meshant.core.tasks.model import graph_node_id
from meshant.storage import graphs, schedules
from meshant.storage.conversation import ConversationStore
from meshant.storage.records import COLS, SELECT, Batch, chain, unpack

IN_BATCH = 500  # ids per IN (...) query


_STATES = frozenset(TaskState)  # an event's "state" is a task state, or a note of one

class JournalReader:
    """Mixed into each backend, which supplies ``_all`` and ``_one`` (``?`` placeholders)."""

    def _all(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _one(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> tuple[Any, ...] | None:
        raise NotImplementedError

    @property
    def _select(self) -> str:
        return SELECT

    @property
    def conversation(self) -> ConversationStore:
        """Questions, task updates and inboxes (``meshant.storage.conversation``)."""
        return ConversationStore(self)

    @staticmethod
    def _row(r: tuple[Any, ...]) -> dict[str, Any]:
        d = dict(zip(COLS, r, strict=True))
        for k in ("payload", "labels", "final", "retry_on", "wake", "concurrency"):
            d[k] = unpack(d[k])
        return d

    def unfinished(self) -> list[dict[str, Any]]:
        """What a restarted queen must hold in memory, oldest first: the unfinished
        tasks, and the dead letters (final, failed, in the dead-letter queue). Other
        final tasks stay on disk: ``find`` and ``find_key`` look them up on demand."""
        rows = self._all(self._select + " WHERE final IS NULL OR dead != 0 ORDER BY created")
        return [self._row(r) for r in rows]

    def find(self, task_id: str, *, events: bool = False) -> dict[str, Any] | None:
        """One task's row (``final`` included), or None; with ``events``, its history
        too (as ``task`` gives it)."""
        r = self._one(self._select + " WHERE id=?", (task_id,))
        if r is None:
            return None
        d = self._row(r)
        if events:
            d["events"] = self._events(task_id)
        return d

    def find_many(self, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The rows of these tasks that exist, by id (a few queries, not one per id)."""
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(task_ids), IN_BATCH):
            chunk = task_ids[i:i + IN_BATCH]
            q = self._select + f" WHERE id IN ({', '.join('?' * len(chunk))})"
            for r in self._all(q, chunk):
                row = self._row(r)
                out[row["id"]] = row
        return out

    def updates(self, task_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """A task's journaled updates ``(seq, kind, body)``, oldest first."""
        return self.conversation.updates(task_id)

    def names(self) -> list[str]:
        """Every task id, idempotency key and graph id the journal holds, as the queen's
        archive index names them (``core.archive.ArchiveIndex.name``)."""
        out = [f"t:{r[0]}" for r in self._all("SELECT id FROM tasks")]
        out += [f"k:{r[0]}" for r in self._all(
            "SELECT idem_key FROM tasks WHERE idem_key IS NOT NULL")]
        out += [f"g:{r[0]}" for r in self._all("SELECT id FROM graphs")]
        return out

    def restored(self) -> Restored:
        """Everything a queen takes back when it starts or takes over on this journal."""
        tasks = self.unfinished()
        unfinished = [r["id"] for r in tasks if r["final"] is None]
        held = {r["id"] for r in tasks}
        running = self.unfinished_graphs()
        wanted = [graph_node_id(g["id"], n["spec"]["name"]) for g in running for n in g["nodes"]]
        finals = {tid: row for tid, row in self.find_many(
            [t for t in wanted if t not in held]).items() if row["final"] is not None}
        store = self.conversation
        return Restored(tasks=tasks, memory=self.memory(), graphs=running, graph_tasks=finals,
                        questions=store.questions(), kept=store.kept(),
                        last_seqs=store.last_seqs(unfinished), marks=store.marks(unfinished),
                        names=self.names(), steps=store.steps_of(unfinished),
                        schedules=schedules.rows(self), last_event=self.last_event())

    def last_event(self) -> float | None:
        """The time of the newest task event (on the clock of the queen that journaled
        it, as every event's ``ts``), or None."""
        r = self._one("SELECT max(ts) FROM events")
        return float(r[0]) if r is not None and r[0] is not None else None

    def find_key(self, key: str) -> dict[str, Any] | None:
        """The newest task submitted with idempotency key ``key``, or None."""
        r = self._one(self._select + " WHERE idem_key=? ORDER BY created DESC LIMIT 1",
                      (key,))
        return self._row(r) if r is not None else None

    # A backend where the primary-key query is a network round trip (PostgreSQL) keeps
    # a filter of the ids it holds (built on the first ``has``; None: not built yet).
    # SQLite answers the query in-process in microseconds, and would pay a scan of every
    # id at the first submission after a restart for it.
    _filter_ids = False
    _ids: IdFilter | None = None

    def has(self, task_id: str) -> bool:
        """Whether the journal holds a task with this id: one primary-key query, which
        the id filter (see ``_filter_ids``) spares for a new id."""
        if self._filter_ids:
            ids = self._ids
            if ids is None or ids.full:
                rows = [r[0] for r in self._all("SELECT id FROM tasks")]
                # Sized from what is there now: ids pruned since do not count.
                ids = self._ids = IdFilter(max(200_000, 2 * len(rows)))
                ids.update(rows)
            if task_id not in ids:
                return False
        return self._one("SELECT 1 FROM tasks WHERE id=?", (task_id,)) is not None

    def _noted(self, batch: Batch) -> Batch:
        """``batch``, its new task ids added to the id filter (if one was built)."""
        if self._ids is not None:
            for task_id in batch.new_ids():
                self._ids.add(task_id)
        return batch

    def _events(self, task_id: str) -> list[dict[str, Any]]:
        return [dict(zip(("seq", "ts", "state", "why", "hash"), e, strict=True))
                for e in self._all("SELECT seq, ts, state, why, hash FROM events "
                                   "WHERE task_id=? ORDER BY seq", (task_id,))]

    def _tail(self, task_id: str) -> tuple[int, str]:
        row = self._one("SELECT seq, hash FROM events WHERE task_id=? ORDER BY seq DESC "
                        "LIMIT 1", (task_id,))
        return (int(row[0]), str(row[1])) if row else (0, "")

    def tasks(self, state: str | None = None, capability: str | None = None,
              limit: int = 1000) -> list[dict[str, Any]]:
        """Journaled tasks, newest first, optionally of one state or capability."""
        q = self._select + " WHERE 1=1"
        args: list[Any] = []
        if state:
            q += " AND state=?"
            args.append(state)
        if capability:
            q += " AND capability=?"
            args.append(capability)
        q += " ORDER BY created DESC LIMIT ?"
        args.append(limit)
        return [self._row(r) for r in self._all(q, args)]

    def task(self, task_id: str) -> dict[str, Any] | None:
        """One task with its history."""
        return self.find(task_id, events=True)

    def unfinished_graphs(self) -> list[dict[str, Any]]:
        """The task graphs still running, with their nodes (``storage.graphs``)."""
        return graphs.unfinished(self)

    def find_graph(self, graph_id: str) -> dict[str, Any] | None:
        """One task graph and its nodes' states, or None."""
        return graphs.find(self, graph_id)

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule, as journaled (``storage.schedules``)."""
        return schedules.rows(self)

    def memory(self) -> list[tuple[str, Any, float | None, int]]:
        """The colony memory as journaled: ``(key, value, expires_wall, seq)``."""
        return [(k, unpack(v), e, int(s)) for k, v, e, s in
                self._all("SELECT key, value, expires, seq FROM memory ORDER BY seq")]

    def verify(self, task_id: str | None = None) -> list[str]:
        """Problems found in the hash chains (an empty list: intact)."""
        q = "SELECT task_id, seq, ts, state, why, hash FROM events"
        args: tuple[Any, ...] = ()
        if task_id is not None:
            q += " WHERE task_id=?"
            args = (task_id,)
        q += " ORDER BY task_id, seq"
        problems = []
        last: dict[str, str] = {}
        cur_task, prev, expect = None, "", 1
        for tid, seq, ts, state, why, h in self._all(q, args):
            if tid != cur_task:
                cur_task, prev, expect = tid, "", 1
            if seq != expect:
                problems.append(f"task {tid}: entry {expect} is missing (next is {seq})")
            good = chain(prev, tid, seq, ts, state, why)
            if h != good:
                problems.append(f"task {tid}: entry {seq} ({state}) was altered")
            prev, expect = h, seq + 1
            if state in _STATES:  # (not a note: progress, a question, an answer)
                last[tid] = state
        # The chain cannot show its own last entries removed: the task row can, since it
        # holds the state they led to.
        rows = self._all("SELECT id, state FROM tasks" + (" WHERE id=?" if task_id else ""),
                         args)
        for tid, state in rows:
            ends = last.get(tid)
            if ends is None:
                problems.append(f"task {tid}: its history is missing (the task is {state})")
            elif ends != state:
                problems.append(f"task {tid}: its last entries are missing (the task is "
                                f"{state}, its history ends at {ends})")
        return problems
