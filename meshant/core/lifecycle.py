"""Every lifecycle of the colony as data: a table keyed by (state, event) for tasks,
their attempts, graph nodes and the nodes of the registry.

Everything that affects a lifecycle lives in this file (as h11's ``_state.py`` has it):
the states, the events, and which event moves which state where. A change is made by
looking up ``(state, event)``; a pair the table does not hold is a forbidden transition
— a bug in the code that asked, raised as :class:`LifecycleError` (the simulator reports
it as a broken promise, the queen drops the message that met it, loudly). The owners
apply them: the scheduler (tasks, attempts), the graph book (graph nodes), the registry
(nodes).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class LifecycleError(RuntimeError):
    """A transition the lifecycle's table forbids: a bug, never bad input."""


class TaskState(StrEnum):
    DELAYED = "delayed"  # not to start before a time (core/tasks/delays.py): in no queue
    QUEUED = "queued"
    ASSIGNED = "assigned"
    ACCEPTED = "accepted"
    INPUT_REQUIRED = "input-required"  # running, its handler waits for an answer
    SUSPENDED = "suspended"  # no attempt runs: it waits for a time, an answer, a child
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskEvent(StrEnum):
    ASSIGN = "assign"  # given to a forager (a new attempt)
    ACCEPT = "accept"  # the forager took it (said so, or implied by its first update)
    ASK = "ask"  # its handler asked a question and waits
    INPUT = "input"  # every question it waits on was answered or withdrawn
    REQUEUE = "requeue"  # back in its queue: rejected, reissued, given up, retried
    SUSPEND = "suspend"  # its handler waits durably: the attempt ends, the slot is free
    WAKE = "wake"  # what it waited for came: it runs again, replaying its steps
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"
    RELEASE = "release"  # a delayed task's time came: it joins its queue


_T = TaskState
_E = TaskEvent
TASK: dict[tuple[TaskState, TaskEvent], TaskState] = {
    (_T.DELAYED, _E.RELEASE): _T.QUEUED,
    (_T.DELAYED, _E.CANCEL): _T.CANCELLED,
    (_T.QUEUED, _E.ASSIGN): _T.ASSIGNED,
    (_T.QUEUED, _E.FAIL): _T.FAILED,
    (_T.QUEUED, _E.CANCEL): _T.CANCELLED,
    (_T.ASSIGNED, _E.ACCEPT): _T.ACCEPTED,
    (_T.ASSIGNED, _E.REQUEUE): _T.QUEUED,
    (_T.ASSIGNED, _E.COMPLETE): _T.COMPLETED,
    (_T.ASSIGNED, _E.FAIL): _T.FAILED,
    (_T.ASSIGNED, _E.CANCEL): _T.CANCELLED,
    (_T.ASSIGNED, _E.SUSPEND): _T.SUSPENDED,
    (_T.ACCEPTED, _E.SUSPEND): _T.SUSPENDED,
    (_T.INPUT_REQUIRED, _E.SUSPEND): _T.SUSPENDED,
    (_T.SUSPENDED, _E.WAKE): _T.QUEUED,
    # Back in its queue with its last record a sleep not over (its run died before it
    # could say so): it sleeps the rest, on the queen's clock.
    (_T.QUEUED, _E.SUSPEND): _T.SUSPENDED,
    (_T.SUSPENDED, _E.FAIL): _T.FAILED,  # its deadline passed while it waited
    (_T.SUSPENDED, _E.CANCEL): _T.CANCELLED,
    (_T.ACCEPTED, _E.ASK): _T.INPUT_REQUIRED,
    (_T.ACCEPTED, _E.REQUEUE): _T.QUEUED,
    (_T.ACCEPTED, _E.COMPLETE): _T.COMPLETED,
    (_T.ACCEPTED, _E.FAIL): _T.FAILED,
    (_T.ACCEPTED, _E.CANCEL): _T.CANCELLED,
    (_T.INPUT_REQUIRED, _E.INPUT): _T.ACCEPTED,
    (_T.INPUT_REQUIRED, _E.REQUEUE): _T.QUEUED,
    (_T.INPUT_REQUIRED, _E.COMPLETE): _T.COMPLETED,
    (_T.INPUT_REQUIRED, _E.FAIL): _T.FAILED,
    (_T.INPUT_REQUIRED, _E.CANCEL): _T.CANCELLED,
}
TASK_FINAL = frozenset({_T.COMPLETED, _T.FAILED, _T.CANCELLED})


class AttemptState(StrEnum):
    HELD = "held"  # taken back from the journal: waits for its forager's hello
    RUNNING = "running"  # the task's current attempt, on its forager
    FENCED = "fenced"  # abandoned (reissued, cancelled, failed): its answers are duplicates
    DONE = "done"  # its final result was taken


class AttemptEvent(StrEnum):
    ADOPT = "adopt"  # a held attempt's forager said hello with it (its slot is taken)
    FENCE = "fence"
    FINISH = "finish"


_A = AttemptState
_AE = AttemptEvent
ATTEMPT: dict[tuple[AttemptState, AttemptEvent], AttemptState] = {
    (_A.HELD, _AE.ADOPT): _A.RUNNING,
    (_A.HELD, _AE.FENCE): _A.FENCED,
    (_A.FENCED, _AE.ADOPT): _A.FENCED,  # fenced while held: adopted only to stop it
    (_A.RUNNING, _AE.FENCE): _A.FENCED,
    (_A.RUNNING, _AE.FINISH): _A.DONE,
}
ATTEMPT_LIVE = frozenset({_A.HELD, _A.RUNNING})


class NodeState(StrEnum):
    """A graph node's."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeEvent(StrEnum):
    START = "start"  # its task was submitted (or found: the same node)
    RESTART = "restart"  # taken back running, its task never reached the journal
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"  # cancelled, or what it waits for did not complete


_N = NodeState
_NE = NodeEvent
GRAPH_NODE: dict[tuple[NodeState, NodeEvent], NodeState] = {
    (_N.PENDING, _NE.START): _N.RUNNING,
    (_N.PENDING, _NE.FAIL): _N.FAILED,  # (its payload grew too large, the queue is full)
    (_N.PENDING, _NE.CANCEL): _N.CANCELLED,
    (_N.RUNNING, _NE.RESTART): _N.PENDING,
    (_N.RUNNING, _NE.COMPLETE): _N.COMPLETED,
    (_N.RUNNING, _NE.FAIL): _N.FAILED,
    (_N.RUNNING, _NE.CANCEL): _N.CANCELLED,
}
GRAPH_NODE_FINAL = frozenset({_N.COMPLETED, _N.FAILED, _N.CANCELLED})


class PeerState(StrEnum):
    """A registered peer's (a node of the registry)."""

    ACTIVE = "active"
    DRAINING = "draining"  # finishes what it runs, takes nothing new
    OFFLINE = "offline"


class PeerEvent(StrEnum):
    DRAIN = "drain"
    LEAVE = "leave"  # left, silent past its timeout, halted, revoked, replaced


_P = PeerState
_PE = PeerEvent
PEER: dict[tuple[PeerState, PeerEvent], PeerState] = {
    (_P.ACTIVE, _PE.DRAIN): _P.DRAINING,
    (_P.ACTIVE, _PE.LEAVE): _P.OFFLINE,
    (_P.DRAINING, _PE.LEAVE): _P.OFFLINE,
}

S = TypeVar("S", bound=StrEnum)
V = TypeVar("V", bound=StrEnum)


def step(table: dict[tuple[S, V], S], state: S, event: V, what: str, *args: object) -> S:
    """The state ``event`` moves ``state`` to, by ``table``; LifecycleError if the table
    forbids it (``what % args``: the thing that moves, for the message — formatted only
    then: a step is on every message's path, its message almost never)."""
    new = table.get((state, event))
    if new is None:
        raise LifecycleError(f"{what % args if args else what}: {event} is not allowed in "
                             f"state {state}")
    return new


__all__ = ["ATTEMPT", "ATTEMPT_LIVE", "GRAPH_NODE", "GRAPH_NODE_FINAL", "PEER", "TASK",
           "TASK_FINAL", "AttemptEvent", "AttemptState", "LifecycleError", "NodeEvent",
           "NodeState", "PeerEvent", "PeerState", "TaskEvent", "TaskState", "step"]
