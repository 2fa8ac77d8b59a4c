"""Following a task's stream from outside: what ``Client.attach`` hands back, and how a
task's updates (progress, partial results, questions, its result) become
:class:`~meshant.actors.futures.Update` items of a :class:`TaskFuture`.

The submitter's own future and an attached one are fed by the same :func:`feed`, so both
see the same stream: updates in sequence order, each once, then the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


def feed(fut: TaskFuture, kind: str, b: dict[str, Any]) -> Update | None:
    """Give ``fut`` one message of its task; returns the Update it made, if any. Repeats
    (a sequence number seen already) are dropped. After the final result the future is
    done and its updates end."""
    seq = b.get("seq", 0)
    if seq <= fut.last_seq:
        return None
    fut.last_seq = seq
    u = update_of(kind, b)
    if u is not None:
        fut._updates.put(u)
        return u
    if kind != "task.result":
        return None
    fut._updates.put(None)
    if not fut.done():
        if b.get("state") == "completed":
            fut.set_result(p.unwrap_blob(b.get("result")))
        else:
            fut.set_exception(from_error_body(b.get("error") or {}))
    return None


class Attachment(TaskFuture):
    """A task followed from a cursor (``Client.attach``): ``updates()`` yields what came
    after it, then ends; ``result()`` is the task's result (or raises its error).
    ``first`` is the task's state when attached, ``last`` the newest sequence number."""

    def __init__(self, task_id: str, after: int, pump: Any = None) -> None:
        super().__init__(task_id, None, pump)
        self.last_seq = after
        self.state = ""
        self.last = 0


class Conversations:
    """The client's part in conversations: answering questions, attaching to streams,
    looking into inboxes. A part of :class:`meshant.actors.client.Client`."""

    if TYPE_CHECKING:
        _tasks: dict[str, TaskFuture]
        _attached: dict[str, list[Attachment]]
        _pump: Any
        on_update: Callable[[str, Update], Any] | None

        def _request(self, kind: str, body: dict[str, Any] | None,
                     timeout: float) -> dict[str, Any]: ...
        def _callback(self, fut: TaskFuture, u: Update) -> None: ...

    def answer(self, task_id: str, value: Any, *, request: str | None = None,
               timeout: float = 5.0) -> dict[str, Any]:
        """Answer a task's question (``request``, else its oldest waiting one): its
        handler's ``ctx.ask`` returns ``value``. Raises MeshantError (unknown-question,
        already-answered, forbidden...) if the queen refuses it."""
        body: dict[str, Any] = {"task": task_id, "value": p.wrap_blob(value)}
        if request is not None:
            body["request"] = request
        return self._request("task.answer", body, timeout)

    def attach(self, task_id: str, after_seq: int = 0, *, timeout: float = 5.0) -> Attachment:
        """Follow a task (running or finished, anyone's with the right) from after
        sequence number ``after_seq``: its ``updates()`` and ``result()``. Raises
        MeshantError cursor-expired if updates after the cursor are no longer kept."""
        att = Attachment(task_id, after_seq, self._pump)
        # Registered before asking: what follows the queen's answer is fed to it at once.
        self._attached.setdefault(task_id, []).append(att)
        try:
            info = self._request("task.attach", {"task": task_id, "after": after_seq}, timeout)
        except BaseException:
            self._detach(att)
            raise
        att.state, att.last = info["state"], info.get("last", 0)
        return att

    def _detach(self, att: Attachment) -> None:
        lst = self._attached.get(att.task_id, [])
        if att in lst:
            lst.remove(att)
        if not lst:
            self._attached.pop(att.task_id, None)

    def inbox_of(self, name: str, *, purge: bool = False, timeout: float = 5.0) -> dict[str, Any]:
        """What the queen keeps for ``name`` (not connected); ``purge=True`` forgets it
        (an admin operation with CURVE on)."""
        return self._request("inbox", {"op": "purge" if purge else "list", "name": name},
                             timeout)

    def _on_ask(self, msg: p.Message) -> None:
        fut = self._tasks.get(msg.b.get("task", ""))
        if fut is not None:
            u = feed(fut, "task.ask", msg.b)
            if u is not None and self.on_update is not None:
                self._callback(fut, u)

    def _on_update(self, msg: p.Message) -> None:
        b = msg.b
        for att in list(self._attached.get(b["task"], ())):
            feed(att, b["kind"], b["body"])
            if att.done():
                self._detach(att)


__all__ = ["Attachment", "Conversations", "feed", "update_of"]
