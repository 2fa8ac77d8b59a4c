"""The queen core's journal actions, written: one function every driver of a core
calls (the queen actor, the simulator, the tests' in-memory colony), so what each action
means on disk is said once."""

from __future__ import annotations

from typing import Any

from meshant.core.queen.outbox import (
    GraphRecord,
    JournalAction,
    Record,
    RecordMemory,
    Remember,
    ScheduleRecord,
)
from meshant.storage import conversation, schedules
from meshant.storage import graphs as graph_store
from meshant.storage.records import Batch, memory_batch


def commit(journal: Any, action: JournalAction, to_wall: float) -> None:
    """Make ``action`` durable in ``journal`` (one transaction). ``to_wall`` turns the
    core's monotonic times into wall-clock times. Raises JournalError (Deposed when
    another queen leads) and writes nothing then."""
    match action:
        case Record(tasks=tasks):
            journal.record(tasks, to_wall)
        case RecordMemory(changes=changes):
            journal.record_memory(changes)
        case Remember(questions=questions, updates=updates, kept=kept, unkept=unkept, to=to,
                      steps=steps):
            journal.write(conversation.batch(questions, updates, kept, unkept, to, steps))
        case GraphRecord(graphs=graphs, nodes=nodes):
            journal.write(graph_store.batch(graphs, nodes, to_wall))
        case ScheduleRecord(changes=changes):
            journal.write(schedules.batch(changes))


def batch_of(journal: Any, action: JournalAction, to_wall: float) -> Batch:
    """The rows ``action`` writes (its tasks' hash chains move now: see records.py)."""
    match action:
        case Record(tasks=tasks):
            batch: Batch = journal.task_batch(tasks, to_wall)
            return batch
        case RecordMemory(changes=changes):
            return memory_batch(changes)
        case Remember(questions=questions, updates=updates, kept=kept, unkept=unkept, to=to,
                      steps=steps):
            return conversation.batch(questions, updates, kept, unkept, to, steps)
        case GraphRecord(graphs=graphs, nodes=nodes):
            return graph_store.batch(graphs, nodes, to_wall)
        case ScheduleRecord(changes=changes):
            return schedules.batch(changes)
    raise TypeError(f"not a journal action: {action!r}")


def commit_all(journal: Any, actions: list[JournalAction], to_wall: float) -> None:
    """Make a run of journal actions durable in one transaction (a turn's task rows and
    its graphs' rows: a crash keeps both or neither). Raises JournalError as ``commit``."""
    if len(actions) == 1:
        commit(journal, actions[0], to_wall)
        return
    batch = Batch()
    for a in actions:
        batch.merge(batch_of(journal, a, to_wall))
    journal.write(batch)


__all__ = ["JournalAction", "batch_of", "commit", "commit_all"]
