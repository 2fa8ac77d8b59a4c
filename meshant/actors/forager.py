"""The forager: a worker agent that serves capabilities for the queen.

Register handlers with :meth:`Forager.task`, then :meth:`Forager.run` (blocking, stops on
SIGINT/SIGTERM), :meth:`Forager.start`/:meth:`Forager.stop` (background thread inside your
own process) or ``await forager.run_async()``. What a handler is given, and how it is
called, is :mod:`meshant.actors.handlers`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar, overload

import zmq

from meshant import protocol as p
from meshant.actors._boundary import translated
from meshant.actors._peer import Peer
from meshant.actors.capability import BatchRegister, Register
from meshant.actors.config import ForagerConfig, settle
from meshant.actors.describe import describe
from meshant.actors.durable import Diverged, Suspend, diverged_body
from meshant.actors.futures import fail
from meshant.actors.handlers import Handler, TaskContext, own_failure, positional_args
from meshant.actors.workers import Workers
from meshant.core.peers import forager_session as fs_
from meshant.core.peers.forager_session import RESENT_MAX, ForagerSession
from meshant.errors import ConfigError, TaskCancelled, Timeout, from_error_body
from meshant.observe import tracing
from meshant.protocol.codes import Code

log = logging.getLogger("meshant.forager")

# Messages (progress reports, partial results) that may wait to go to the queen before a
# handler that sends another waits for room (see wait_for_room).
STREAM_BACKLOG = 4096

P = ParamSpec("P")
R = TypeVar("R")



def _call_logged(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("broadcast handler %s failed", getattr(fn, "__name__", fn))


class Forager(Peer):
    """A worker agent. ``slots`` tasks run at once; handlers are sync or ``async def``.

    What it runs and what it tells the queen is decided by a sans-IO
    :class:`~meshant.core.peers.forager_session.ForagerSession`; this class runs the handlers
    in threads and carries out what the session says."""

    role = "forager"

    def __init__(
        self,
        queen: str | None = None,
        *,
        config: ForagerConfig | None = None,
        context: zmq.Context[Any] | None = None,
        **settings: Any,
    ) -> None:
        """Settings come as a :class:`ForagerConfig` (``config=``) or as keyword arguments
        of the same names (``slots=4``...). ``queen=None`` (and no ``MESHANT_QUEEN``), or
        ``discover=True``: find the queen of ``colony`` by mDNS and follow it if it moves."""
        c = self.config = settle(ForagerConfig, config, settings)
        super().__init__(queen, c.name, context, c.colony, c.discover, c.curve_secret,
                         c.queen_key, c.follow_leader)
        if c.slots < 1:
            raise ConfigError("slots must be at least 1")
        self.slots = c.slots
        self.labels = dict(c.labels or {})
        self.handlers: dict[str, Handler] = {}
        # The handlers' contexts of the tasks running now, by assign id.
        self.running: dict[str, TaskContext] = {}
        self._fs: ForagerSession | None = None
        self._room = threading.Event()  # set: the backlog to the queen went down
        self._pool: Workers | None = None
        # Where async def handlers run: the caller's loop under run_async, else a loop
        # of our own in a thread, made on the first async task.
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aloop_thread: threading.Thread | None = None
        self._stop_watchers: list[Callable[[], None]] = []
        self._batches: dict[str, deque[tuple[Any, TaskContext]]] = {}
        self._message_callbacks: list[Callable[[p.Message], Any]] = []
        self._replies: OrderedDict[str, Future[Any]] = OrderedDict()

    def configure(self, queen: str | None = None, **settings: Any) -> None:
        """Change settings of a forager not started yet, as the constructor would take them
        (``queen``: its endpoint(s); the others: :class:`ForagerConfig` fields); the rest of
        its settings, and everything registered on it, stay. ``meshant forager --app``
        applies the options given on its command line this way."""
        if self._thread is not None:
            raise RuntimeError("configure a forager before starting it")
        c = settle(ForagerConfig, self.config, settings)
        if c.slots < 1:
            raise ConfigError("slots must be at least 1")
        if queen is None and not c.discover:
            queen = ",".join(self.queens) or None  # the endpoint it has, unless rediscovering
        self._settle(queen, c.name or self.name, c.colony, c.discover, c.curve_secret,
                     c.queen_key, c.follow_leader)
        self.config, self.slots, self.labels = c, c.slots, dict(c.labels or {})

    # -- registering handlers -------------------------------------------------------------

    @overload
    def task(self, capability: str, *, batch: None = None, inline: bool = False,
             retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
             description: str | None = None, schema: dict[str, Any] | None = None,
             result_schema: dict[str, Any] | None = None, durable: bool = False,
             ) -> Register: ...

    @overload
    def task(self, capability: str, *, batch: int, inline: bool = False,
             retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
             description: str | None = None, schema: dict[str, Any] | None = None,
             result_schema: dict[str, Any] | None = None, durable: bool = False,
             ) -> BatchRegister: ...

    def task(self, capability: str, *, batch: int | None = None, inline: bool = False,
             retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
             description: str | None = None, schema: dict[str, Any] | None = None,
             result_schema: dict[str, Any] | None = None, durable: bool = False,
             ) -> Register | BatchRegister:
        """Decorator: ``@forager.task("crawl")`` serves the ``crawl`` capability.

        The handler is called as ``fn(payload, ctx)`` (or ``fn(payload)``: a parameter
        with a default is never filled) in a worker thread. With ``batch=N`` it is called
        as ``fn(payloads, ctxs)`` with up to N tasks and returns one result per task (an
        Exception instance in the list fails just that task). ``inline=True`` runs it in
        the I/O thread itself, saving two thread hand-offs per task: only for handlers
        that take microseconds and never block.

        An exception the handler raises fails the task at once, with its type, message
        and traceback (logged here at warning too); ``retry_on=(ConnectionError, ...)``
        asks the queen to try the task again, on any forager, when the handler raises one
        of those (while the task's attempts last). A lost forager or an expired lease is
        always retried.

        The capability describes itself to the colony (``meshant status``, ``tool.query``,
        the A2A and MCP gateways): ``description`` (one line; default the docstring's
        first paragraph), ``schema`` (a JSON Schema of the payload; default derived from
        the first parameter's type hint) and ``result_schema`` (default from the return
        annotation). A schema over 8 KiB as JSON is refused (ConfigError).

        ``durable=True``: the handler's ``ctx.ask`` questions are durable — the run ends
        while it waits (its slot is free), and the task runs again with the answer,
        replaying its recorded steps (``ctx.step``; see docs/durable.md).

        The decorated name becomes a :class:`~meshant.Capability`: it still calls the
        function, and a client submits by it (``client.run(crawl, url)``) with the
        handler's payload and result types.
        """
        if not isinstance(capability, str):
            raise ConfigError("@forager.task needs the capability's name: "
                              "@forager.task(\"summarise\")")

        def add(fn: Callable[..., Any]) -> None:
            self.add_handler(capability, fn, batch=batch, inline=inline, retry_on=retry_on,
                             description=description, schema=schema,
                             result_schema=result_schema, durable=durable)
        return (Register(capability, add, durable) if batch is None
                else BatchRegister(capability, add))

    def add_handler(self, capability: str, fn: Callable[..., Any], *,
                    batch: int | None = None, inline: bool = False,
                    retry_on: tuple[type[BaseException], ...] | type[BaseException] = (),
                    description: str | None = None, schema: dict[str, Any] | None = None,
                    result_schema: dict[str, Any] | None = None,
                    durable: bool = False) -> None:
        """Serve ``capability`` with ``fn``; see :meth:`task`."""
        if self._thread is not None:
            raise RuntimeError("add handlers before starting the forager")
        if batch is not None and batch < 1:
            raise ConfigError("batch must be at least 1")
        if inline and (batch is not None or inspect.iscoroutinefunction(fn)):
            raise ConfigError("inline handlers are plain functions without batch")
        on = (retry_on,) if isinstance(retry_on, type) else tuple(retry_on)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in on):
            raise ConfigError(f"retry_on takes exception classes, not {retry_on!r}")
        about = describe(capability, fn, description=description, schema=schema,
                         result_schema=result_schema, batch=batch is not None)
        if durable and (batch is not None or inline):
            raise ConfigError("durable handlers are plain or async def functions without "
                              "batch or inline")
        self.handlers[capability] = Handler.of(fn, batch, inline, on, about, durable)

    def on(self, prefix: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator: ``@forager.on("news.")`` calls ``fn(topic, data)`` (or
        ``fn(topic, data, message)``) in a worker thread for each broadcast whose topic
        starts with ``prefix``."""
        def deco(fn: Callable[P, R]) -> Callable[P, R]:
            three = positional_args(fn, 3) == 3

            def deliver(topic: str, data: Any, msg: p.Message) -> None:
                if self._pool is None:
                    return
                args = (topic, data, msg) if three else (topic, data)
                self._submit(_call_logged, fn, args)

            self.subscribe(prefix, deliver)
            return fn
        return deco

    def on_message(self, fn: Callable[[p.Message], R]) -> Callable[[p.Message], R]:
        """Decorator: called (in the I/O thread, keep it short) for directed messages/notes."""
        self._message_callbacks.append(fn)
        return fn

    # -- running --------------------------------------------------------------------------

    def _begin(self) -> None:
        if not self.handlers:
            raise ConfigError("no handlers: register one with @forager.task(capability)")
        self._fs = ForagerSession(list(self.handlers), self.slots, self.labels,
                                  serves=self.handlers,
                                  describe={c: h.about for c, h in self.handlers.items()
                                            if h.about})
        self._make_link(self._fs)
        self._pool = Workers(self.slots, f"meshant-{self.name}")

    @translated("the forager")
    def start(self, timeout: float | None = 10.0) -> Forager:
        """Run in a background thread; returns once the queen welcomed this forager."""
        self._begin()
        self._start_io(timeout)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop: running tasks are told to cancel and the queen is told we are leaving."""
        if self._fs is not None and self._thread is not None and self._thread.is_alive():
            self.call_soon(self._stop_all)
        else:  # (the I/O thread ended already: a halt, a drain that finished)
            for ctx in list(self.running.values()):
                ctx.cancel()
                if ctx._future is not None:
                    ctx._future.cancel()  # an async def handler on a loop goes no further
        self.close(timeout)
        if self._pool is not None:
            self._pool.shutdown()
        loop, t = self._aloop, self._aloop_thread
        self._aloop = self._aloop_thread = None
        if loop is not None and t is not None:  # our own loop (not run_async's caller's)
            loop.call_soon_threadsafe(loop.stop)
            t.join(timeout)
            if not t.is_alive():
                loop.close()

    def _stop_all(self) -> None:
        assert self._fs is not None
        self._fs.stop_all()
        self._do(self._fs.take())

    @translated("the forager")
    def run(self, *, install_signals: bool = True, drain_timeout: float = 600.0) -> None:
        """Serve until stopped; waits for the queen if it is not up yet.

        SIGTERM drains (finish the running tasks, take no new ones, then leave; at most
        ``drain_timeout`` seconds, and no longer than a heartbeat interval once the queen
        is gone); SIGINT, or a second signal, stops at once and hands the running tasks
        back to the queen.
        """
        restore: dict[int, Any] = {}
        drain_deadline: list[float] = []
        self._begin()

        def on_signal(sig: int, _frame: Any) -> None:
            if sig == signal.SIGTERM and not drain_deadline:
                drain_deadline.append(time.monotonic() + drain_timeout)
                self.drain()
            else:
                self._stopping.set()

        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                restore[sig] = signal.signal(sig, on_signal)
        try:
            self._start_io(None)
            queenless: float | None = None  # since when a drain has had no queen
            while not self._stopping.wait(0.2):
                now = time.monotonic()
                if drain_deadline and now > drain_deadline[0]:
                    log.warning("%s: drain took longer than %g s; stopping", self.name,
                                drain_timeout)
                    break
                # Draining tasks with no queen (silent past its heartbeat timeout, gone,
                # or none yet): their results would reach nobody, and a queen that comes
                # back runs them again. Stop (cancel, hand back) after one more heartbeat
                # interval without a welcome, not at the end of the drain timeout.
                # (Results already made wait for the queen in the session: Leave.)
                if not drain_deadline or self._welcomed.is_set() or not self.running:
                    queenless = None
                elif queenless is None:
                    queenless = now
                elif now - queenless > self.link.sess.hb_interval:
                    log.warning("%s: the queen is gone; stopping, not draining", self.name)
                    break
        finally:
            self.stop()
            for signum, old in restore.items():
                signal.signal(signum, old)

    async def run_async(self) -> None:
        """Serve from asyncio: ``await forager.run_async()``; cancel the awaiting task to
        stop (or call :meth:`stop`; a halt from the queen or a drain that ends stops it
        too). ``async def`` handlers run on this event loop, beside your own tasks: keep
        them from blocking it (``ctx.ask_async``, not ``ctx.ask``)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def end() -> None:
            if not ended.done():
                ended.set_result(None)

        def stopped() -> None:  # (the I/O thread, as it ends)
            try:
                loop.call_soon_threadsafe(end)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more
        self._stop_watchers.append(stopped)
        self._aloop = loop
        try:
            await asyncio.to_thread(self.start)
            await ended
        finally:
            self._stop_watchers.remove(stopped)
            await asyncio.to_thread(self.stop)

    def __enter__(self) -> Forager:
        """``with Forager(...) as f:`` serves in a background thread inside the block
        (:meth:`start`) and stops at its end (:meth:`stop`)."""
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _teardown(self) -> None:
        super()._teardown()
        for fn in list(self._stop_watchers):
            fn()

    @property
    def tools(self) -> list[str]:
        return sorted(self.handlers)

    @property
    def draining(self) -> bool:
        """True once the forager drains (finishes its tasks, takes no new ones)."""
        return self._fs is not None and self._fs.draining

    # -- I/O thread: the session's side ---------------------------------------------------

    def _fsess(self) -> ForagerSession:
        assert self._fs is not None
        return self._fs

    def _queue(self, item: p.Message | list[bytes]) -> None:
        assert isinstance(item, p.Message), "a forager sends messages"
        self._fsess().send(item)

    def _after_turn(self) -> None:
        fs = self._fs
        if fs is not None and fs.out:
            self._do(fs.take())

    def _do(self, actions: list[fs_.Action]) -> None:
        """Carry out what the forager session decided."""
        for a in actions:
            match a:
                case fs_.Start():
                    self._start_run(a)
                case fs_.Stop(ref=ref):
                    ctx = self.running.get(ref)
                    if ctx is not None:
                        ctx.cancel()
                        if ctx._future is not None:
                            ctx._future.cancel()
                case fs_.Answered(ref=ref, request=request, value=value):
                    ctx = self.running.get(ref)
                    if ctx is not None:
                        ctx.answered(request, value)
                case fs_.Reply(ref=ref, body=body, error=error):
                    self._replied(ref, body, error)
                case fs_.Leave(warning=warning):
                    if warning is not None:
                        log.warning("%s: %s", self.name, warning)
                    self._stopping.set()
                case fs_.Delivered(msg=msg):
                    self._on_peer_message(msg)

    def _start_run(self, a: fs_.Start) -> None:
        h = self.handlers[a.capability]
        deadline = time.monotonic() + a.timeout if a.timeout is not None else None
        ctx = TaskContext(self, a.ref, a.task_id, a.attempt, a.capability, deadline)
        ctx._run = a.run
        ctx._durable = h.durable
        ctx._retry_on = h.retry_on
        if a.steps:
            ctx.recorded(a.steps)
        self.running[a.ref] = ctx
        payload = a.payload
        if a.trace is not None and h.batch is None:
            # The handler's span is the child of the queen's scheduling span (meshant[otel]).
            h = dataclasses.replace(h, fn=tracing.traced(h.fn, a.trace, {
                "meshant.task": ctx.task_id, "meshant.capability": a.capability,
                "meshant.attempt": ctx.attempt}, h.is_async))
        if h.inline:
            self._run_one(h, payload, ctx)
        elif h.batch is not None:
            self._batches.setdefault(a.capability, deque()).append((payload, ctx))
            self._submit(self._run_batch, h, a.capability)
        elif h.is_async:
            ctx._future = asyncio.run_coroutine_threadsafe(self._run_async(h, payload, ctx),
                                                           self._async_loop())
        else:
            self._submit(self._run_one, h, payload, ctx)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._pool is not None
        try:
            self._pool.submit(fn, *args)
        except RuntimeError:
            pass  # pool shut down: we are stopping, and the queen will reissue

    def wait_for_room(self, ctx: TaskContext) -> None:
        """Called by a handler after each progress report or partial result: while more
        than STREAM_BACKLOG messages wait to go to the queen (a handler streaming faster
        than the connection carries them, or the queen away), wait until half of them
        left. Returns at once on the I/O thread (an inline handler) or an event loop
        (an async handler), once the task is cancelled, or when the forager stops."""
        if self._backlog() <= STREAM_BACKLOG or threading.get_ident() == self._io_ident:
            return
        if asyncio._get_running_loop() is not None:
            return  # an async handler: never block its event loop (the caller's, maybe)
        while (self._backlog() > STREAM_BACKLOG // 2 and not ctx.is_cancelled
               and not self._stopping.is_set() and not self._stopped.is_set()):
            self._room.clear()
            if self._backlog() > STREAM_BACKLOG // 2:
                self._room.wait(0.1)

    def _backlog(self) -> int:
        fs = self._fs
        return len(self._calls) + (len(fs.outbox) if fs is not None else 0)

    def _flush(self, now: float) -> None:
        super()._flush(now)
        if not self._room.is_set() and self._backlog() <= STREAM_BACKLOG // 2:
            self._room.set()

    # -- I/O thread: the queen's messages --------------------------------------------------

    def drain(self) -> None:
        """Finish the running tasks, accept nothing new, then leave (safe from any thread)."""
        self.call_soon(self._start_drain)

    def _start_drain(self) -> None:
        fs = self._fsess()
        if fs.drain():
            log.info("%s: draining (%d tasks running)", self.name, len(fs.running))
            if self._welcomed.is_set():
                # Tell the queen now, so it assigns nothing more meanwhile.
                self.link.send_now(p.Message("hb", fs.hb_body(), to="queen"))

    def await_reply(self, msg_id: str, fut: Future[Any]) -> None:
        """Resolve ``fut`` with the queen's answer to message ``msg_id`` (``ctx.spawn``).
        Bounded: the oldest unanswered are given up."""
        self._replies[msg_id] = fut
        while len(self._replies) > RESENT_MAX:
            fail(self._replies.popitem(last=False)[1],
                 Timeout("no answer from the queen", code=Code.TIMEOUT))

    def _replied(self, ref: str, body: dict[str, Any], error: dict[str, Any] | None) -> None:
        fut = self._replies.pop(ref, None)
        if error is None:
            if fut is not None and not fut.done():
                fut.set_result(body.get("nodes", body))
            return
        err = from_error_body(error)
        if fut is not None:
            fail(fut, err)
            return
        for ctx in list(self.running.values()):
            if ctx.refused(ref, err):
                return  # a refused question: its ctx.ask raises the error

    def call_child(self, ref: str, child: str, body: dict[str, Any]
                   ) -> Future[dict[str, Any]]:
        """Start (or find again) sub-task ``child`` for the handler of ``ref`` (any
        thread): a future of the queen's ``task.called`` (its state, and its final
        result once it ended)."""
        reply: Future[dict[str, Any]] = Future()
        self.call_soon(self._call_child, body, ref, reply)
        return reply

    def _call_child(self, body: dict[str, Any], ref: str, reply: Future[Any]) -> None:
        msg = p.Message("task.call", body, ref=ref, to="queen")
        self.await_reply(msg.id, reply)
        self._fsess().send(msg)

    def _on_peer_message(self, msg: p.Message) -> None:
        for cb in self._message_callbacks:
            try:
                cb(msg)
            except Exception:
                log.exception("%s: message callback failed", self.name)

    # -- worker threads -------------------------------------------------------------------

    def _done(self, ctx: TaskContext, body: dict[str, Any]) -> None:
        """A handler ended (any thread): its outcome goes to the session, in order after
        what the handler sent while it ran."""
        ctx._ended = True
        if threading.get_ident() == self._io_ident:
            self._finished(ctx, body)  # (an inline handler: call_soon's test, one call less)
        else:
            self.call_soon(self._finished, ctx, body)

    def _finished(self, ctx: TaskContext, body: dict[str, Any]) -> None:
        fs = self._fs
        assert fs is not None
        ref = ctx.ref
        if fs.finished(ref, ctx._run, body) and self.running.get(ref) is ctx:
            del self.running[ref]

    def _failed(self, h: Handler, ctx: TaskContext, e: BaseException) -> dict[str, Any]:
        if isinstance(e, TaskCancelled) and ctx.is_cancelled:
            # ctx.ask (or another wait) raising because the task was cancelled: the
            # task's outcome, not the handler's failure.
            log.info("%s: task %s (%s, attempt %d) cancelled", self.name, ctx.task_id,
                     ctx.capability, ctx.attempt)
            return {"status": "cancelled"}
        body = h.failed(e)
        # The person running this forager sees the failure where it happened, the whole
        # traceback; the submitter gets the bounded one in the result.
        own = own_failure(e)  # meshant's own frames only: the message says it all
        log.warning("%s: task %s (%s, attempt %d) failed%s%s", self.name, ctx.task_id,
                    ctx.capability, ctx.attempt,
                    " (its retry_on: the queen runs it again while attempts are left)"
                    if body["error"].get("retry") else "",
                    f": {type(e).__name__}: {e}" if own else "", exc_info=None if own else e)
        return body

    def _run_one(self, h: Handler, payload: Any, ctx: TaskContext) -> None:
        try:
            result = h.fn(payload, ctx) if h.takes_ctx else h.fn(payload)
            body = {"status": "ok", "result": p.wrap_blob(result)}
        except Exception as e:
            body = self._failed(h, ctx, e)
        except Suspend as s:
            body = self._suspended(ctx, s)
        except Diverged as d:
            body = self._diverged(ctx, d)
        self._done(ctx, body)

    def _suspended(self, ctx: TaskContext, s: Suspend) -> dict[str, Any]:
        if ctx.is_cancelled:
            return {"status": "cancelled"}
        log.info("%s: task %s (%s) suspended: %s", self.name, ctx.task_id, ctx.capability,
                 s.wait)
        return {"status": "suspended", "wait": s.wait}

    def _diverged(self, ctx: TaskContext, d: Diverged) -> dict[str, Any]:
        log.warning("%s: task %s (%s, attempt %d) failed: %s", self.name, ctx.task_id,
                    ctx.capability, ctx.attempt, d.message)
        return diverged_body(d)

    async def _run_async(self, h: Handler, payload: Any, ctx: TaskContext) -> None:
        try:
            result = await (h.fn(payload, ctx) if h.takes_ctx else h.fn(payload))
            body = {"status": "ok", "result": p.wrap_blob(result)}
        except asyncio.CancelledError:
            body = {"status": "cancelled"}
        except Exception as e:
            body = self._failed(h, ctx, e)
        except Suspend as s:
            body = self._suspended(ctx, s)
        except Diverged as d:
            body = self._diverged(ctx, d)
        self._done(ctx, body)

    def _run_batch(self, h: Handler, cap: str) -> None:
        pending = self._batches[cap]
        items: list[tuple[Any, TaskContext]] = []
        assert h.batch is not None
        while pending and len(items) < h.batch:
            try:
                items.append(pending.popleft())
            except IndexError:
                break
        if not items:
            return
        payloads = [i[0] for i in items]
        ctxs = [i[1] for i in items]
        try:
            results = h.fn(payloads, ctxs) if h.takes_ctx else h.fn(payloads)
            results = list(results)
            if len(results) != len(items):
                raise ValueError(f"batch handler returned {len(results)} results for "
                                 f"{len(items)} tasks")
            bodies = [self._failed(h, c, r) if isinstance(r, BaseException)
                      else {"status": "ok", "result": p.wrap_blob(r)}
                      for c, r in zip(ctxs, results, strict=True)]
        except Exception as e:
            bodies = [self._failed(h, ctxs[0], e)] + [h.failed(e)] * (len(items) - 1)
        for ctx, body in zip(ctxs, bodies, strict=True):
            self._done(ctx, dict(body))

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._aloop is None:
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name=f"meshant-{self.name}-async",
                                 daemon=True)
            t.start()
            self._aloop, self._aloop_thread = loop, t
        return self._aloop

    @property
    def message_callbacks(self) -> tuple[Callable[[p.Message], Any], ...]:
        """The callbacks registered with ``on_message``, in order (to copy to another forager)."""
        return tuple(self._message_callbacks)


__all__ = ["Forager", "TaskContext"]  # TaskContext lives in meshant.actors.handlers
