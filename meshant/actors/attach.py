"""Following a task's stream from outside: what ``Client.attach`` hands back, and how a
task's updates (progress, partial results, questions, its result) become
:class:`~meshant.actors.futures.Update` items of a :class:`TaskFuture`.

The submitter's own future (its repeats dropped by the client session) and an attached
one (:func:`feed` drops them) are given each update by the same :func:`apply`, and their
result by the same :func:`conclude` (the submitter's client ends its updates itself), so
both see the same stream: updates in sequence order, each once, then the result.
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.actors.futures import TaskFuture, Update
from meshant.errors import from_error_body


def update_of(kind: str, b: dict[str, Any]) -> Update | None:
    """The Update a task's message stands for (None: it is the task's end)."""
    seq = b.get("seq", 0)
    if kind == "task.progress":
        return Update("progress", seq, fraction=b.get("fraction"), note=b.get("note"))
    if kind == "task.ask":
        prompt = p.unwrap_blob(b.get("prompt"))
        if b.get("withdraw"):
            return Update("withdrawn", seq, request=b.get("request"))
        return Update("input-required", seq, note=prompt if isinstance(prompt, str) else None,
                      value={"prompt": prompt, "data": p.unwrap_blob(b.get("data"))},
                      request=b.get("request"))
    if kind == "task.result" and b.get("partial"):
        return Update("partial", seq, value=p.unwrap_blob(b.get("value")))
    return None


def apply(fut: TaskFuture[Any], kind: str, b: dict[str, Any]) -> Update | None:
    """Give ``fut`` one message of its task (the caller dropped repeats); returns the
    Update it made, if any. After the final result the future is done and its updates
    end."""
    u = update_of(kind, b)
    if u is not None:
        fut._updates.put(u)
        return u
    if kind != "task.result":
        return None
    fut._updates.put(None)
    conclude(fut, b)
    return None


def conclude(fut: TaskFuture[Any], b: dict[str, Any]) -> None:
    """The task's final result ``b`` into ``fut`` (unless it has its outcome already);
    the caller ended its updates."""
    if not fut.done():
        if b.get("state") == "completed":
            fut.set_result(p.unwrap_blob(b.get("result")))
        else:
            fut.set_exception(from_error_body(b.get("error") or {}))


def feed(fut: TaskFuture[Any], kind: str, b: dict[str, Any]) -> Update | None:
    """:func:`apply`, dropping repeats (a sequence number seen already): what an
    attachment sees, updates in sequence order, each once, then the result."""
    seq = b.get("seq", 0)
    if seq <= fut.last_seq:
        return None
    fut.last_seq = seq
    return apply(fut, kind, b)


class Attachment(TaskFuture[Any]):
    """A task followed from a cursor (``Client.attach``): ``updates()`` yields what came
    after it, then ends; ``result()`` is the task's result (or raises its error).
    ``first`` is the task's state when attached, ``last`` the newest sequence number."""

    def __init__(self, task_id: str, after: int, pump: Any = None) -> None:
        super().__init__(task_id, pump)
        self.last_seq = after
        self.state = ""
        self.last = 0


__all__ = ["Attachment", "apply", "conclude", "feed", "update_of"]
