"""A client's side of the protocol, sans-IO: the submissions it keeps until their tasks
end, what it sends again and when, and which of the queen's answers mean what.

It sits beside the :class:`~meshant.core.peers.peer_session.PeerSession` (hello, welcome,
liveness); the driver (:class:`meshant.actors.client.Client`) holds the futures, moves
bytes and reads the clock, and carries out what this decides:

* every submission (task or graph) is kept, encoded, until its task ends, and sent again
  with the same id after a reconnect: the queen treats an id it holds as the same task;
  messages still unsent go after them, in order, never twice;
* a task's updates and its result are delivered exactly once, in sequence order
  (:class:`Update`, :class:`Ended`); repeats are dropped;
* a submission refused ``rate-limited`` (and ``queue-full`` when asked) is sent again
  after the ``retry_after`` the queen names, or the policy's backoff, with jitter, while
  every other submission waits its turn; after ``submit_timeout`` it fails;
* a request refused ``not-registered`` goes again once the queen has welcomed us back;
* when the queen stays away longer than ``queen_wait``, every pending submission fails
  (:class:`GiveUp`).

Time (and randomness, through the backoff) is passed in.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from meshant import protocol as p
from meshant.core.peers.link import FLUSH_MAX, Item
from meshant.core.policy import Backoff
from meshant.core.tasks.model import is_graph_node
from meshant.protocol.codes import Code

# Re-sending refused submissions: the first retry after about 50 ms, doubling to 2 s,
# when the queen names no retry_after.
RETRY_BACKOFF = Backoff(base=0.05, cap=2.0)


@dataclass(slots=True)
class Update:
    """A new update of a pending task (progress, a partial result, a question)."""

    task_id: str
    kind: str
    body: dict[str, Any]


@dataclass(slots=True)
class Ended:
    """A pending task's final result (``body``), or its refusal by the queen (``error``,
    the error message's body)."""

    task_id: str
    body: dict[str, Any] | None
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class GiveUp:
    """The queen has been away too long: every pending submission fails with ``why``."""

    why: str
    away: float


@dataclass(slots=True)
class Submitted:
    """The queen acknowledged the submission of ``task_id`` (it asked for ``ack``)."""

    task_id: str


@dataclass(slots=True)
class Reply:
    """The queen's answer (``kind``, ``body``) to the request ``ref``."""

    ref: str
    kind: str
    body: dict[str, Any]


@dataclass(slots=True)
class RequestFailed:
    """The queen refused the request ``ref`` (``error``: the error's body)."""

    ref: str
    error: dict[str, Any]


@dataclass(slots=True)
class GraphEvent:
    """A graph's news: ``graph.submitted``, ``graph.node`` or its end ``graph.result``
    (once), or ``error`` (the queen refused the graph ``msg.ref``)."""

    kind: str
    msg: p.Message


@dataclass(slots=True)
class NodeUpdate:
    """An update (``kind``) of a graph node's task, for the graph's handle."""

    kind: str
    body: dict[str, Any]


@dataclass(slots=True)
class Followed:
    """A ``task.update`` of a task an attachment follows."""

    body: dict[str, Any]


@dataclass(slots=True)
class Delivered:
    """A directed message, note or receipt for this client."""

    msg: p.Message


@dataclass(slots=True)
class Refusal:
    """An error about nothing this client waits on (a drain refused, say): the caller
    may tell it."""

    msg: p.Message


Action = (Update | Ended | GiveUp | Submitted | Reply | RequestFailed | GraphEvent | NodeUpdate
          | Followed | Delivered | Refusal)
_REPLIES = frozenset({"task.state", "status.reply", "tool.reply", "dlq.reply", "task.answered",
                      "task.attached", "inbox.reply", "graph.state", "schedule.reply"})
_TASK_UPDATES = frozenset({"task.result", "task.progress", "task.ask"})
# Requests that change nothing (or nothing twice: a cancel, an attach of this connection):
# one sent to a queen lost before it answered goes again to the next (a failover, a
# restart). Any other is failed as queen-lost at once: it may have been carried out
# (a schedule added, a dead letter retried), and only its caller can tell whether to ask
# again; before, it waited for its timeout with nobody left to answer it.
_ASK_AGAIN = frozenset({"status.query", "task.status", "tool.query", "graph.status",
                        "task.attach", "task.cancel"})
_ASK_AGAIN_OPS = {"dlq": frozenset({"list", "show"}), "schedule": frozenset({"list", "show"}),
                  "inbox": frozenset({"list"})}


def asks_again(msg: p.Message) -> bool:
    """Whether request ``msg`` may go again to a new queen (see _ASK_AGAIN)."""
    if msg.kind in _ASK_AGAIN:
        return True
    ops = _ASK_AGAIN_OPS.get(msg.kind)
    return ops is not None and msg.b.get("op") in ops


@dataclass(slots=True)
class Pending:
    """A submission kept until its task ends."""

    frames: list[bytes]
    size: int
    submitted: float
    last_seq: int = 0
    refusals: int = 0


class ClientSession:
    """One client's submissions and its messages to the queen (the role a
    :class:`~meshant.core.peers.link.PeerLink` drives)."""

    role = "client"
    beat_now = False

    def __init__(self, *, queen_wait: float = 30.0, submit_timeout: float = 60.0,
                 retry_queue_full: bool = False, rng: random.Random | None = None) -> None:
        self.queen_wait = queen_wait
        self.submit_timeout = submit_timeout
        self.retry_queue_full = retry_queue_full
        self.backoff = Backoff(RETRY_BACKOFF.base, RETRY_BACKOFF.cap, rng or random.Random())
        self.tasks: dict[str, Pending] = {}
        self.graphs: dict[str, Pending] = {}
        self.requests: dict[str, p.Message] = {}  # waiting for an answer, by message id
        self.outbox: deque[Item] = deque()
        self.out: list[Action] = []
        self._retry: list[tuple[float, str]] = []
        self._hold_until = 0.0
        self._resend: list[p.Message] = []
        self._lost_at: float | None = None
        self._lost_why = ""

    def take(self) -> list[Action]:
        out, self.out = self.out, []
        return out

    # -- the link's side ------------------------------------------------------------------

    def hello_fields(self) -> dict[str, Any]:
        return {}

    def hb_body(self) -> dict[str, Any]:
        return {}

    @property
    def busy(self) -> bool:
        return False

    @property
    def pending(self) -> bool:
        return bool(self.outbox)

    def negotiated(self, features: frozenset[str], max_message: int) -> None:
        pass

    def sent(self, item: Item, now: float) -> None:
        pass

    def unencodable(self, item: Item, code: str, message: str) -> str | None:
        if isinstance(item, p.Message) and self.requests.pop(item.id, None) is not None:
            # A request cannot go: its caller hears why now, not after its timeout.
            self.out.append(RequestFailed(item.id, {"code": code, "message": message}))
            return None
        kind = item.kind if isinstance(item, p.Message) else "message"
        return f"cannot send a {kind} message: {message}"

    def on_welcome(self, first: bool, welcome: dict[str, Any]) -> None:
        self.welcomed(first)

    def on_lost(self, now: float, why: str) -> None:
        self.lost(now, why)

    def on_forgotten(self, ref: str | None) -> None:
        self.forgotten(ref)

    def on_message(self, msg: p.Message, now: float) -> str | None:
        """A message from the queen for this client: what it means becomes actions."""
        kind, b = msg.kind, msg.b
        if kind in _TASK_UPDATES:
            self._task_message(kind, b)
        elif kind == "task.batch":
            for item in b["results"]:
                if isinstance(item, dict):
                    k = item.pop("kind", "task.result")
                    if k == "task.result" or k == "task.progress":
                        self._task_message(k, item)
        elif kind in _REPLIES:
            self.answered(msg.ref or "")
            self.out.append(Reply(msg.ref or "", kind, b))
        elif kind == "task.update":
            self.out.append(Followed(b))
        elif kind == "task.submitted":
            self.out.append(Submitted(b["task"]))
        elif kind in ("graph.submitted", "graph.node"):
            self.out.append(GraphEvent(kind, msg))
        elif kind == "graph.result":
            if self.graph_ended(b["graph"]):
                self.out.append(GraphEvent(kind, msg))
        elif kind in ("msg", "note", "msg.receipt"):
            self.out.append(Delivered(msg))
        return None

    def _task_message(self, kind: str, b: dict[str, Any]) -> None:
        if not self.update(kind, b) and is_graph_node(str(b.get("task", ""))):
            self.out.append(NodeUpdate(kind, b))

    def on_error(self, msg: p.Message, now: float) -> str | None:
        """An ``error`` from the queen: a pending task's refusal (sent again later, or
        :class:`Ended`), a graph's or a request's, or nobody's (:class:`Refusal`, and a
        line to log)."""
        ref = msg.ref
        about = self.error(ref, dict(msg.b), now)
        if about == "request":
            assert ref is not None
            self.requests.pop(ref, None)
            self.out.append(RequestFailed(ref, msg.b))
        elif about == "graph":
            self.out.append(GraphEvent("error", msg))
        elif about is None:
            self.out.append(Refusal(msg))
            return f"queen says {msg.b['code']}: {msg.b['message']}"
        return None

    # -- from the caller ------------------------------------------------------------------

    def submit(self, task_id: str, frames: list[bytes], now: float,
               size: int | None = None) -> None:
        """A submission: kept (for re-sending) until its task ends, and sent (``size``:
        its frames' bytes, if the caller counted them)."""
        if size is None:
            size = sum(len(f) for f in frames)
        self.tasks[task_id] = Pending(frames, size, now)
        self.outbox.append(frames)

    def submit_graph(self, graph_id: str, frames: list[bytes], now: float) -> None:
        self.graphs[graph_id] = Pending(frames, sum(len(f) for f in frames), now)
        self.outbox.append(frames)

    def request(self, msg: p.Message) -> None:
        """A request that waits for an answer (status, a task's state...)."""
        self.requests[msg.id] = msg
        self.outbox.append(msg)

    def answered(self, msg_id: str) -> None:
        """The caller has its answer (or gave up): forget the request."""
        self.requests.pop(msg_id, None)

    def send(self, item: Item) -> None:
        """Anything else: sent once, in order."""
        self.outbox.append(item)

    def forget(self, task_id: str) -> None:
        """The caller no longer waits for this task."""
        self.tasks.pop(task_id, None)

    def graph_ended(self, graph_id: str) -> bool:
        """A graph's end came; False if it is not a pending graph's (a repeat: the queen
        answers a graph sent again after it ended with its end again)."""
        return self.graphs.pop(graph_id, None) is not None

    # -- from the queen -------------------------------------------------------------------

    def update(self, kind: str, body: dict[str, Any]) -> bool:
        """A task's progress, partial result, question or final result. False when it is
        not a pending task's (a graph node's, or an attached one's: the caller routes
        it) or a repeat; a pending task's new one becomes an action."""
        task_id = body.get("task", "")
        pend = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if pend is None:
            return False
        seq = body.get("seq", 0)
        final = kind == "task.result" and not body.get("partial")
        if seq <= pend.last_seq and not final:
            return True  # exactly once: a repeat of something already seen is dropped
        # (A final result ends a pending task whatever its number: a queen that lost the
        # task's numbering — a power cut took back its last commits — numbers afresh,
        # and its result must not be taken for a repeat. Only one ever ends it.)
        pend.last_seq = max(pend.last_seq, seq)
        if final:
            self.forget(task_id)
            self.out.append(Ended(task_id, body))
        else:
            self.out.append(Update(task_id, kind, body))
        return True

    def error(self, ref: str | None, body: dict[str, Any], now: float) -> str | None:
        """An ``error`` from the queen about ``ref``: returns what it was about — "task"
        (handled here: sent again later, or :class:`Ended`), "graph" or "request" (the
        caller routes it), or None (nobody's)."""
        if ref is None:
            return None
        pend = self.tasks.get(ref)
        if pend is not None:
            if not self._back_off(ref, pend, body, now):
                self.forget(ref)
                self.out.append(Ended(ref, None, body))
            return "task"
        if ref in self.graphs:
            self.graphs.pop(ref)
            return "graph"
        if ref in self.requests:
            return "request"
        return None

    def forgotten(self, ref: str | None) -> None:
        """The queen refused message ``ref`` as from a peer it does not know (it
        restarted, or forgot an idle client): a request goes again once it welcomed us
        back (a submission goes again anyway)."""
        msg = self.requests.get(ref or "")
        if msg is not None and not any(m is msg for m in self._resend):  # (heard twice)
            self._resend.append(msg)

    def _back_off(self, task_id: str, pend: Pending, err: dict[str, Any], now: float) -> bool:
        """A refusal that time cures (rate-limited; queue-full if asked to): send the
        submission again after the queen's ``retry_after`` (or the backoff), jittered,
        pausing the others meanwhile. False once ``submit_timeout`` has passed, or for
        other errors."""
        code = err.get("code")
        if code != Code.RATE_LIMITED and not (code == Code.QUEUE_FULL and self.retry_queue_full):
            return False
        if now - pend.submitted >= self.submit_timeout:
            if code == Code.RATE_LIMITED:
                err["message"] = (f"the queen refused the submission as too fast for "
                                  f"{self.submit_timeout:g} s: {err.get('message', '')}")
            return False
        pend.refusals += 1
        after = err.get("retry_after")
        if not isinstance(after, int | float) or after <= 0:
            after = self.backoff.ceiling(min(pend.refusals, 6))
        # Space the refused submissions out at about the pace the queen names (one per
        # retry_after), rather than send them all again together to be refused again.
        delay = max(float(after), 0.001) * (1 + len(self._retry)) * (
            1 + self.backoff.rng.uniform(0.0, 0.25))
        heapq.heappush(self._retry, (now + delay, task_id))
        self._hold_until = max(self._hold_until, now + delay)
        return True

    # -- the session's turns --------------------------------------------------------------

    def welcomed(self, first: bool) -> None:
        self._lost_at = None
        if not first:
            # Back after losing the queen (or being forgotten by it): every pending
            # submission goes again, in order, with its own id. Whatever of them still
            # sat in the outbox goes with them, not twice. The queen answers an id it
            # holds as the same task (with its result, if it has finished), and runs
            # one it never saw.
            kept = [m for m in self.outbox if isinstance(m, p.Message)]
            waiting = {m.id for m in kept}
            self.outbox.clear()
            self._retry.clear()
            self.outbox.extend(pend.frames for pend in self.tasks.values())
            self.outbox.extend(pend.frames for pend in self.graphs.values())
            # Requests sent to the lost queen: asked again, or failed now (_ASK_AGAIN).
            # One the new queen refused as from a stranger (forgotten) was not carried
            # out: it goes again below, whatever its kind, and only once.
            waiting.update(m.id for m in self._resend)
            for msg in list(self.requests.values()):
                if msg.id in waiting:
                    continue  # (never sent, or refused unread: it goes again as it is)
                if asks_again(msg):
                    kept.append(msg)
                else:
                    del self.requests[msg.id]
                    self.out.append(RequestFailed(msg.id, {
                        "code": Code.QUEEN_LOST,
                        "message": f"the queen was lost before it answered this {msg.kind} "
                                   "request: it may have been carried out; check, then ask "
                                   "again"}))
            self.outbox.extend(kept)
        resend, self._resend = self._resend, []
        self.outbox.extend(resend)

    def lost(self, now: float, why: str) -> None:
        if self._lost_at is None:
            self._lost_at = now
            self._lost_why = why

    def flush(self, now: float, limit: int = FLUSH_MAX) -> list[Item]:
        """What to send now, at most ``limit`` items (nothing while the queen asked us
        to slow down)."""
        if self._hold_until and now < self._hold_until:
            return []
        outbox = self.outbox
        if len(outbox) <= limit:
            out = list(outbox)
            outbox.clear()
            return out
        return [outbox.popleft() for _ in range(limit)]

    def unsent(self, items: list[Item]) -> None:
        """The connection could not take these (from ``flush``): first next time."""
        self.outbox.extendleft(reversed(items))

    def tick(self, now: float, patience: float = 0.0, welcomed: bool = True) -> None:
        retry = self._retry
        if retry and retry[0][0] <= now:
            while retry and retry[0][0] <= now:
                task_id = heapq.heappop(retry)[1]
                pend = self.tasks.get(task_id)
                if pend is not None:
                    self.outbox.append(pend.frames)
        if self._hold_until and now >= self._hold_until:
            self._hold_until = 0.0
        lost = self._lost_at
        if lost is not None and now - lost >= self.queen_wait and (self.tasks or self.graphs):
            self.out.append(GiveUp(self._lost_why, now - lost))
            for task_id in list(self.tasks):
                self.forget(task_id)
            self.graphs.clear()
            self._retry.clear()

    def next_deadline(self) -> float:
        t = float("inf")
        if self._retry:
            t = self._retry[0][0]
        if self._hold_until and self.outbox:
            t = min(t, self._hold_until)
        if self._lost_at is not None and (self.tasks or self.graphs):
            t = min(t, self._lost_at + self.queen_wait)
        return t


__all__ = ["Action", "ClientSession", "Delivered", "Ended", "Followed", "GiveUp", "GraphEvent",
           "Item", "NodeUpdate", "Pending", "Refusal", "Reply", "RequestFailed", "Submitted",
           "Update"]
