"""What a gateway remembers of the A2A side of its tasks, which the colony does not keep:
a task's A2A context id, its message history, when its status last changed, who sent
it, and its push-notification configs; and the ``ListTasks`` page over them.

The colony keeps the task itself (its state, updates and result: any gateway serves
it). This book holds the rest for the tasks this gateway created or answered, bounded in
count and bytes (the least recently updated are forgotten first); a task it does not
hold is served from the colony alone (its id as its context, no history). Updates
arrive from a colony client's I/O thread, requests in the event loop: one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from a2a.types.a2a_pb2 import (
    ListTasksRequest,
    Message,
    Task,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_page_size,
)

Identity = tuple[str | None, str | None]  # a caller's colony identity (name, key file)

FINAL = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                   TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})
MAX_TASKS = 10_000
MAX_BYTES = 64 * 1024 * 1024  # of messages held (histories and status messages)
_OVERHEAD = 256  # bytes a record costs besides its messages, roughly


def ns(wall: float) -> int:
    """Wall-clock seconds as integer nanoseconds (a cursor's and a Timestamp's unit)."""
    return int(wall * 1e9)


@dataclass(slots=True, eq=False)
class Record:
    """The A2A side of one task."""

    task_id: str
    context_id: str
    capability: str
    owner: Identity
    updated: float  # wall time of the last status change
    state: TaskState = TaskState.TASK_STATE_SUBMITTED
    message: Message | None = None  # the current status message
    history: list[Message] = field(default_factory=list)
    push: dict[str, TaskPushNotificationConfig] = field(default_factory=dict)
    size: int = _OVERHEAD

    def status(self) -> TaskStatus:
        s = TaskStatus(state=self.state)
        s.timestamp.FromNanoseconds(ns(self.updated))
        if self.message is not None:
            s.message.CopyFrom(self.message)
        return s

    def task(self) -> Task:
        """The task as the book knows it (no artifacts: the colony holds those)."""
        t = Task(id=self.task_id, context_id=self.context_id, status=self.status(),
                 history=self.history)
        if self.capability:
            t.metadata.fields["skill"].string_value = self.capability
        return t


class TaskBook:
    """The A2A records of a gateway's tasks, newest change last."""

    def __init__(self, max_tasks: int = MAX_TASKS, max_bytes: int = MAX_BYTES) -> None:
        self.max_tasks, self.max_bytes = max_tasks, max_bytes
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, task_id: str) -> Record | None:
        with self._lock:
            return self._records.get(task_id)

    def open(self, task_id: str, context_id: str, capability: str, owner: Identity,
             first: Message | None, now: float) -> Record:
        """Begin the record of a task (its first message, if any, opens its history)."""
        rec = Record(task_id, context_id, capability, owner, now)
        with self._lock:
            old = self._records.pop(task_id, None)
            if old is not None:
                self._bytes -= old.size
            self._records[task_id] = rec
            self._bytes += rec.size
            if first is not None:
                rec.history.append(first)
                self._grow(rec, first.ByteSize())
            self._trim()
        return rec

    def status(self, task_id: str, state: TaskState, message: Message | None,
               now: float) -> None:
        """The task's status changed (``message``: the new status's). A question it
        supersedes joins the history; a progress note does not (only what was asked and
        said is an interaction worth keeping)."""
        with self._lock:
            rec = self._records.get(task_id)
            if rec is None or rec.state in FINAL:
                return  # unknown here, or already ended: a late update changes nothing
            self._retire(rec)
            if message is not None:
                rec.message = message
                self._grow(rec, message.ByteSize())
            rec.state, rec.updated = state, max(now, rec.updated)
            self._records.move_to_end(task_id)
            self._trim()

    def said(self, task_id: str, message: Message, now: float) -> None:
        """A client's message on the task (an answer): into its history, after the
        question it answers."""
        with self._lock:
            rec = self._records.get(task_id)
            if rec is None:
                return
            self._retire(rec)
            rec.history.append(message)
            self._grow(rec, message.ByteSize())
            rec.updated = max(now, rec.updated)
            self._records.move_to_end(task_id)
            self._trim()

    def _retire(self, rec: Record) -> None:
        """The current status message goes: into the history if it was a question."""
        old = rec.message
        if old is None:
            return
        rec.message = None
        if rec.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            rec.history.append(old)
        else:
            self._grow(rec, -old.ByteSize())

    def _grow(self, rec: Record, n: int) -> None:
        rec.size += n
        self._bytes += n

    def _trim(self) -> None:
        while self._records and (len(self._records) > self.max_tasks
                                 or self._bytes > self.max_bytes):
            _, old = self._records.popitem(last=False)
            self._bytes -= old.size

    # -- ListTasks --------------------------------------------------------------------------

    def page(self, q: ListTasksRequest, owner: Identity | None
             ) -> tuple[list[Record], str, int, int]:
        """The records ``q`` selects among ``owner``'s (None: everyone's), most recently
        updated first: (this page, the next page's token or '', the page size, the number
        of records selected in all). Raises InvalidParamsError for a bad size or token."""
        size = DEFAULT_LIST_TASKS_PAGE_SIZE
        if q.HasField("page_size"):
            validate_page_size(q.page_size)
            size = q.page_size
        after: ListTasksCursor | None = None
        if q.page_token:
            after = decode_list_tasks_cursor(q.page_token)
            if after is None:
                raise InvalidParamsError("pageToken is not one this gateway gave: pass a "
                                         "nextPageToken from a previous ListTasks, or none")
        since = q.status_timestamp_after.ToNanoseconds() if q.HasField(
            "status_timestamp_after") else None
        with self._lock:
            chosen = [r for r in self._records.values() if _selected(r, q, owner, since)]
        chosen.sort(key=_order, reverse=True)
        total = len(chosen)
        if after is not None:
            mark = after.sort_key()
            chosen = [r for r in chosen if _order(r) < mark]
        page, rest = chosen[:size], chosen[size:]
        token = encode_list_tasks_cursor(ListTasksCursor(ns(page[-1].updated),
                                                         page[-1].task_id)) if rest else ""
        return page, token, size, total

    def records(self) -> Iterable[Record]:
        with self._lock:
            return list(self._records.values())


def _order(r: Record) -> tuple[bool, int, str]:
    """A record's place in a listing (the SDK's cursor order: timestamp, then id)."""
    return (True, ns(r.updated), r.task_id)


def _selected(r: Record, q: ListTasksRequest, owner: Identity | None,
              since: int | None) -> bool:
    return ((owner is None or r.owner == owner)
            and (not q.context_id or r.context_id == q.context_id)
            and (q.status == TaskState.TASK_STATE_UNSPECIFIED or r.state == q.status)
            and (since is None or ns(r.updated) > since))


__all__ = ["FINAL", "Identity", "Record", "TaskBook", "ns"]
