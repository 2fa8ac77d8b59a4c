"""What a forager's handlers see, and how they are called: :class:`TaskContext` (the
task a handler runs, and how it reports progress or partial results), :class:`Handler`
(a registered handler) and :func:`positional_args` (the one rule for which arguments a
handler or a broadcast callback is given)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol

from meshant import protocol as p
from meshant.actors.durable import Steps, replayed
from meshant.actors.failures import TRACEBACK_FRAMES, error_body, frames, own_failure
from meshant.errors import AskTimeout, BadInput, ConfigError, TaskCancelled

# Seconds a sub-task's call waits for the queen's answer (it comes in one turn; a queen
# away this long fails the call with Timeout, and the task's retry policy decides).
CALL_REPLY_WAIT = 30.0


class Sender(Protocol):
    """Where a task context sends its progress and partial results (the forager)."""

    def send_message(self, msg: p.Message) -> None: ...

    @property
    def features(self) -> frozenset[str]: ...


class TaskContext:
    """What a handler knows about the task it runs, and how it talks back while running."""

    __slots__ = ("_asks", "_cancelled", "_durable", "_ended", "_event", "_forager", "_future",
                 "_retry_on", "_run", "_steps", "attempt", "capability", "deadline", "ref",
                 "task_id")

    def __init__(self, forager: Sender, ref: str, task_id: str, attempt: int,
                 capability: str, deadline: float | None) -> None:
        self._forager = forager
        self._future: Any = None
        self.ref = ref
        self.task_id = task_id
        self.attempt = attempt
        self.capability = capability
        self.deadline = deadline
        self._cancelled = False
        self._event: threading.Event | None = None
        self._asks: Asks | None = None  # questions asked, made on the first ask
        self._run = 0  # which run of its assignment this is (the forager session's)
        self._durable = False  # its handler's asks are durable (@forager.task(durable=True))
        self._steps: Steps | None = None  # its durable steps, made on the first
        self._retry_on: tuple[type[BaseException], ...] = ()  # its handler's retry_on
        self._ended = False  # its handler's run ended (its outcome is on its way)

    # -- durable steps (docs/durable.md) -----------------------------------------------

    def recorded(self, steps: list[dict[str, Any]]) -> None:
        """The steps earlier runs of this task recorded (the forager gives them before
        the handler starts): replayed, not run again."""
        self._steps = Steps(self._forager, self.ref, self.task_id, steps)
        self._steps.retry_on = self._retry_on

    def _durable_steps(self) -> Steps:
        if self._ended:
            raise ConfigError(f"a durable step of task {self.task_id} after its handler's "
                              "run ended (from a thread or task it left running?): steps "
                              "belong inside the handler's call")
        st = self._steps
        if st is None:
            st = self._steps = Steps(self._forager, self.ref, self.task_id, None)
            st.retry_on = self._retry_on
        if self._cancelled:
            raise TaskCancelled(f"task {self.task_id} was cancelled")
        return st

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this task and record its result (or the
        exception it raised) in the queen's journal: a later run of the task — its
        forager killed, the queen restarted or failed over, the task retried — gets the
        recorded value back (or the exception raised again) without running ``fn``.
        Steps are keyed by ``name`` and occurrence (the n-th call of that name) in the
        order the handler makes them: a re-run that asks for another step at a recorded
        position fails the task (NonDeterministic). A step in flight when its forager
        died runs again: make its side effects idempotent. The value must be
        msgpack-able (JSON-like data, bytes) and under 1 MiB; the handler gets it back as
        the journal keeps it (a tuple as a list) on every run alike."""
        return self._durable_steps().step(name, fn, args, kwargs)

    async def step_async(self, name: str, fn: Callable[..., Any], /, *args: Any,
                         **kwargs: Any) -> Any:
        """:meth:`step` for ``async def`` handlers: ``fn`` may be a coroutine function."""
        return await self._durable_steps().step_async(name, fn, args, kwargs)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` without holding a slot: the run ends as *suspended*, the queen
        journals when it wakes, and runs the task again then (never earlier, across
        restarts and failover); the re-run replays the recorded steps and passes this
        sleep at once. Code after ``ctx.sleep`` runs in that later run. Without a queen
        that keeps steps, a plain sleep."""
        self._durable_steps().sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        """:meth:`sleep` for ``async def`` handlers."""
        st = self._durable_steps()
        if not st.durable:
            await asyncio.sleep(seconds)
            return
        st.sleep(seconds)

    def call(self, capability: Any, payload: Any = None, **options: Any) -> Any:
        """Run a sub-task of ``capability`` (a name, or a :class:`~meshant.Capability`)
        and its result: the child is keyed by this task and the step position, so a re-run
        gets the same child — its result at once if it ended, never a second one. While
        it runs, this run ends *suspended* (its slot free, so a forager may run its own
        children); the queen runs the task again when the child ends, and this call
        returns its result (code before it was replayed, not run again). Its error is
        raised as ``client.run`` raises it. ``options``: priority, timeout, labels, to,
        max_attempts, wait (the child's, as ``client.submit`` takes them). Cancelling
        this task cancels its running children."""
        st = self._durable_steps()
        pos, occ, name, rec, fut = st.call(capability, payload, options, self._call_child)
        if rec is not None:
            return replayed(rec)
        assert fut is not None
        try:
            reply = fut.result(CALL_REPLY_WAIT)
        except FutureTimeout:
            from meshant.errors import Timeout
            raise Timeout(f"the queen did not answer the call of sub-task {name} of task "
                          f"{self.task_id}") from None
        return st.answered(pos, occ, name, _child_of(self.task_id, pos), reply)

    async def call_async(self, capability: Any, payload: Any = None, **options: Any) -> Any:
        """:meth:`call` for ``async def`` handlers."""
        st = self._durable_steps()
        pos, occ, name, rec, fut = st.call(capability, payload, options, self._call_child)
        if rec is not None:
            return replayed(rec)
        assert fut is not None
        reply = await asyncio.wait_for(asyncio.wrap_future(fut), CALL_REPLY_WAIT)
        return st.answered(pos, occ, name, _child_of(self.task_id, pos), reply)

    def _call_child(self, ref: str, child: str, body: dict[str, Any]
                    ) -> Future[dict[str, Any]]:
        call = getattr(self._forager, "call_child", None)
        if call is None:
            raise ConfigError("ctx.call runs a sub-task in a colony: not here")
        return call(ref, child, body)  # type: ignore[no-any-return]

    @property
    def is_cancelled(self) -> bool:
        """True once the queen cancelled this task; long handlers should check it and stop."""
        return self._cancelled

    @property
    def cancelled(self) -> threading.Event:
        """An Event set when the task is cancelled (``ctx.cancelled.wait(s)`` sleeps
        cancellably). Made on first use: most tasks never need one."""
        ev = self._event
        if ev is None:
            ev = threading.Event()
            if self._cancelled:
                ev.set()
            self._event = ev
            if self._cancelled:  # a cancel raced with the creation
                ev.set()
        return ev

    def cancel(self) -> None:
        self._cancelled = True
        ev = self._event
        if ev is not None:
            ev.set()
        if self._asks is not None:
            self._asks.cancel_all(self.task_id)

    def ask(self, prompt: Any, *, timeout: float | None = None, data: Any = None,
            durable: bool | None = None) -> Any:
        """Ask for input and wait for it: the task enters ``input-required``, its submitter
        (and anyone attached) sees the question, and ``client.answer`` (or ``meshant
        answer``) resumes this call with the value. ``data``: any JSON to go with the
        prompt. The lease holds while waiting (heartbeats renew it).

        Raises :class:`~meshant.errors.AskTimeout` once ``timeout`` seconds pass without
        an answer (the question is withdrawn), and TaskCancelled if the task is cancelled.

        ``durable=True`` (the default in a ``@forager.task(..., durable=True)`` handler):
        the run ends while the question waits, freeing its slot; the queen keeps the
        question and runs the task again once it is answered, the answer recorded as this
        step (code after the ask runs in that later run). No ``timeout`` then.
        """
        if self._durable_ask(durable, timeout):
            return self._durable_steps().ask(prompt, data)
        fut, request = self._ask(prompt, timeout, data)
        try:
            return fut.result(timeout)
        except FutureTimeout:
            if fut.done() and not fut.cancelled():
                return fut.result()  # answered (or refused) just as the wait ran out
            raise self._withdraw(request, timeout) from None

    async def ask_async(self, prompt: Any, *, timeout: float | None = None,
                        data: Any = None, durable: bool | None = None) -> Any:
        """:meth:`ask` for ``async def`` handlers: awaits the answer."""
        if self._durable_ask(durable, timeout):
            return self._durable_steps().ask(prompt, data)
        fut, request = self._ask(prompt, timeout, data)
        try:
            # shield: wait_for's timeout must not cancel the question's own future (an
            # answer may still land; a refusal is raised as itself).
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), timeout)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()
            raise self._withdraw(request, timeout) from None

    def _durable_ask(self, durable: bool | None, timeout: float | None) -> bool:
        if not (self._durable if durable is None else durable):
            return False
        if timeout is not None:
            raise ConfigError("a durable ask has no timeout (the task waits, suspended, "
                              "until answered or cancelled): drop timeout= or durable=")
        return "steps" in self._forager.features

    def _ask(self, prompt: Any, timeout: float | None, data: Any) -> tuple[Future[Any], str]:
        if self._cancelled:
            raise TaskCancelled(f"task {self.task_id} was cancelled")
        if self._asks is None:
            self._asks = Asks()
        msg, fut = self._asks.new(self.ref, prompt, data, timeout)
        self._forager.send_message(msg)
        return fut, msg.b["request"]

    def _withdraw(self, request: str, timeout: float | None) -> AskTimeout:
        assert self._asks is not None
        if self._asks.close(request):
            self._forager.send_message(p.Message(
                "task.ask", {"request": request, "withdraw": True}, ref=self.ref, to="queen"))
        return AskTimeout(f"no answer to question {request} of task {self.task_id} within "
                          f"{timeout:g} s", request=request)

    def answered(self, request: str, value: Any) -> None:
        """The queen's answer to one of this task's questions (the forager calls it)."""
        if self._asks is not None:
            self._asks.answer(request, value)

    def refused(self, msg_id: str, err: BaseException) -> bool:
        """The queen refused one of this task's questions (by its message id): its
        ``ask`` raises ``err``. False if no question of this task was that message."""
        return self._asks is not None and self._asks.fail(msg_id, err)

    def pending_asks(self) -> list[p.Message]:
        """The questions still waiting, to ask again after a reconnect."""
        return self._asks.pending() if self._asks is not None else []

    def progress(self, fraction: float | None = None, note: str | None = None) -> None:
        """Report progress (0.0-1.0) and/or a short note; also renews the task's lease.
        Nothing is sent once the task is cancelled, or when the queen did not negotiate
        ``progress`` (a feature not negotiated is not used, spec §5)."""
        if self._cancelled or "progress" not in self._forager.features:
            return
        body: dict[str, Any] = {}
        if fraction is not None:
            body["fraction"] = float(fraction)
        if note is not None:
            body["note"] = str(note)
        self._forager.send_message(p.Message("task.progress", body, ref=self.ref, to="queen"))
        self._room()

    def charge(self, n: float) -> None:
        """Report what this run really spent, in all (a model call's tokens): the queen's
        rate limits count that instead of the task's submitted ``cost`` (the difference
        comes off, or back onto, its buckets). Sent numbered, as progress is (re-sent
        after a reconnect, taken once); nothing without ``progress`` negotiated."""
        if n.__class__ not in (int, float) or not 0 <= n <= 1e9:
            raise BadInput(f"charge takes the tokens spent, a number from 0, not {n!r}")
        if self._cancelled or "progress" not in self._forager.features:
            return
        self._forager.send_message(p.Message("task.progress", {"charge": n}, ref=self.ref,
                                             to="queen"))
        self._room()

    def spawn(self, name: str, capability: str, payload: Any = None, *,
              after: list[str] | None = None, after_spawned: list[str] | None = None,
              **options: Any) -> Future[list[str]]:
        """Add a node to this task's graph (only a graph node may spawn): it runs once
        what it waits for (``after``, ``$result`` references in its payload) completes,
        and nodes declared ``after_spawned=[this node]`` wait for it too. ``options``:
        priority, timeout, labels, to, max_attempts, wait. Returns a future of the names
        the queen added; it fails with the queen's reason if it refused (a cycle, a
        missing or duplicate name, the size limit). A re-run of this node may spawn the
        same names again: they are the same nodes, not new ones."""
        node: dict[str, Any] = {"name": name, "capability": capability, "payload": payload}
        if after:
            node["after"] = list(after)
        if after_spawned:
            node["after_spawned"] = list(after_spawned)
        node.update({k: v for k, v in options.items() if v is not None})
        return self.spawn_many([node])

    def spawn_many(self, nodes: list[dict[str, Any]]) -> Future[list[str]]:
        """Add several nodes at once (each a map as :meth:`spawn` builds it); they may
        wait for each other. All are added, or none."""
        msg = p.Message("graph.spawn", {"nodes": [{**n, "payload": p.wrap_blob(n.get("payload"))}
                                                  for n in nodes]}, ref=self.ref, to="queen")
        fut: Future[list[str]] = Future()
        expect = getattr(self._forager, "await_reply", None)
        if expect is not None:
            expect(msg.id, fut)
        else:
            fut.set_result([str(n.get("name")) for n in nodes])
        self._forager.send_message(msg)
        return fut

    def partial(self, value: Any) -> None:
        """Stream a partial result to the submitter (delivered in order, exactly once;
        across a queen's crash, as far as the forager keeps a run's updates: the last
        1,000). Nothing is sent once the task is cancelled, or without ``progress``
        negotiated. A handler streaming faster than the connection carries (or while the
        queen is away) waits here once 4,096 messages are queued, so the forager's memory
        stays bounded; ``async def`` and ``inline`` handlers are never made to wait (they
        run on an event loop or the I/O thread: keep their streams short)."""
        if self._cancelled or "progress" not in self._forager.features:
            return
        self._forager.send_message(p.Message(
            "task.result", {"partial": True, "value": p.wrap_blob(value)}, ref=self.ref,
            to="queen"))
        self._room()

    def _room(self) -> None:
        # A handler streaming faster than the connection carries waits here for the
        # backlog to go down (the forager's memory stays bounded), unless cancelled.
        wait = getattr(self._forager, "wait_for_room", None)
        if wait is not None:
            wait(self)


class Asks:
    """One task's questions: each a request id, its ``task.ask`` message and the future
    its handler waits on. Thread-safe: the handler's thread asks, the I/O thread answers."""

    __slots__ = ("_lock", "_n", "_waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self._waiting: dict[str, tuple[p.Message, Future[Any]]] = {}

    def new(self, ref: str, prompt: Any, data: Any,
            timeout: float | None) -> tuple[p.Message, Future[Any]]:
        with self._lock:
            self._n += 1
            request = f"{ref}.q{self._n}"
            body: dict[str, Any] = {"request": request, "prompt": p.wrap_blob(prompt)}
            if data is not None:
                body["data"] = p.wrap_blob(data)
            if timeout is not None:
                body["timeout"] = float(timeout)
            msg = p.Message("task.ask", body, ref=ref, to="queen")
            fut: Future[Any] = Future()
            self._waiting[request] = (msg, fut)
            return msg, fut

    def answer(self, request: str, value: Any) -> None:
        with self._lock:
            got = self._waiting.pop(request, None)
        if got is not None and not got[1].done():
            got[1].set_result(p.unwrap_blob(value))

    def close(self, request: str) -> bool:
        """Stop waiting for ``request``; False if it was answered meanwhile."""
        with self._lock:
            return self._waiting.pop(request, None) is not None

    def fail(self, msg_id: str, err: BaseException) -> bool:
        with self._lock:
            request = next((r for r, (m, _) in self._waiting.items() if m.id == msg_id), None)
            got = self._waiting.pop(request, None) if request is not None else None
        if got is None:
            return False
        if not got[1].done():
            got[1].set_exception(err)
        return True

    def cancel_all(self, task_id: str) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for _, fut in waiting.values():
            if not fut.done():
                fut.set_exception(TaskCancelled(f"task {task_id} was cancelled"))

    def pending(self) -> list[p.Message]:
        with self._lock:
            return [m for m, _ in self._waiting.values()]


def _child_of(task_id: str, position: int) -> str:
    from meshant.core.tasks.steps import child_id
    return child_id(task_id, position)


def positional_args(fn: Callable[..., Any], most: int) -> int:
    """How many positional arguments to call ``fn`` with, at most ``most``: those it
    requires (parameters with defaults are the function's own, never filled), or
    ``most`` when it takes ``*args`` or its signature cannot be read.

    ``fn(payload, ctx)`` is given the task's context, ``fn(payload)`` not; a broadcast
    callback ``fn(topic, data, message)`` is given the message, ``fn(topic, data)`` not.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return most
    if any(q.kind == q.VAR_POSITIONAL for q in params):
        return most
    return min(most, sum(1 for q in params if q.kind in (q.POSITIONAL_ONLY,
                                                           q.POSITIONAL_OR_KEYWORD)
                         and q.default is q.empty))


@dataclass(slots=True)
class Handler:
    """A registered handler: how to call it (see :meth:`Forager.task`)."""

    fn: Callable[..., Any]
    batch: int | None
    is_async: bool
    takes_ctx: bool
    inline: bool = False
    # Exceptions the queen should retry (while attempts are left); any other fails the
    # task at once.
    retry_on: tuple[type[BaseException], ...] = ()
    # What the hello says of the capability: description, payload and result schemas
    # (meshant.actors.describe); empty when nothing is known.
    about: dict[str, Any] | None = None
    durable: bool = False  # its asks are durable (the run ends while one waits)

    @classmethod
    def of(cls, fn: Callable[..., Any], batch: int | None, inline: bool,
           retry_on: tuple[type[BaseException], ...] = (),
           about: dict[str, Any] | None = None, durable: bool = False) -> Handler:
        """``fn`` is given the context if it requires a second positional argument."""
        return cls(fn, batch, inspect.iscoroutinefunction(fn), positional_args(fn, 2) >= 2,
                   inline, retry_on, about or None, durable)

    def failed(self, e: BaseException) -> dict[str, Any]:
        """The result body of a task this handler failed with ``e``."""
        return error_body(e, retry=bool(self.retry_on) and isinstance(e, self.retry_on))


__all__ = ["TRACEBACK_FRAMES", "Asks", "Handler", "TaskContext", "error_body", "frames",
           "own_failure",
           "positional_args"]
