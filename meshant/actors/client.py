"""The client: submits tasks to the queen and gets their results as futures.

``Client`` is thread-safe by default: any thread may submit; one I/O thread owns the
socket. ``Client(threaded=False)`` has no I/O thread: the calling thread drives the socket
whenever it submits or waits, which saves two thread hand-offs per task (the lowest
latency for a single-threaded caller). What it keeps, sends again and when, and what the
queen's answers mean, is decided by a sans-IO
:class:`~meshant.core.peers.client_session.ClientSession`; this class holds the futures
(:mod:`meshant.actors.futures`), graph handles (:mod:`meshant.actors.graphs`) and
attachments (:mod:`meshant.actors.attach`). ``AsyncClient``
(:mod:`meshant.actors.async_client`) wraps the threaded client for asyncio.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypedDict, TypeVar, Unpack, overload

import zmq

from meshant import protocol as p
from meshant.actors._boundary import translated
from meshant.actors._peer import Peer
from meshant.actors.attach import Attachment, apply, conclude, feed
from meshant.actors.capability import Capability, capability_name
from meshant.actors.config import ClientConfig, settle
from meshant.actors.futures import TaskFuture, Update, fail
from meshant.actors.graphs import ClientGraphs, GraphHandle, nodes_of
from meshant.core.peers import client_session as cs_
from meshant.core.peers.client_session import ClientSession
from meshant.core.peers.link import Item
from meshant.core.tasks import delays
from meshant.errors import (
    BadInput,
    MeshantError,
    QueenUnreachable,
    QueueFull,
    Timeout,
    TooLarge,
    from_error_body,
)
from meshant.observe import tracing
from meshant.protocol.codes import Code

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("meshant.client")


class SubmitOptions(TypedDict, total=False):
    """The options of :meth:`Client.submit` (and ``run``, ``map``), as keyword arguments."""

    priority: int
    timeout: float | None
    to: str | None
    labels: dict[str, Any] | None
    max_attempts: int | None
    wait: float | None
    ack: bool
    key: str | None
    retry_base: float | None
    retry_cap: float | None
    retry_on: Iterable[str | type[BaseException]] | bool | None
    at: datetime | float | None
    after: float | timedelta | str | None
    concurrency: tuple[str, int] | None
    cost: float | None


def _delay_fields(at: datetime | float | None, after: float | timedelta | str | None
                  ) -> dict[str, float]:
    """``at``/``after`` as the wire carries them (core/tasks/delays.py); BadInput, one
    line, for what is not a time or a duration."""
    if at is not None and after is not None:
        raise BadInput("submit takes at= (a time) or after= (a duration), not both")
    if at is not None:
        if isinstance(at, datetime):
            return {"at": at.timestamp()}  # (a naive datetime is local time)
        if at.__class__ in (int, float) and math.isfinite(at) and at >= 0:
            return {"at": float(at)}
        raise BadInput(f"at= is a datetime or wall-clock seconds since 1970, not {at!r}")
    if after is None:
        return {}
    try:
        if isinstance(after, timedelta):
            seconds = after.total_seconds()
        elif isinstance(after, str):
            seconds = delays.parse_duration(after)
        elif after.__class__ in (int, float):
            seconds = float(after)
        else:
            raise ValueError(f"after= is seconds, a timedelta or a duration ('5m'), not "
                             f"{after!r}")
        if not 0 <= seconds <= delays.MAX_DELAY:
            raise ValueError(f"after= is 0 to 366 days, not {seconds!r} s")
    except ValueError as e:
        raise BadInput(str(e)) from None
    return {"after": seconds} if seconds > 0 else {}


def _retry_names(retry_on: Iterable[str | type[BaseException]] | bool) -> list[str]:
    """``retry_on`` as the wire carries it: exception type names, ``["*"]`` for any."""
    if retry_on is True:
        return ["*"]
    if isinstance(retry_on, (str, type)):
        retry_on = [retry_on]
    try:
        names = [t.__name__ if isinstance(t, type) else t for t in retry_on]  # type: ignore[union-attr]
    except TypeError:
        names = [None]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise BadInput(f"retry_on is exception classes or their names, or True, not "
                       f"{retry_on!r}")
    return names


class Client(Peer):
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

    @translated("the client")
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
        self.wait = c.wait
        self.on_update = on_progress
        self.threaded = c.threaded
        self.queen_wait = c.queen_wait
        self.submit_timeout = c.submit_timeout
        self.retry_queue_full = c.retry_queue_full
        self.max_pending_bytes = c.max_pending_bytes
        self._cs = ClientSession(queen_wait=c.queen_wait, submit_timeout=c.submit_timeout,
                                 retry_queue_full=c.retry_queue_full)
        self._tasks: dict[str, TaskFuture[Any]] = {}
        self._requests: dict[str, Future[Any]] = {}
        self._graphs = ClientGraphs()
        self._attached: dict[str, list[Attachment]] = {}
        # Bytes of the submissions kept for re-sending (checked in the caller's thread).
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        if not c.threaded:
            self.pump = self._pump_until
        self.inbox: queue.SimpleQueue[p.Message] = queue.SimpleQueue()
        # The queen's refusals of messages that wait for no answer (drain, halt, msg).
        self.refusals: deque[p.Message] = deque(maxlen=100)
        self._make_link(self._cs)
        if c.threaded:
            self._start_io(c.timeout)
        else:
            self._start_direct(c.timeout)

    # -- direct mode: the caller's thread drives the socket -------------------------------

    def _start_direct(self, timeout: float) -> None:
        self.finder.find(timeout)
        self._io_ident = threading.get_ident()
        self.link.start(time.monotonic())
        try:
            self._pump_until(self._welcomed.is_set, timeout)
        except TimeoutError:
            pass
        if not self._welcomed.is_set() or self._refusal is not None:
            err = self._refusal
            self._close_direct()
            if err is not None:
                raise err
            raise self.finder.unreachable(timeout)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._io_ident:
            raise RuntimeError("a Client(threaded=False) belongs to the thread that made it; "
                               "share the default threaded Client between threads instead")

    @translated("the client")
    def _pump_until(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Read and dispatch messages until ``done()`` or ``timeout`` (Timeout)."""
        self._check_owner()
        poll = self._poller.poll
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if self._stopped.is_set():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Timeout("timed out waiting for the queen")
            wait = self.link.next_wakeup() - now
            if deadline is not None:
                wait = min(wait, deadline - now)
            self._turn(dict(poll(int(max(0.0, wait) * 1000))))

    def _close_direct(self) -> None:
        if not self._stopped.is_set():
            self._teardown()

    @translated("the client")
    def send_message(self, msg: Item) -> None:
        if self._died is not None:
            raise self._died
        if not self.threaded:
            self._check_owner()
        super().send_message(msg)
        if not self.threaded:
            self._flush(time.monotonic())  # the lowest latency: now, not at the next pump

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @translated("the client")
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

    # -- the session ----------------------------------------------------------------------

    def _queue(self, item: Item) -> None:
        self._cs.send(item)

    def _after_turn(self) -> None:
        if self._cs.out:
            self._do(self._cs.take())

    def _do(self, actions: list[cs_.Action]) -> None:
        """Carry out what the client session decided."""
        for a in actions:
            match a:
                case cs_.Ended(task_id=task_id, body=body, error=error):
                    fut = self._tasks.get(task_id)
                    if fut is None:
                        continue
                    self._end(fut)  # (its updates end there)
                    if body is not None:
                        conclude(fut, body)
                    else:
                        fail(fut, from_error_body(error or {}))
                case cs_.Update(task_id=task_id, kind=kind, body=body):
                    fut = self._tasks.get(task_id)
                    if fut is not None:
                        u = apply(fut, kind, body)
                        if u is not None and self.on_update is not None:
                            self._callback(fut, u)
                case cs_.GiveUp(why=why, away=away):
                    self._fail_pending(QueenUnreachable(
                        f"the queen at {self.queen} has been unreachable for {away:.0f} s "
                        f"({why}); whether it received or ran the task is unknown",
                        code=Code.QUEEN_LOST))
                case cs_.Submitted(task_id=task_id):
                    fut = self._tasks.get(task_id)
                    if fut is not None:
                        fut.acknowledged = True
                case cs_.Reply(ref=ref, body=body):
                    rf = self._requests.get(ref)
                    if rf is not None and not rf.done():
                        rf.set_result(body)
                case cs_.RequestFailed(ref=ref, error=error):
                    rf = self._requests.get(ref)
                    if rf is not None and not rf.done():
                        fail(rf, from_error_body(error))
                case cs_.NodeUpdate(kind=kind, body=body):
                    self._graphs.on_task(body, kind)
                case cs_.GraphEvent(kind=kind, msg=msg):
                    self._graph_event(kind, msg)
                case cs_.Followed(body=body):
                    for att in list(self._attached.get(body["task"], ())):
                        feed(att, body["kind"], body["body"])
                        if att.done():
                            self._detach(att)
                case cs_.Delivered(msg=msg):
                    self.inbox.put(msg)
                case cs_.Refusal(msg=msg):
                    # e.g. a drain refused as forbidden: for the CLI to tell
                    self.refusals.append(msg)

    def _graph_event(self, kind: str, msg: p.Message) -> None:
        graphs = self._graphs
        if kind == "graph.submitted":
            graphs.on_submitted(msg)
        elif kind == "graph.node":
            graphs.on_node(msg)
        elif kind == "graph.result":
            graphs.on_result(msg)
        elif not graphs.on_error(msg.ref or "", from_error_body(msg.b)):
            self.refusals.append(msg)
            log.warning("%s: queen says %s: %s", self.name, msg.b["code"], msg.b["message"])

    def _end(self, fut: TaskFuture[Any]) -> None:
        """The task is over for this client: forget it and its kept submission."""
        if self._tasks.pop(fut.task_id, None) is not None:
            with self._pending_lock:
                self._pending_bytes -= fut._size
        fut._updates.put(None)

    def _fail_pending(self, err: MeshantError) -> None:
        for fut in list(self._tasks.values()):
            self._end(fut)
            fail(fut, err)
        for rf in list(self._requests.values()):
            fail(rf, err)
        self._graphs.fail_all(err)

    def _callback(self, fut: TaskFuture[Any], u: Update) -> None:
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

    # -- tasks ----------------------------------------------------------------------------

    @overload
    def submit(self, capability: Capability[Concatenate[T, P], R], payload: T,
               **options: Unpack[SubmitOptions]) -> TaskFuture[R]: ...

    @overload
    def submit(self, capability: str, payload: Any = None,
               **options: Unpack[SubmitOptions]) -> TaskFuture[Any]: ...

    @translated("the client")
    def submit(
        self,
        capability: str | Capability[Any, Any],
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
        retry_on: Iterable[str | type[BaseException]] | bool | None = None,
        at: datetime | float | None = None,
        after: float | timedelta | str | None = None,
        concurrency: tuple[str, int] | None = None,
        cost: float | None = None,
    ) -> TaskFuture[Any]:
        """Submit a task; the future resolves to its result or raises a MeshantError.
        ``capability``: its name, or a handler decorated with ``@forager.task`` (then
        the payload and result have the handler's types).

        ``priority`` 0-99 (lower first); ``timeout`` the run-time limit in seconds;
        ``to`` a forager name; ``labels`` the forager labels required; ``wait`` how long
        the queen waits for a forager offering ``capability`` before failing with
        :class:`~meshant.errors.NoForager`. ``ack=True`` asks the queen to confirm the
        submission (``TaskFuture.acknowledged``); errors such as a full queue are always
        reported. ``key`` is an idempotency key: submitting the same key again (from any
        client, also after a queen restart on its journal) does not run the task again
        but gets the first submission's result. ``retry_base``/``retry_cap`` set this
        task's retry backoff (a random wait up to ``min(cap, base * 2**n)``).

        An exception in the handler fails the task at once (a lost forager or an expired
        lease is retried while ``max_attempts`` last). ``retry_on`` retries handler
        exceptions too: exception classes or their names (``["TimeoutError"]``), or
        ``True`` for any; the handler's own ``retry_on`` is honoured as well.

        ``at`` (a datetime, or wall-clock seconds) or ``after`` (seconds, a timedelta, or
        ``"5m"``, ``"1h30m"``) delays the task: the queen journals it and starts it no
        earlier (on its own clock); until then it is ``delayed``, and can be cancelled.

        ``concurrency=(key, n)``: at most ``n`` tasks submitted with ``key`` run at once
        in the colony (the queen's own ``--limit`` rules hold as well); the others wait
        queued, ``task_status`` saying which limit holds them. ``cost``: the tokens this
        task takes from the queen's rate limits (``--limit llm=90000/min`` counts tokens
        a minute when each task says what it costs; default 1, a request).
        """
        if self._died is not None:
            raise self._died
        if self._stopped.is_set():
            raise MeshantError("the client is closed", code=Code.CLOSED)
        if not self.threaded:
            self._check_owner()
        if priority.__class__ is not int or not 0 <= priority <= 99:
            raise BadInput(f"priority is an int between 0 and 99, not {priority!r}")
        capability = capability_name(capability)
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
        if retry_on:
            body["retry_on"] = _retry_names(retry_on)
        if at is not None or after is not None:
            body.update(_delay_fields(at, after))
        if concurrency is not None:
            if not (isinstance(concurrency, tuple | list) and len(concurrency) == 2
                    and isinstance(concurrency[0], str) and 0 < len(concurrency[0]) <= 200
                    and concurrency[1].__class__ is int and 1 <= concurrency[1] <= 1_000_000):
                raise BadInput(f"concurrency is (key, n): a key of 1-200 characters and 1 to "
                               f"1,000,000 tasks at once, not {concurrency!r}")
            body["concurrency"] = {"key": concurrency[0], "max": concurrency[1]}
        if cost is not None:
            if cost.__class__ not in (int, float) or not 0 < cost <= 1e9:
                raise BadInput(f"cost is a number of tokens above 0, not {cost!r}")
            body["cost"] = cost
        msg = p.Message("task.submit", body, frm=self.name, to="queen")
        tp = tracing.current()
        if tp is not None:  # the caller's span is the parent of the task's (meshant[otel])
            msg.extra = {tracing.TRACEPARENT: tp}
        try:
            frames = self.link.encode(msg)
        except p.ProtocolError as e:
            if e.code == Code.TOO_LARGE:
                raise TooLarge(f"cannot submit {capability!r}: {e.message}") from None
            raise p.LocalProtocolError(e.code, f"cannot submit {capability!r}: "
                                       f"{e.message}") from None
        fut: TaskFuture[Any] = TaskFuture(msg.id, self.pump)
        fut._size = size = sum(len(f) for f in frames)
        with self._pending_lock:
            if self._pending_bytes + size > self.max_pending_bytes and self._tasks:
                raise QueueFull(
                    f"the client holds {len(self._tasks)} unfinished submissions of "
                    f"{self._pending_bytes:,} bytes, its limit (max_pending_bytes="
                    f"{self.max_pending_bytes:,}): wait for some results first")
            self._pending_bytes += size
        self._tasks[msg.id] = fut
        self.call_soon(self._cs.submit, msg.id, frames, time.monotonic(), size)
        if not self.threaded:
            self._flush(time.monotonic())
        return fut

    @overload
    def map(self, capability: Capability[Concatenate[T, P], R], payloads: Iterable[T],
            **options: Unpack[SubmitOptions]) -> list[TaskFuture[R]]: ...

    @overload
    def map(self, capability: str, payloads: Iterable[Any],
            **options: Unpack[SubmitOptions]) -> list[TaskFuture[Any]]: ...

    def map(self, capability: str | Capability[Any, Any], payloads: Iterable[Any],
            **options: Unpack[SubmitOptions]) -> list[TaskFuture[Any]]:
        """Submit one task per payload; returns their futures in order."""
        return [self.submit(capability, pl, **options)
                for pl in payloads]

    @overload
    def run(self, capability: Capability[Concatenate[T, P], R], payload: T, *,
            result_timeout: float | None = None, **options: Unpack[SubmitOptions]) -> R: ...

    @overload
    def run(self, capability: str, payload: Any = None, *,
            result_timeout: float | None = None, **options: Unpack[SubmitOptions]) -> Any: ...

    def run(self, capability: str | Capability[Any, Any], payload: Any = None, *,
            result_timeout: float | None = None, **options: Unpack[SubmitOptions]) -> Any:
        """Submit and wait for the result (at most ``result_timeout`` seconds)."""
        return self.submit(capability, payload,
                           **options).result(result_timeout)

    def cancel(self, task_id: str, *, wait: bool = True, timeout: float = 5.0) -> str | None:
        """Cancel a task: at once if queued, best effort if running (its handler sees
        ``ctx.is_cancelled``). Returns what the task became: ``"cancelled"``, or the final
        state it had reached already. Raises :class:`~meshant.errors.Forbidden` for a task
        this client's key may not cancel (with CURVE: another client's, without an admin
        key), :class:`~meshant.errors.BadInput` (``unknown-task``) for no such task.
        ``wait=False`` only sends the cancel (returns None; a refusal is logged), as does
        a call from the client's own I/O thread (a callback). In asyncio code, use
        :meth:`AsyncClient.cancel` or ``wait=False``: this call blocks for a round trip."""
        if not isinstance(task_id, str):
            raise BadInput(f"cancel takes a task's id (a str), not {task_id!r}")
        if not wait or (self.threaded and self.in_io_thread()):
            # (From the I/O thread — an on_progress callback, a future's done-callback —
            # waiting would block the very thread that reads the answer: sent only.)
            self.send_message(p.Message("task.cancel", {"task": task_id}, to="queen"))
            return None
        st = self._request("task.cancel", {"task": task_id, "ack": True}, timeout)
        return str(st["state"])

    # -- queries --------------------------------------------------------------------------

    @translated("the client")
    def _request(self, kind: str, body: dict[str, Any] | None,
                 timeout: float) -> dict[str, Any]:
        msg = p.Message(kind, body, frm=self.name, to="queen")
        fut: Future[Any] = Future()
        self._requests[msg.id] = fut
        self.call_soon(self._cs.request, msg)
        if not self.threaded:
            self._flush(time.monotonic())
        try:
            if self.pump is not None:
                self.pump(fut.done, timeout)
            return fut.result(0 if self.pump is not None else timeout)  # type: ignore[no-any-return]
        except Timeout:
            raise  # the request's own failure (queen-lost: its queen was lost before it answered)
        except TimeoutError:
            raise Timeout(f"no answer to {kind} within {timeout:g} s") from None
        finally:
            self._requests.pop(msg.id, None)
            self.call_soon(self._cs.answered, msg.id)

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

    # -- schedules ------------------------------------------------------------------------

    def add_schedule(self, name: str, cron: str, capability: str | Capability[Any, Any],
                     payload: Any = None, *, tz: str = "UTC", overlap: str = "skip",
                     catch_up: str = "latest", paused: bool = False, replace: bool = False,
                     request_timeout: float = 5.0, **options: Any) -> dict[str, Any]:
        """Have the queen submit a task of ``capability`` with ``payload`` at every tick
        of ``cron`` (5 fields; or 6, seconds first) in time zone ``tz``, kept in its journal.
        ``overlap``: what a tick does while the last one's task runs (``skip``, ``queue``,
        ``allow``); ``catch_up``: what happens to ticks missed while no queen led
        (``none``, ``latest``: the newest once, ``all``). ``options``: the tasks'
        submission options (priority, labels, timeout — each task's run-time limit —,
        max_attempts, to, cost...); ``request_timeout``: how long to wait for the queen.
        ``replace``: an existing schedule of that name is replaced. Returns the
        schedule as the queen holds it (``next``: its next tick, wall-clock seconds).
        Raises BadInput naming what is wrong (nothing is kept then)."""
        body: dict[str, Any] = {"op": "add", "name": name, "cron": cron,
                                "capability": capability_name(capability), "tz": tz,
                                "overlap": overlap, "catch_up": catch_up}
        if payload is not None:
            body["payload"] = payload
        if options:
            body["options"] = options
        if paused:
            body["paused"] = True
        if replace:
            body["replace"] = True
        return dict(self._request("schedule", body, request_timeout)["schedule"])

    def schedules(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every schedule the queen holds, by name, with its next tick."""
        return list(self._request("schedule", {"op": "list"}, timeout)["items"])

    def schedule(self, op: str, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """``op`` (show, pause, resume, remove, trigger) schedule ``name``: the
        queen's answer, with the schedule (and, for trigger, the ``task`` it submitted).
        Raises BadInput for a name the queen has no schedule of."""
        return self._request("schedule", {"op": op, "name": name}, timeout)

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
            raise p.LocalProtocolError(e.code, e.message) from None
        msg = p.Message("note", {"text": text}, frm=self.name, to=to,
                        extra=_extra(receipt, ttl))
        self.send_message(msg)
        return msg.id

    # -- conversations --------------------------------------------------------------------

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
        att = Attachment(task_id, after_seq, self.pump)
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

    # -- task graphs ----------------------------------------------------------------------

    @translated("the client")
    def submit_graph(self, graph: Any, *, updates: bool = False) -> GraphHandle:
        """Submit a task graph (a :class:`~meshant.Graph`, or the document: a map of name
        to node, or ``{"nodes": [...]}``); returns its :class:`~meshant.GraphHandle` at
        once. The queen checks the whole graph first: a bad one fails
        ``handle.submitted`` (and ``result()``) with the reason, and nothing of it runs.
        ``updates=True``: the handle's updates also say when each node starts."""
        nodes = nodes_of(graph)
        body: dict[str, Any] = {"nodes": [{**n, "payload": p.wrap_blob(n.get("payload"))}
                                          for n in nodes]}
        if updates:
            body["updates"] = True
        msg = p.Message("graph.submit", body, frm=self.name, to="queen")
        try:
            frames = self._encode(msg)
        except p.ProtocolError as e:
            raise p.LocalProtocolError(e.code, f"cannot submit the graph: {e.message}") from None
        names = [str(n.get("name")) for n in nodes if isinstance(n, dict)]
        h = GraphHandle(msg.id, names, self.cancel_graph, self.pump)
        self._graphs.add(h)
        self.call_soon(self._cs.submit_graph, msg.id, frames, time.monotonic())
        if not self.threaded:
            self._flush(time.monotonic())
        return h

    def graph_status(self, graph_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """A graph's state and each node's, as the queen (or its journal) has them."""
        return self._request("graph.status", {"graph": graph_id}, timeout)

    def cancel_graph(self, graph_id: str) -> None:
        """Cancel a graph: its pending nodes at once, its running ones best effort."""
        self.send_message(p.Message("graph.cancel", {"graph": graph_id}, to="queen"))


def _extra(receipt: bool, ttl: float | None) -> dict[str, Any] | None:
    """Envelope fields of a directed message (peers that do not know them ignore them)."""
    extra: dict[str, Any] = {}
    if receipt:
        extra["receipt"] = True
    if ttl is not None:
        extra["ttl"] = float(ttl)
    return extra or None


__all__ = ["Client", "TaskFuture", "Update"]
