"""Durable agents' steps, sans-IO: what a step's record is, the rules the queen checks
before it keeps one, and how a re-run replays them.

A handler is a loop of model and tool calls. Each call it makes through ``ctx.step``
(``ctx.call``, ``ctx.sleep``, a durable ``ctx.ask``) is a *step* at a position (0, 1, 2...
in the order the handler makes them), keyed by its name and occurrence (the n-th call of
that name). Its record — the value it returned, or the exception it raised — travels to
the queen like a partial result (numbered, re-sent after a reconnect) and is journaled
with the task. A later run of the same task gets the records with its assignment and
:class:`Replay` hands them back instead of running the steps again; a run that asks for
another step than the one recorded at a position diverged (a non-deterministic handler)
and fails at once.

A record is a map: ``position``, ``kind`` (``step``, ``call``, ``sleep``, ``ask``),
``name``, ``occurrence``, and ``value`` or ``error`` (``type``, ``message``,
``traceback``); a call's ``child`` (the sub-task's id), a sleep's ``until`` (wall-clock
seconds), an ask's ``request``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from meshant.core.tasks.model import GRAPH_NODE_PREFIX

KINDS = ("step", "call", "sleep", "ask")
NAME_MAX = 200
STEPS_MAX = 10_000  # steps one task may record
STEPS_BYTES = 16 * 1024 * 1024  # bytes of records one task may keep
INLINE_BYTES = 1024 * 1024  # records up to this go with the assignment; more are fetched


def child_id(parent: str, position: int) -> str:
    """The id of the sub-task a handler calls at ``position``: one per (parent, position),
    whatever run asks for it. A graph node's sub-task is no graph node: its id starts
    ``tc:`` where its parent's starts ``tg:``."""
    if parent.startswith(GRAPH_NODE_PREFIX):
        parent = "tc:" + parent[len(GRAPH_NODE_PREFIX):]
    return f"{parent}/c{position}"


def size_of(record: dict[str, Any]) -> int:
    """About how many bytes a record takes (its value's encoding)."""
    try:
        return len(msgpack.packb(record, default=_opaque))
    except (TypeError, ValueError, OverflowError):
        return 1 << 30


def _opaque(value: Any) -> Any:
    data = getattr(value, "data", None)  # a Blob
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"cannot encode {type(value).__name__}")


def record_problem(body: Any, steps: list[dict[str, Any]] | None) -> str | None:
    """Why a ``task.step`` body cannot be kept as the next record of a task whose records
    are ``steps``, or None. (A position below the next is a record sent again: the
    caller drops it.)"""
    if not isinstance(body, dict):
        return "a step record is a map"
    kind, name = body.get("kind"), body.get("name")
    if kind not in KINDS:
        return f"a step's kind is one of {', '.join(KINDS)}, not {kind!r}"
    if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
        return f"a step's name is a string of 1-{NAME_MAX} characters"
    pos, occ = body.get("position"), body.get("occurrence")
    if pos.__class__ is not int or pos < 0 or occ.__class__ is not int or occ < 1:
        return "a step's position is an int >= 0 and its occurrence an int >= 1"
    have = len(steps or ())
    if pos >= STEPS_MAX:
        return f"a task records at most {STEPS_MAX:,} steps"
    if pos > have:
        return f"step {pos} was recorded before step {have}: records go in order"
    err = body.get("error")
    if err is not None and not isinstance(err, dict):
        return "a step's error is a map (type, message, traceback)"
    return None


@dataclass(slots=True)
class Divergence:
    """The run asked for another step than the one recorded at ``position``."""

    position: int
    recorded: str  # "kind name #occurrence"
    asked: str

    def message(self) -> str:
        return (f"the handler is not deterministic: step {self.position} was recorded as "
                f"{self.recorded}, and this run asks for {self.asked} there (a re-run "
                "must make the same steps in the same order; see docs/durable.md)")


def describe(kind: str, name: str, occurrence: int) -> str:
    return f"{kind} {name!r} #{occurrence}"


@dataclass(slots=True)
class Replay:
    """One run's view of its task's recorded steps: each call of the handler's takes the
    next position; a recorded position gives its record back (or a :class:`Divergence`),
    a new one returns None (run the step, then :meth:`recorded` its record)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    position: int = 0
    seen: dict[str, int] = field(default_factory=dict)  # name -> calls of it so far

    def next(self, kind: str, name: str) -> tuple[int, int, dict[str, Any] | Divergence | None]:
        """The next step: (its position, its occurrence, its record / a divergence /
        None if this run is the first to reach it)."""
        occ = self.seen.get(name, 0) + 1
        self.seen[name] = occ
        pos = self.position
        self.position += 1
        if pos >= len(self.steps):
            return pos, occ, None
        rec = self.steps[pos]
        if (rec.get("kind"), rec.get("name"), rec.get("occurrence")) != (kind, name, occ):
            return pos, occ, Divergence(pos, describe(str(rec.get("kind")), str(rec.get(
                "name")), int(rec.get("occurrence") or 0)), describe(kind, name, occ))
        return pos, occ, rec

    def recorded(self, record: dict[str, Any]) -> None:
        """A step this run made was recorded (at its position, the next one here)."""
        if record["position"] == len(self.steps):
            self.steps.append(record)

    @property
    def replaying(self) -> bool:
        """Whether the next step is one recorded already."""
        return self.position < len(self.steps)


__all__ = ["INLINE_BYTES", "KINDS", "NAME_MAX", "STEPS_BYTES", "STEPS_MAX", "Divergence",
           "Replay", "child_id", "describe", "record_problem", "size_of"]
