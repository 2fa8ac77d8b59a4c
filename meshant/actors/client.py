"""The client: submits tasks to the queen and gets their results as futures.

``Client`` is thread-safe by default: any thread may submit; one I/O thread owns the
socket. ``Client(threaded=False)`` has no I/O thread: the calling thread drives the socket
whenever it submits or waits, which saves two thread hand-offs per task (the lowest
latency for a single-threaded caller). A submission's future and updates are
:mod:`meshant.actors.futures`; ``AsyncClient`` (:mod:`meshant.actors.async_client`) wraps
the threaded client for asyncio.
"""

from __future__ import annotations

import heapq
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import zmq

from meshant import protocol as p
from meshant.actors._peer import Peer
from meshant.actors.attach import Attachment, Conversations
from meshant.actors.config import ClientConfig, settle
from meshant.actors.futures import TaskFuture, Update, fail
from meshant.actors.graphs import GraphClient
from meshant.errors import (
    MeshantError,
    QueenUnreachable,
    QueueFull,
    TooLarge,
    from_error_body,
)
from meshant.observe import tracing
from meshant.protocol.codes import Code

log = logging.getLogger("meshant.client")


class Client(Conversations, Peer, GraphClient):
    """Connects to a queen and submits tasks.

    Settings come as a :class:`~meshant.ClientConfig` (``config=``) or as keyword
    arguments of the same names (docs/configuration.md lists them):

    ``timeout``: seconds to wait for the queen's welcome (else QueenUnreachable).
    ``wait``: default seconds the queen waits for a forager offering a capability.
    ``on_progress``: called as ``fn(task_id, update)`` (in the I/O thread) for each progress
    report and partial result. ``threaded=False``: no I/O thread (see the module doc).
    ``queen_wait``: when the queen goes silent, pending futures fail with
    QueenUnreachable after this many seconds unless it comes back first.
    ``queen=None`` (and no ``MESHANT_QUEEN``), or ``discover=True``: find the queen of
    ``colony`` (or the only colony) by mDNS, and follow it if it moves.

    Every submission stays in the client until its task ends (a bounded outbox of
    ``max_pending_bytes`` encoded bytes; beyond it ``submit`` raises QueueFull at once) and
    is sent again, with the same task id, after a reconnect: the queen treats an id it
    already holds as the same task. A submission the queen refuses as ``rate-limited`` is
    sent again after the ``retry_after`` it names (with jitter), for at most
    ``submit_timeout`` seconds; ``retry_queue_full=True`` does the same for ``queue-full``.
    """

    role = "client"

    def __init__(
        self,
        queen: str | None = None,
        *,
        config: ClientConfig | None = None,
        on_progress: Callable[[str, Update], Any] | None = None,
        context: zmq.Context[Any] | None = None,
        **settings: Any,
    ) -> None:
        c = self.config = settle(ClientConfig, config, settings)
        super().__init__(queen, c.name, context, c.colony, c.discover, c.curve_secret,
                         c.queen_key, c.follow_leader)
        timeout, threaded, wait = c.timeout, c.threaded, c.wait
        queen_wait, submit_timeout = c.queen_wait, c.submit_timeout
        retry_queue_full, max_pending_bytes = c.retry_queue_full, c.max_pending_bytes
        self.wait = wait
        self.on_update = on_progress
        self.threaded = threaded
        self._tasks: dict[str, TaskFuture] = {}
        self._requests: dict[str, Future[Any]] = {}
        self._request_msgs: dict[str, p.Message] = {}
        self._resend: list[p.Message] = []
        self._lost_at: float | None = None
        self._lost_why = ""
        self.queen_wait = queen_wait
        self.submit_timeout = submit_timeout
        self.retry_queue_full = retry_queue_full
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        # Refused submissions waiting to be sent again: (when, task id); and a pause on
        # every submission while the queen asks us to slow down.
        self._retry: list[tuple[float, str]] = []
        self._hold_until = 0.0
        self._pump = None if threaded else self._pump_until
        self.inbox: queue.SimpleQueue[p.Message] = queue.SimpleQueue()
        self._handlers.update({
            "task.submitted": self._on_submitted,
            "task.result": self._on_result,
            "task.batch": self._on_batch,
            "task.progress": self._on_progress,
            "task.state": self._on_reply,
            "status.reply": self._on_reply,
            "tool.reply": self._on_reply,
            "dlq.reply": self._on_reply,
            "msg": self._on_inbox,
            "note": self._on_inbox,
            "msg.receipt": self._on_inbox,
            # Conversations (meshant.actors.attach): questions, answers, attached streams.
            "task.ask": self._on_ask,
            "task.update": self._on_update,
            "task.answered": self._on_reply,
            "task.attached": self._on_reply,
            "inbox.reply": self._on_reply,
        })
        self._attached: dict[str, list[Attachment]] = {}
        # The queen's refusals of messages that wait for no answer (drain, halt, msg).
        self.refusals: deque[p.Message] = deque(maxlen=100)
        self._graph_init()  # task graphs: actors/graphs.py
        if threaded:
            self._start_io(timeout)
        else:
            self._start_direct(timeout)

    # -- direct mode: the caller's thread drives the socket -------------------------------

    def _start_direct(self, timeout: float) -> None:
        self._find_queen(timeout)
        self._io_ident = threading.get_ident()
        self._open_socket()
        now = time.monotonic()
        self._sess.start(now)
        self._act(now)
        try:
            self._pump_until(self._welcomed.is_set, timeout)
        except TimeoutError:
            pass
        if not self._welcomed.is_set() or self._refusal is not None:
            err = self._refusal
            self._close_direct()
            if err is not None:
                raise err
            raise self._unreachable(timeout)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._io_ident:
            raise RuntimeError("a Client(threaded=False) belongs to the thread that made it; "
                               "share the default threaded Client between threads instead")

    def _pump_until(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Read and dispatch messages until ``done()`` or ``timeout`` (TimeoutError)."""
        self._check_owner()
        poll = self._poller.poll
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if self._stopped.is_set():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError("timed out waiting for the queen")
            wait = self._next_wakeup() - now
            if deadline is not None:
                wait = min(wait, deadline - now)
            self._turn(dict(poll(int(max(0.0, wait) * 1000))))

    def _close_direct(self) -> None:
        if not self._stopped.is_set():
            self._teardown()

    def send_message(self, msg: p.Message | list[bytes]) -> None:
        if self._died is not None:
            raise self._died
        if self.threaded:
            super().send_message(msg)
            return
        self._check_owner()
        if self._welcomed.is_set() and not self._outbox and time.monotonic() >= (
                self._hold_until):
            try:
                if self._send_now(msg):
                    return
            except p.ProtocolError as e:
                self._unsendable(msg, e)
                return
        self._outbox.append(msg)

    def _flush(self, outbox: Any) -> None:
        if self._hold_until and time.monotonic() < self._hold_until:
            return  # the queen asked us to slow down: everything waits its turn
        super()._flush(outbox)

    def _refused_unregistered(self, ref: str | None) -> None:
        msg = self._request_msgs.get(ref or "")
        if msg is not None:
            self._resend.append(msg)

    def _after_welcome(self, first: bool) -> None:
        self._lost_at = None
        if not first:
            # Back after losing the queen (or being forgotten by it): every pending
            # submission goes again, in order, with its own id. Whatever of them still
            # sat in the outbox goes with them, not twice. The queen answers an id it
            # holds as the same task (with its result, if it has finished), and runs
            # one it never saw.
            kept = [m for m in self._outbox if isinstance(m, p.Message)]
            self._outbox.clear()
            self._retry.clear()
            for fut in list(self._tasks.values()):
                if fut._frames is not None:
                    self._outbox.append(fut._frames)
            self._outbox.extend(self._graph_frames())
            self._outbox.extend(kept)
        resend, self._resend = self._resend, []
        for msg in resend:
            self._outbox.append(msg)
        if self._outbox:
            self._flush(self._outbox)

    def _queen_lost(self, now: float, why: str) -> None:
        if self._lost_at is None:
            self._lost_at = now
            self._lost_why = why

    def _next_timer(self) -> float:
        t = super()._next_timer()
        if self._retry:
            t = min(t, self._retry[0][0])
        if self._hold_until and self._outbox:
            t = min(t, self._hold_until)
        return t

    def _on_timers(self, now: float) -> None:
        if self._retry and self._retry[0][0] <= now:
            due = []
            while self._retry and self._retry[0][0] <= now:
                due.append(heapq.heappop(self._retry)[1])
            for task_id in due:
                fut = self._tasks.get(task_id)
                if fut is not None and fut._frames is not None:
                    self._outbox.append(fut._frames)
        if self._hold_until and now >= self._hold_until:
            self._hold_until = 0.0
        if self._outbox and self._welcomed.is_set():
            self._flush(self._outbox)
        lost = self._lost_at
        if lost is not None and now - lost >= self.queen_wait and self._tasks:
            err = QueenUnreachable(
                f"the queen at {self.queen} has been unreachable for {now - lost:.0f} s "
                f"({self._lost_why}); whether it received or ran the task is unknown",
                code=Code.QUEEN_LOST)
            self._fail_pending(err)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect. Futures still pending fail with a clear error."""
        if self.threaded:
            super().close(timeout)
        elif threading.get_ident() == self._io_ident:
            self._close_direct()
        self._fail_pending(MeshantError("the client was closed before the task finished",
                                        code=Code.CLOSED))

    def _io_died(self, e: BaseException) -> None:
        super()._io_died(e)
        assert self._died is not None
        self._fail_pending(self._died)

    def _end(self, fut: TaskFuture) -> None:
        """The task is over for this client: forget it and its kept submission."""
        if self._tasks.pop(fut.task_id, None) is not None:
            with self._pending_lock:
                self._pending_bytes -= fut._size
        fut._frames = None
        fut._updates.put(None)

    def _fail_task(self, fut: TaskFuture, err: MeshantError) -> None:
        """The task is over for this client, failed with ``err`` (unless it has its
        outcome already)."""
        self._end(fut)
        fail(fut, err)

    def _fail_pending(self, err: MeshantError) -> None:
        for fut in list(self._tasks.values()):
            self._fail_task(fut, err)
        for rf in list(self._requests.values()):
            fail(rf, err)
        self._graphs_failed(err)

    # -- tasks ----------------------------------------------------------------------------

    def submit(
        self,
        capability: str,
        payload: Any = None,
        *,
        priority: int = 50,
        timeout: float | None = None,
        to: str | None = None,
        labels: dict[str, Any] | None = None,
        max_attempts: int | None = None,
        wait: float | None = None,
        ack: bool = False,
        key: str | None = None,
        retry_base: float | None = None,
        retry_cap: float | None = None,
    ) -> TaskFuture:
        """Submit a task; the future resolves to its result or raises a MeshantError.

        ``priority`` 0-99 (lower first); ``timeout`` the run-time limit in seconds;
        ``to`` a forager name; ``labels`` the forager labels required; ``wait`` how long
        the queen waits for a forager offering ``capability`` before failing with
        :class:`~meshant.errors.NoForager`. ``ack=True`` asks the queen to confirm the
        submission (``TaskFuture.acknowledged``); errors such as a full queue are always
        reported. ``key`` is an idempotency key: submitting the same key again (from any
        client, also after a queen restart on its journal) does not run the task again
        but gets the first submission's result. ``retry_base``/``retry_cap`` set this
        task's retry backoff (a random wait up to ``min(cap, base * 2**n)``).
        """
        if self._died is not None:
            raise self._died
        if self._stopped.is_set():
            raise MeshantError("the client is closed", code=Code.CLOSED)
        if not 0 <= priority <= 99:
            raise ValueError("priority must be between 0 and 99")
        body: dict[str, Any] = {"capability": capability, "payload": p.wrap_blob(payload)}
        if priority != 50:
            body["priority"] = priority
        if timeout is not None:
            body["timeout"] = timeout
        if to is not None:
            body["to"] = to
        if labels:
            body["labels"] = labels
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        w = wait if wait is not None else self.wait
        if w is not None:
            body["wait"] = w
        if ack:
            body["ack"] = True
        if key is not None:
            body["key"] = key
        if retry_base is not None:
            body["retry_base"] = retry_base
        if retry_cap is not None:
            body["retry_cap"] = retry_cap
        msg = p.Message("task.submit", body, frm=self.name, to="queen")
        tp = tracing.current()
        if tp is not None:  # the caller's span is the parent of the task's (meshant[otel])
            msg.extra = {tracing.TRACEPARENT: tp}
        try:
            frames = self._encode(msg)
        except p.ProtocolError as e:
            if e.code == Code.TOO_LARGE:
                raise TooLarge(f"cannot submit {capability!r}: {e.message}") from None
            raise ValueError(f"cannot submit {capability!r}: {e.message}") from None
        fut = TaskFuture(msg.id, frames, self._pump)
        if self._pending_bytes + fut._size > self.max_pending_bytes and self._tasks:
            raise QueueFull(
                f"the client holds {len(self._tasks)} unfinished submissions of "
                f"{self._pending_bytes:,} bytes, its limit (max_pending_bytes="
                f"{self.max_pending_bytes:,}): wait for some results first")
        fut._submitted = time.monotonic()
        with self._pending_lock:
            self._pending_bytes += fut._size
        self._tasks[msg.id] = fut
        self.send_message(frames)
        return fut

    def map(self, capability: str, payloads: Iterable[Any], **kw: Any) -> list[TaskFuture]:
        """Submit one task per payload; returns their futures in order."""
        return [self.submit(capability, pl, **kw) for pl in payloads]

    def run(self, capability: str, payload: Any = None, *, result_timeout: float | None = None,
            **kw: Any) -> Any:
        """Submit and wait for the result."""
        return self.submit(capability, payload, **kw).result(result_timeout)

    def cancel(self, task_id: str) -> None:
        """Cancel a task: at once if queued, best effort if running."""
        self.send_message(p.Message("task.cancel", {"task": task_id}, to="queen"))

    # -- queries --------------------------------------------------------------------------

    def _request(self, kind: str, body: dict[str, Any] | None,
                 timeout: float) -> dict[str, Any]:
        msg = p.Message(kind, body, frm=self.name, to="queen")
        fut: Future[Any] = Future()
        self._requests[msg.id] = fut
        self._request_msgs[msg.id] = msg
        self.send_message(msg)
        try:
            if self._pump is not None:
                self._pump(fut.done, timeout)
            return fut.result(0 if self._pump is not None else timeout)  # type: ignore[no-any-return]
        except TimeoutError:
            raise MeshantError(f"no answer to {kind} within {timeout:g} s",
                               code=Code.TIMEOUT) from None
        finally:
            self._requests.pop(msg.id, None)
            self._request_msgs.pop(msg.id, None)

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The queen's registry, queue depths and counters."""
        return self._request("status.query", None, timeout)

    def task_status(self, task_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """One task's state and history as the queen sees it."""
        return self._request("task.status", {"task": task_id}, timeout)

    def tool_query(self, tool: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Which live foragers serve ``tool``, with their slots and labels."""
        return list(self._request("tool.query", {"tool": tool}, timeout)["foragers"])

    def dlq(self, op: str = "list", task: str | None = None, *, all: bool = False,
            timeout: float = 5.0) -> dict[str, Any]:
        """The dead-letter queue: ``op`` is list, show, retry or purge (of ``task``, or
        ``all=True``). retry submits the work again as new tasks (their ids returned)."""
        body: dict[str, Any] = {"op": op}
        if task is not None:
            body["task"] = task
        if all:
            body["all"] = True
        return self._request("dlq", body, timeout)

    def drain(self, forager: str | list[str]) -> None:
        """Ask a forager to finish its running tasks, take no new ones, then leave."""
        self.send_message(p.Message("ctl.drain", {}, frm=self.name, to=forager))

    def halt(self, forager: str | list[str]) -> None:
        """Stop a forager at once; the queen reissues its running tasks elsewhere."""
        self.send_message(p.Message("ctl.halt", {}, frm=self.name, to=forager))

    def send(self, to: str | list[str], body: dict[str, Any] | None = None, *,
             receipt: bool = False, ttl: float | None = None) -> str:
        """Send a directed message to one agent or several, routed by the queen; a name
        not connected gets it when it registers (kept at most ``ttl`` seconds). With
        ``receipt``, a ``msg.receipt`` (delivered, or expired) comes to ``inbox``.
        Returns the message id."""
        msg = p.Message("msg", body or {}, frm=self.name, to=to, extra=_extra(receipt, ttl))
        self.send_message(msg)
        return msg.id

    def note(self, to: str | list[str], text: str, *, receipt: bool = False,
             ttl: float | None = None) -> str:
        """Send a one-line note (at most 80 characters); as :meth:`send` otherwise."""
        try:
            p.validate_body(p.BY_NAME["note"], {"text": text})
        except p.ProtocolError as e:
            raise ValueError(e.message) from None
        msg = p.Message("note", {"text": text}, frm=self.name, to=to,
                        extra=_extra(receipt, ttl))
        self.send_message(msg)
        return msg.id

    # -- I/O thread -----------------------------------------------------------------------

    def _on_submitted(self, msg: p.Message) -> None:
        fut = self._tasks.get(msg.b["task"])
        if fut is not None:
            fut.acknowledged = True

    def _on_progress(self, msg: p.Message) -> None:
        b = msg.b
        fut = self._tasks.get(b.get("task", ""))
        seq = b.get("seq", 0)
        if fut is None and self._graphs:
            self._graph_task(b, "task.progress")
        if fut is None or seq <= fut.last_seq:
            return
        fut.last_seq = seq
        u = Update("progress", seq, fraction=b.get("fraction"), note=b.get("note"))
        fut._updates.put(u)
        if self.on_update is not None:
            self._callback(fut, u)

    def _callback(self, fut: TaskFuture, u: Update) -> None:
        """Call the user's on_progress; its exception is logged and reported on the task's
        updates, and never reaches (or stops) the I/O thread."""
        assert self.on_update is not None
        try:
            self.on_update(fut.task_id, u)
        except Exception as e:
            log.exception("%s: on_progress callback failed for task %s", self.name,
                          fut.task_id)
            fut._updates.put(Update("callback-error", u.seq,
                                    note=f"on_progress raised {type(e).__name__}: {e}"))

    def _on_batch(self, msg: p.Message) -> None:
        for item in msg.b["results"]:
            if isinstance(item, dict):
                self._result(item)

    def _on_result(self, msg: p.Message) -> None:
        self._result(msg.b)

    def _result(self, b: dict[str, Any]) -> None:
        fut = self._tasks.get(b.get("task", ""))
        seq = b.get("seq", 0)
        if fut is None and self._graphs:
            self._graph_task(b, "task.result")
        if fut is None or seq <= fut.last_seq:
            return  # exactly once: a repeat of something already seen is dropped
        fut.last_seq = seq
        if b.get("partial"):
            u = Update("partial", seq, value=p.unwrap_blob(b.get("value")))
            fut._updates.put(u)
            if self.on_update is not None:
                self._callback(fut, u)
            return
        if b.get("state") != "completed":
            self._fail_task(fut, from_error_body(b.get("error") or {}))
            return
        self._end(fut)
        if not fut.done():
            fut.set_result(p.unwrap_blob(b.get("result")))

    def _on_reply(self, msg: p.Message) -> None:
        fut = self._requests.get(msg.ref or "")
        if fut is not None and not fut.done():
            fut.set_result(msg.b)

    def _back_off(self, fut: TaskFuture, err: dict[str, Any]) -> bool:
        """A refusal that time cures (rate-limited; queue-full if asked to): send the
        submission again after the queen's ``retry_after`` (jittered), pausing the
        others meanwhile. False once ``submit_timeout`` has passed, or for other errors."""
        code = err.get("code")
        if code != Code.RATE_LIMITED and not (code == Code.QUEUE_FULL and self.retry_queue_full):
            return False
        now = time.monotonic()
        if now - fut._submitted >= self.submit_timeout:
            if code == Code.RATE_LIMITED:
                err = {**err, "message": f"the queen refused the submission as too fast for "
                       f"{self.submit_timeout:g} s: {err.get('message', '')}"}
                fail(fut, from_error_body(err))
            return False
        fut._refusals += 1
        after = err.get("retry_after")
        if not isinstance(after, int | float) or after <= 0:
            after = min(2.0, 0.05 * 2 ** min(fut._refusals, 6))
        # Space the refused submissions out at about the pace the queen names (one per
        # retry_after), rather than send them all again together to be refused again.
        delay = max(float(after), 0.001) * (1 + len(self._retry)) * random.uniform(1.0, 1.25)
        heapq.heappush(self._retry, (now + delay, fut.task_id))
        self._hold_until = max(self._hold_until, now + delay)
        return True

    def _on_inbox(self, msg: p.Message) -> None:
        self.inbox.put(msg)

    def _on_remote_error(self, msg: p.Message) -> None:
        ref = msg.ref or ""
        fut = self._tasks.get(ref)
        if fut is not None:
            if not self._back_off(fut, msg.b):
                self._fail_task(fut, from_error_body(msg.b))
            return
        rf = self._requests.get(ref)
        if rf is not None and not rf.done():
            fail(rf, from_error_body(msg.b))
            return
        if self._graphs and self._graph_error(ref, from_error_body(msg.b)):
            return
        self.refusals.append(msg)  # e.g. a drain refused as forbidden: for the CLI to tell
        super()._on_remote_error(msg)


def _extra(receipt: bool, ttl: float | None) -> dict[str, Any] | None:
    """Envelope fields of a directed message (peers that do not know them ignore them)."""
    extra: dict[str, Any] = {}
    if receipt:
        extra["receipt"] = True
    if ttl is not None:
        extra["ttl"] = float(ttl)
    return extra or None


__all__ = ["Client", "TaskFuture", "Update"]
