"""The queen core's journal actions, written: one function every driver of a core
calls (the queen actor, the simulator, the tests' in-memory colony), so what each action
means on disk is said once."""

from __future__ import annotations

from typing import Any

from meshant.core.outbox import GraphRecord, Record, RecordMemory, Remember
from meshant.storage import conversation
from meshant.storage import graphs as graph_store

JournalAction = Record | RecordMemory | Remember | GraphRecord


def commit(journal: Any, action: JournalAction, to_wall: float) -> None:
    """Make ``action`` durable in ``journal`` (one transaction). ``to_wall`` turns the
    core's monotonic times into wall-clock times. Raises JournalError (Deposed when
    another queen leads) and writes nothing then."""
    match action:
        case Record(tasks=tasks):
            journal.record(tasks, to_wall)
        case RecordMemory(changes=changes):
            journal.record_memory(changes)
        case Remember(questions=questions, updates=updates, kept=kept, unkept=unkept, to=to):
            journal.write(conversation.batch(questions, updates, kept, unkept, to))
        case GraphRecord(graphs=graphs, nodes=nodes):
            journal.write(graph_store.batch(graphs, nodes, to_wall))


__all__ = ["JournalAction", "commit"]
