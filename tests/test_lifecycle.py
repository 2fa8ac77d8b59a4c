"""Every lifecycle is a table keyed by (state, event): final states have no way out, every
state is reachable from the first, and a change the table forbids is a LifecycleError
from the one writer of that lifecycle (the scheduler, the graph book, the registry)."""

from __future__ import annotations

from enum import StrEnum

import pytest

from meshant.core import lifecycle as lc
from meshant.core.lifecycle import LifecycleError
from meshant.core.nodes.registry import Node, Registry
from meshant.core.tasks.model import Task
from meshant.core.tasks.scheduler import Scheduler

TABLES: list[tuple[dict[tuple[StrEnum, StrEnum], StrEnum], StrEnum, frozenset[StrEnum]]] = [
    (lc.TASK, lc.TaskState.QUEUED, lc.TASK_FINAL),  # type: ignore[list-item]
    (lc.ATTEMPT, lc.AttemptState.RUNNING,  # type: ignore[list-item]
     frozenset({lc.AttemptState.FENCED, lc.AttemptState.DONE})),
    (lc.GRAPH_NODE, lc.NodeState.PENDING, lc.GRAPH_NODE_FINAL),  # type: ignore[list-item]
    (lc.PEER, lc.PeerState.ACTIVE, frozenset({lc.PeerState.OFFLINE})),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("table", "first", "final"), TABLES)
def test_final_states_have_no_way_out_and_every_state_is_reachable(
        table: dict[tuple[StrEnum, StrEnum], StrEnum], first: StrEnum,
        final: frozenset[StrEnum]) -> None:
    # (an attempt fenced while held is still adopted by its forager, to be stopped)
    assert not [k for k, to in table.items() if k[0] in final and to != k[0]]
    states = set(type(first))
    seen, todo = {first}, [first]
    while todo:
        s = todo.pop()
        for (frm, _), to in table.items():
            if frm == s and to not in seen:
                seen.add(to)
                todo.append(to)
    # (an attempt taken back from the journal starts held, a delayed submission delayed:
    # first states of their own, not reached from the usual first)
    assert states - seen <= {lc.AttemptState.HELD, lc.TaskState.DELAYED}
    if first == lc.TaskState.QUEUED:  # and a delayed task goes on as a queued one
        assert table[(lc.TaskState.DELAYED, lc.TaskEvent.RELEASE)] == first


def test_a_forbidden_change_is_a_lifecycle_error_naming_it() -> None:
    with pytest.raises(LifecycleError) as info:
        lc.step(lc.TASK, lc.TaskState.COMPLETED, lc.TaskEvent.ASSIGN, "task t1")
    assert str(info.value) == "task t1: assign is not allowed in state completed"
    with pytest.raises(LifecycleError) as info:  # (what moves, formatted only for the error)
        lc.step(lc.TASK, lc.TaskState.COMPLETED, lc.TaskEvent.ASSIGN, "task %s", "t2")
    assert str(info.value) == "task t2: assign is not allowed in state completed"
    assert lc.step(lc.TASK, lc.TaskState.QUEUED, lc.TaskEvent.ASSIGN, "t") == "assigned"


def test_the_scheduler_refuses_what_the_table_forbids() -> None:
    reg = Registry()
    reg.add(Node(name="f", identity=b"f", role="forager", codec="iacp2", slots=1,
                 tools=frozenset({"echo"})), 0.0)
    s = Scheduler(reg)
    s.submit(Task(id="t1", capability="echo"), 0.0)
    s.cancel("t1", 0.1)
    task = s.find_live("t1")
    assert task is not None and task.state == "cancelled"
    with pytest.raises(LifecycleError):
        s._move(task, lc.TaskEvent.ACCEPT, 0.2)
    assert task.state == "cancelled" and task.history[-1][1] == "cancelled"


def test_a_peer_drains_once_and_leaves_once() -> None:
    reg = Registry()
    n = reg.add(Node(name="f", identity=b"f", role="forager", codec="iacp2", slots=1), 0.0)
    reg.drain(n)
    with pytest.raises(LifecycleError):
        reg.drain(n)
    reg.remove(n, 1.0)
    assert n.state == "offline"
    reg.remove(n, 2.0)  # (a peer already gone: nothing more)
