"""What the queen core decides, as typed values: the one outbox every part of it writes to.

Two kinds of values go in:

* **Actions**, for the driver, carried out in order (``Outbox.actions``): :class:`Send` a
  message, :class:`Publish` on PUB, journal :class:`Record`, :class:`RecordMemory`,
  :class:`Remember`, :class:`GraphRecord` and :class:`ScheduleRecord` (each durable
  before any later action leaves), and :class:`Read` (a journal lookup whose answer
  comes back as an event: ``QueenCore.fetched``).
* **Work** the scheduler decided during a turn (``Outbox.work``): :class:`Assign`,
  :class:`Revoke` (stop an abandoned attempt), :class:`Deliver` (an update or result for
  a submitter), :class:`Watch` (the result for a later submission with the same
  idempotency key). At the end of the turn the core turns work into sends, batched per
  peer, after the turn's journal record (``core/queen/delivery.py``).

``Outbox.after`` holds sends that must wait for the turn's journal record too (an
acknowledgement, a result sent again): they leave after the work.

The values are slotted dataclasses, not frozen ones: a frozen one costs four times as
much to make (830 against 180 ns with seven fields, measured), and the queen makes
several per task; nothing changes one once made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from meshant import protocol as p
from meshant.core.tasks.model import Task
from meshant.core.tasks.work import Work


@dataclass(slots=True)
class Send:
    """Send ``msg`` to the peer on ``identity``, in ``codec``."""

    identity: bytes
    codec: str
    msg: p.Message


@dataclass(slots=True)
class Publish:
    """Send ``frames`` on the PUB socket under ``topic``."""

    topic: bytes
    frames: list[bytes]


@dataclass(slots=True)
class Record:
    """Journal these tasks' changes, durably, before any later action leaves."""

    tasks: list[Task]


@dataclass(slots=True)
class RecordMemory:
    """Journal colony memory changes, ``(key, value, expires_wall, seq)`` (a value of
    ``meshant.core.memory.model.DELETED`` deletes), before any later action leaves."""

    changes: list[tuple[str, Any, float | None, int]]


@dataclass(slots=True)
class Remember:
    """Journal conversation state (``meshant.storage.conversation``) before any later
    action leaves: question rows (upserted), task updates, inbox messages kept, inbox
    messages forgotten (``unkept``, delivered or expired or purged, for ``to``), and the
    records of handlers' steps."""

    questions: list[dict[str, Any]] = field(default_factory=list)
    updates: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    unkept: list[str] = field(default_factory=list)
    to: str = ""
    # Steps recorded (durable agents): (task, attempt, n, record).
    steps: list[tuple[str, int, int, dict[str, Any]]] = field(default_factory=list)


@dataclass(slots=True)
class GraphRecord:
    """Journal these graphs' and graph nodes' changes (after the turn's ``Record``, before
    any later action leaves): ``meshant.storage.graphs.record``."""

    graphs: list[Any]
    nodes: list[Any]


ReadWhat = Literal["task", "key", "graph", "updates", "names"]


@dataclass(slots=True)
class Read:
    """Look something up in the journal (never in the queen's loop on a network
    database) and give the answer to ``QueenCore.fetched(token, answer, now)``:

    * ``task``: the final task with id ``key`` (``Archive.find(key, events=True)``) or None;
    * ``key``: the newest task submitted with idempotency key ``key`` (``find_key``);
    * ``graph``: the graph ``key`` and its nodes' states (``find_graph``);
    * ``updates``: the journaled updates of task ``key`` (``updates``), oldest first;
    * ``names``: every name for the archive index (``names``), given to
      ``QueenCore.fetched_names`` instead (its token is 0).
    """

    token: int
    what: ReadWhat
    key: str


@dataclass(slots=True)
class ScheduleRecord:
    """Schedules changed (core/schedules): ``(name, row)`` each, row None when removed.
    In the same transaction as the turn's task rows: a tick's cursor and the task it
    fired are durable together."""

    changes: list[tuple[str, dict[str, Any] | None]]


Action = Send | Publish | Record | RecordMemory | Remember | GraphRecord | ScheduleRecord | Read
JournalAction = Record | RecordMemory | Remember | GraphRecord | ScheduleRecord
_JOURNAL = (Record, RecordMemory, Remember, GraphRecord, ScheduleRecord)


@dataclass(slots=True)
class Commit:
    """A run of consecutive journal actions, made durable in one transaction: a crash
    keeps all of them or none (a turn's task rows never without its graph's, say)."""

    actions: list[JournalAction]


def grouped(actions: list[Action]) -> list[Action | Commit]:
    """``actions`` in order, each run of consecutive journal actions as one Commit (a
    driver carries a Commit out as one transaction, ``storage.commit.commit_all``)."""
    out: list[Action | Commit] = []
    run: list[JournalAction] | None = None
    for a in actions:
        if isinstance(a, _JOURNAL):
            if run is None:
                run = []
                out.append(Commit(run))
            run.append(a)
        else:
            run = None
            out.append(a)
    return out




class Outbox:
    """Where every part of the core writes what it decided; ``take`` empties it."""

    __slots__ = ("actions", "after", "memory_record", "work")

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.work: list[Work] = []
        self.after: list[Send] = []
        # The turn's one memory record, however many keys change (see MemoryService).
        self.memory_record: RecordMemory | None = None

    def take(self) -> list[Action]:
        out, self.actions = self.actions, []
        self.memory_record = None
        return out


__all__ = ["Action", "Commit", "GraphRecord", "JournalAction", "Outbox", "Publish", "Read",
           "Record", "RecordMemory", "Remember", "ScheduleRecord", "Send", "grouped"]
