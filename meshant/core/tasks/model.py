"""The task model: a task and its attempts.

Their lifecycles are tables in :mod:`meshant.core.lifecycle` (``TASK``, ``ATTEMPT``);
the scheduler is the only code that moves them (``FINAL`` states never change again).
Why a task failed is a :class:`meshant.protocol.codes.Code` (its error's ``code``, and
``cause``). A graph node's task has an id of its own shape (:func:`graph_node_id`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from meshant.core.lifecycle import ATTEMPT_LIVE, TASK_FINAL, AttemptState, TaskState
from meshant.core.nodes.registry import Node

DELAYED = TaskState.DELAYED  # not to start before its not_before (core/tasks/delays.py)
QUEUED = TaskState.QUEUED
ASSIGNED = TaskState.ASSIGNED
ACCEPTED = TaskState.ACCEPTED
INPUT_REQUIRED = TaskState.INPUT_REQUIRED  # running, its handler waits for an answer
SUSPENDED = TaskState.SUSPENDED  # waits durably: for a time, an answer, a child
COMPLETED = TaskState.COMPLETED
FAILED = TaskState.FAILED
CANCELLED = TaskState.CANCELLED
FINAL = TASK_FINAL

# A graph node's task id: "tg:<graph>/<node>" (one spelling, here).
GRAPH_NODE_PREFIX = "tg:"


def graph_node_id(graph: str, node: str) -> str:
    """The id of the task that runs node ``node`` of graph ``graph``."""
    return f"{GRAPH_NODE_PREFIX}{graph}/{node}"


def is_graph_node(task_id: str) -> bool:
    """Whether ``task_id`` is a graph node's task."""
    return task_id[:3] == GRAPH_NODE_PREFIX


def graph_node_of(task_id: str) -> tuple[str, str] | None:
    """(graph, node) of a graph node's task id; None for another task's."""
    if not is_graph_node(task_id):
        return None
    graph, sep, node = task_id[len(GRAPH_NODE_PREFIX):].rpartition("/")
    return (graph, node) if sep else None

# Tasks without labels share this one (never mutated): an empty dict per task is 64 bytes.
_NO_LABELS: dict[str, Any] = {}


@dataclass(slots=True, eq=False)
class Task:
    """One task. 100,000 may sit in a queue, so what most tasks never use stays ``None``
    (``avoid``, ``rejected``, ``reasons``, the watchers) until first needed."""

    id: str
    capability: str
    payload: Any = None
    client: bytes = b""
    client_name: str = ""
    priority: int = 50
    timeout: float | None = None
    to: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 3
    wait: float = 30.0
    state: TaskState = QUEUED
    attempt: int = 0
    tries: int = 0
    seq: int = 0
    order: int = 0
    submitted: float = 0.0
    deadline: float | None = None
    current: Attempt | None = None
    avoid: set[bytes] | None = None  # connections not to assign it to again
    rejected: set[bytes] | None = None  # connections that rejected it
    reasons: list[str] | None = None  # why its attempts failed, oldest first
    history: list[tuple[float, str, str]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    # Ids of this task's pending timers (0: none): a timer whose id no longer matches is
    # stale, and the scheduler drops stale timers as soon as they are most of the heap.
    waiting: int = 0  # waiting for a forager offering its capability
    deadline_timer: int = 0
    retry_timer: int = 0  # in a retry backoff (queued, but not in its queue's heap)
    logged: int = 0  # history entries already journaled
    restored: bool = False
    key: str | None = None  # idempotency key
    dead: bool = False  # in the dead-letter queue
    retry_base: float | None = None  # this task's backoff, else the queen's
    retry_cap: float | None = None
    # Exception types (names) whose handler failures are retried ("*": any); else a
    # handler's exception fails the task at once, unless the handler said to retry.
    retry_on: tuple[str, ...] | None = None
    # Its first journal write may wait (core/journal/defer.py): an IACP/2 client's
    # submission without ack or key, which that client re-sends after a queen restart.
    defer: bool = False
    # Durable agents: the records of its handler's steps (in order: position i is
    # steps[i]), their encoded size, what a suspended task waits for ({"until": wall} /
    # {"request": id} / {"child": id}), its parent's id if a handler called it, and the
    # children its handler called (their ids).
    steps: list[dict[str, Any]] | None = None
    steps_bytes: int = 0
    wake: dict[str, Any] | None = None
    wake_timer: int = 0
    parent: str | None = None
    children: list[str] | None = None
    # Delayed tasks (core/tasks/delays.py): the wall-clock time it may start from, and
    # the timer that releases it into its queue then.
    not_before: float | None = None
    delay_timer: int = 0
    # Concurrency limits (core/tasks/limits.py): its submission's own, (key, max).
    concurrency: tuple[str, int] | None = None
    # Its keyed limits' slots, as its submission was checked (None: not worked out yet).
    limit_keys: list[tuple[int, str]] | None = None
    cost: float | None = None  # rate limits (core/tasks/rates.py): its tokens; None: 1
    _watchers: list[tuple[bytes, str, str]] | None = None

    @property
    def watchers(self) -> list[tuple[bytes, str, str]]:
        """Later submissions with this task's idempotency key: (identity, name, alias)."""
        if self._watchers is None:
            self._watchers = []
        return self._watchers

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def add_reason(self, why: str) -> list[str]:
        if self.reasons is None:
            self.reasons = []
        self.reasons.append(why)
        return self.reasons

    def add_avoid(self, identity: bytes) -> None:
        if self.avoid is None:
            self.avoid = set()
        self.avoid.add(identity)


@dataclass(slots=True, eq=False)
class Attempt:
    """One run of a task on one forager: ``id`` is ``<task>.<number>``, the assign id the
    forager answers with. ``live`` until fenced off (reissued, cancelled) or done."""

    id: str
    task: Task
    node: Node
    number: int
    lease: float
    state: AttemptState = AttemptState.RUNNING
    # The forager's number of the last progress report or partial result taken from this
    # attempt (its ``n``): what it need not send again after a reconnect or a takeover.
    n: int = 0

    @property
    def live(self) -> bool:
        """Whether this attempt still counts (held for its forager, or running)."""
        return self.state in ATTEMPT_LIVE


RETRY_ON_MAX = 20  # exception types a submission may name, at most


def retry_on_problem(value: Any) -> str | None:
    """What is wrong with a ``retry_on`` (a list of exception type names, or ``["*"]``),
    or None."""
    if not isinstance(value, list) or len(value) > RETRY_ON_MAX or not all(
            isinstance(v, str) and 0 < len(v) <= 100 for v in value):
        return (f"retry_on is a list of at most {RETRY_ON_MAX} exception type names "
                "(\"*\": any)")
    return None


def retries(task: Task, error: dict[str, Any]) -> bool:
    """Whether a handler's failure is tried again (while attempts are left): when the
    handler said so (``error.retry``), or its exception's type is one the submission
    named in ``retry_on``. Otherwise it fails the task at once (as Ray's
    ``retry_exceptions=False`` and Celery without ``autoretry_for``)."""
    if error.get("retry") is True:
        return True
    on = task.retry_on
    return bool(on) and ("*" in on or str(error.get("type")) in on)  # type: ignore[operator]


def slim(task: Task) -> None:
    """Share what many tasks repeat: one capability string, no empty dict each."""
    task.capability = sys.intern(task.capability)
    if task.client_name:
        task.client_name = sys.intern(task.client_name)
    if task.to is not None:
        task.to = sys.intern(task.to)
    if not task.labels:
        task.labels = _NO_LABELS
