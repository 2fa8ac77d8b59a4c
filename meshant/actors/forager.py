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
from typing import Any, ParamSpec, TypeVar, cast

import zmq

from meshant import protocol as p
from meshant.actors._peer import Peer
from meshant.actors.config import ForagerConfig, settle
from meshant.actors.futures import fail
from meshant.actors.handlers import Handler, TaskContext, error_body, positional_args
from meshant.actors.workers import Workers
from meshant.errors import MeshantError, from_error_body
from meshant.observe import tracing
from meshant.protocol.codes import Code

log = logging.getLogger("meshant.forager")

P = ParamSpec("P")
R = TypeVar("R")

# A task that finishes within this long sends only its result, which implies acceptance:
# one message fewer per short task. Longer tasks send task.accept once it has passed.
ACCEPT_DELAY = 0.002
RESENT_MAX = 10_000


def _call_logged(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("broadcast handler %s failed", getattr(fn, "__name__", fn))


class Forager(Peer):
    """A worker agent. ``slots`` tasks run at once; handlers are sync or ``async def``."""

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
        slots, labels = c.slots, c.labels
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self.labels = dict(labels or {})
        self.handlers: dict[str, Handler] = {}
        self.running: dict[str, TaskContext] = {}
        self.draining = False
        self._orphaned_since: float | None = None  # draining, with results and no queen
        self._pool: Workers | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aloop_thread: threading.Thread | None = None
        self._batches: dict[str, deque[tuple[Any, TaskContext]]] = {}
        self._message_callbacks: list[Callable[[p.Message], Any]] = []
        self._accepts: dict[str, float] = {}
        # Final results sent lately, (when, message or batch item): a connection that dies
        # takes what it had not delivered with it, so these go again after a reconnect
        # (the queen drops any it already had). Kept for as long as it takes to notice a
        # dead queen, and at most RESENT_MAX of them.
        self._sent: deque[tuple[float, Any]] = deque()
        self._orphans: set[str] = set()
        self._handlers.update({
            "task.assign": self._on_assign,
            "task.assigns": self._on_assigns,
            "task.cancel": self._on_cancel,
            "task.answer": self._on_answer,
            "ctl.drain": self._on_drain,
            "ctl.halt": self._on_halt,
            "msg": self._on_peer_message,
            "note": self._on_peer_message,
            "graph.spawned": self._on_reply,  # ctx.spawn's answer
        })
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
            raise ValueError("slots must be at least 1")
        if queen is None and not c.discover:
            queen = ",".join(self.queens) or None  # the endpoint it has, unless rediscovering
        self._settle(queen, c.name or self.name, c.colony, c.discover, c.curve_secret,
                     c.queen_key, c.follow_leader)
        self.config, self.slots, self.labels = c, c.slots, dict(c.labels or {})

    # -- registering handlers -------------------------------------------------------------

    def task(self, capability: str, *, batch: int | None = None,
             inline: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator: ``@forager.task("crawl")`` serves the ``crawl`` capability.

        The handler is called as ``fn(payload, ctx)`` (or ``fn(payload)``: a parameter
        with a default is never filled) in a worker thread. With ``batch=N`` it is called
        as ``fn(payloads, ctxs)`` with up to N tasks and returns one result per task (an
        Exception instance in the list fails just that task). ``inline=True`` runs it in
        the I/O thread itself, saving two thread hand-offs per task: only for handlers
        that take microseconds and never block.
        """
        def deco(fn: Callable[P, R]) -> Callable[P, R]:
            self.add_handler(capability, fn, batch=batch, inline=inline)
            return fn
        return deco

    def add_handler(self, capability: str, fn: Callable[..., Any], *,
                    batch: int | None = None, inline: bool = False) -> None:
        """Serve ``capability`` with ``fn``; see :meth:`task`."""
        if self._thread is not None:
            raise RuntimeError("add handlers before starting the forager")
        if batch is not None and batch < 1:
            raise ValueError("batch must be at least 1")
        if inline and (batch is not None or inspect.iscoroutinefunction(fn)):
            raise ValueError("inline handlers are plain functions without batch")
        self.handlers[capability] = Handler.of(fn, batch, inline)

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

    def start(self, timeout: float | None = 10.0) -> Forager:
        """Run in a background thread; returns once the queen welcomed this forager."""
        if not self.handlers:
            raise RuntimeError("no handlers: register one with @forager.task(capability)")
        self._pool = Workers(self.slots, f"meshant-{self.name}")
        self._start_io(timeout)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop: running tasks are told to cancel and the queen is told we are leaving."""
        for ctx in list(self.running.values()):
            ctx.cancel()
        self.close(timeout)
        if self._pool is not None:
            self._pool.shutdown()
        loop, t = self._aloop, self._aloop_thread
        if loop is not None and t is not None:
            self._aloop = self._aloop_thread = None
            loop.call_soon_threadsafe(loop.stop)
            t.join(timeout)
            if not t.is_alive():
                loop.close()

    def run(self, *, install_signals: bool = True, drain_timeout: float = 600.0) -> None:
        """Serve until stopped; waits for the queen if it is not up yet.

        SIGTERM drains (finish the running tasks, take no new ones, then leave; at most
        ``drain_timeout`` seconds); SIGINT, or a second signal, stops at once and hands
        the running tasks back to the queen.
        """
        if not self.handlers:
            raise RuntimeError("no handlers: register one with @forager.task(capability)")
        restore: dict[int, Any] = {}
        drain_deadline: list[float] = []

        def on_signal(sig: int, _frame: Any) -> None:
            if sig == signal.SIGTERM and not self.draining:
                drain_deadline.append(time.monotonic() + drain_timeout)
                self.drain()
            else:
                self._stopping.set()

        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                restore[sig] = signal.signal(sig, on_signal)
        try:
            self._pool = Workers(self.slots, f"meshant-{self.name}")
            self._start_io(None)
            while not self._stopping.wait(0.2):
                if drain_deadline and time.monotonic() > drain_deadline[0]:
                    log.warning("%s: drain took longer than %g s; stopping", self.name,
                                drain_timeout)
                    break
        finally:
            self.stop()
            for signum, old in restore.items():
                signal.signal(signum, old)

    async def run_async(self) -> None:
        """Serve from asyncio: ``await forager.run_async()``; cancel the awaiting task to stop."""
        await asyncio.to_thread(self.start)
        try:
            while not self._stopped.is_set():
                await asyncio.sleep(0.1)
        finally:
            await asyncio.to_thread(self.stop)

    @property
    def tools(self) -> list[str]:
        return sorted(self.handlers)

    # -- I/O thread -----------------------------------------------------------------------

    def _hello_body(self) -> dict[str, Any]:
        body = super()._hello_body()
        # Tasks still running, and finished ones whose results wait to be sent: a queen
        # that knows them adopts them instead of running them again.
        running = list(self.running) + [
            m.ref for m in list(self._outbox)
            if isinstance(m, p.Message) and m.kind == "task.result" and m.ref]
        body.update(slots=self.slots, tools=self.tools, labels=self.labels, running=running)
        return body

    def _hb_body(self) -> dict[str, Any]:
        body = {"slots": self.slots, "in_flight": len(self.running),
                "running": list(self.running), "tools": self.tools}
        if self.draining:
            body["state"] = "draining"
        return body

    def _next_timer(self) -> float:
        t = super()._next_timer()
        if self._accepts:
            t = min(t, min(self._accepts.values()))
        return t

    def _on_timers(self, now: float) -> None:
        sent = self._sent
        mon = self._sess.monitor
        patience = mon.timeout if mon is not None else 5 * self._sess.hb_interval
        if sent:
            keep = patience + 2.0
            while sent and (sent[0][0] < now - keep or len(sent) > RESENT_MAX):
                sent.popleft()
        if self.draining and not self.running:
            if not self._outbox:
                self._stopping.set()  # drained: leave (the queen is told on the way out)
            elif self._welcomed.is_set():
                self._orphaned_since = None
            elif self._orphaned_since is None:
                self._orphaned_since = now
            elif now - self._orphaned_since > patience:
                # Results wait for a queen that is gone (its farewell, or silence): wait
                # a heartbeat timeout for it to come back, not the whole drain timeout.
                # A queen that returns later holds those tasks and runs them again.
                log.warning("%s: leaving with %d messages unsent: the queen is gone",
                            self.name, len(self._outbox))
                self._stopping.set()
        if self._accepts:
            due = [ref for ref, t in self._accepts.items() if t <= now]
            for ref in due:
                del self._accepts[ref]
                self._send_now(p.Message("task.accept", None, ref=ref, to="queen"))

    def _busy(self) -> bool:
        # The heartbeat lists running tasks and renews their leases, so while tasks run it
        # goes out every interval even when other messages keep the socket busy.
        return bool(self.running)

    def _flush(self, queued: deque[p.Message | list[bytes]]) -> None:
        outbox = cast("deque[p.Message]", queued)  # a forager queues messages, never frames
        accepts = self._accepts
        if accepts:
            # Anything sent about a task implies it was accepted.
            for msg in outbox:
                if msg.ref in accepts:
                    del accepts[msg.ref]
        if "batch" in self.features and len(outbox) > 1:
            results: list[dict[str, Any]] = []
            while outbox:
                msg = outbox.popleft()
                if msg.kind == "task.result" and not msg.b.get("partial"):
                    results.append({**msg.b, "ref": msg.ref})
                    continue
                if results:
                    self._send_results(results)
                    results = []
                self._send_checked(msg)
            if results:
                self._send_results(results)
            return
        while outbox:
            self._send_checked(outbox.popleft())

    def _send_results(self, results: list[dict[str, Any]]) -> None:
        if len(results) == 1:
            r = results[0]
            ref = r.pop("ref")
            self._send_checked(p.Message("task.result", r, ref=ref, to="queen"))
        else:
            self._send_checked(p.Message("task.batch", {"results": results}, to="queen"))

    def _queen_lost(self, now: float, why: str) -> None:
        # Results sent lately may have died with the old connection: they go first on
        # the new one (and the hello lists them, so a restarted queen adopts their tasks).
        again: list[p.Message] = []
        for _, item in self._sent:
            if isinstance(item, p.Message):
                again.append(item)
            else:
                body = {k: v for k, v in item.items() if k != "ref"}
                again.append(p.Message("task.result", body, ref=item["ref"], to="queen"))
        self._sent.clear()
        self._outbox.extendleft(reversed(again))

    def _send_checked(self, msg: p.Message) -> None:
        try:
            self._send_now(msg)
            if msg.kind == "task.batch":
                now = time.monotonic()
                self._sent.extend((now, r) for r in msg.b["results"])
            elif msg.kind == "task.result" and not msg.b.get("partial"):
                self._sent.append((time.monotonic(), msg))
        except p.ProtocolError as e:
            # The handler returned something msgpack cannot carry: fail the task, clearly.
            if msg.kind == "task.batch":
                for r in msg.b["results"]:
                    ref = r.pop("ref")
                    self._send_checked(p.Message("task.result", r, ref=ref, to="queen"))
                return
            if msg.kind != "task.result":
                log.warning("%s: cannot send %s: %s", self.name, msg.kind, e)
                return
            if msg.b.get("partial"):
                log.error("%s: dropped a partial result of %s: %s", self.name, msg.ref,
                          e.message)
                return
            if e.code == Code.TOO_LARGE:
                # A retry cannot make it smaller: the task fails for good, at once.
                error = {"type": "TooLarge", "code": Code.TOO_LARGE,
                         "message": f"result of {e.message}"}
            else:
                error = {"type": "EncodeError",
                         "message": f"result cannot be encoded: {e.message}"}
            self._send_now(p.Message("task.result", {"status": "error", "error": error},
                                     ref=msg.ref, to="queen"))

    def _on_assigns(self, msg: p.Message) -> None:
        for body in msg.b["assigns"]:
            if isinstance(body, dict) and isinstance(body.get("id"), str):
                self._assign(body["id"], body, body.get("traceparent"))
            else:
                log.warning("%s: malformed entry in task.assigns", self.name)

    def _on_assign(self, msg: p.Message) -> None:
        self._assign(msg.id, msg.b, msg.extra.get(tracing.TRACEPARENT) if msg.extra else None)

    def _assign(self, ref: str, body: dict[str, Any], trace: Any = None) -> None:
        cap = body.get("capability") or body.get("node") or ""
        h = self.handlers.get(cap)
        if h is None or self.draining:
            reason = "draining" if self.draining else (
                f"no handler for capability {cap!r} (this forager serves "
                f"{', '.join(self.tools)})")
            self._send_now(p.Message("task.reject", {"reason": reason}, ref=ref, to="queen"))
            return
        timeout = body.get("timeout")
        deadline = time.monotonic() + timeout if isinstance(timeout, int | float) else None
        ctx = TaskContext(self, ref, str(body.get("task", ref)), int(body.get("attempt", 1)),
                          cap, deadline)
        self.running[ref] = ctx
        self._accepts[ref] = time.monotonic() + ACCEPT_DELAY
        payload = p.unwrap_blob(body.get("payload"))
        if isinstance(trace, str) and h.batch is None:
            # The handler's span is the child of the queen's scheduling span (meshant[otel]).
            h = dataclasses.replace(h, fn=tracing.traced(h.fn, trace, {
                "meshant.task": ctx.task_id, "meshant.capability": cap,
                "meshant.attempt": ctx.attempt}, h.is_async))
        if h.inline:
            self._run_one(h, payload, ctx)
        elif h.batch is not None:
            self._batches.setdefault(cap, deque()).append((payload, ctx))
            self._submit(self._run_batch, h, cap)
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

    def _on_cancel(self, msg: p.Message) -> None:
        ctx = self.running.get(msg.ref or "")
        if ctx is None:
            return
        ctx.cancel()
        if ctx._future is not None:
            ctx._future.cancel()

    def _on_answer(self, msg: p.Message) -> None:
        ctx = self.running.get(msg.ref or "")
        request = msg.b.get("request")
        if ctx is not None and isinstance(request, str):
            ctx.answered(request, msg.b.get("value"))

    def _after_welcome(self, first: bool) -> None:
        # Questions still waiting go again: the queen answers one it holds the answer
        # to (the answer was lost with a connection), or keeps waiting.
        for ctx in list(self.running.values()):
            for m in ctx.pending_asks():
                self.send_message(m)

    def drain(self) -> None:
        """Finish the running tasks, accept nothing new, then leave (safe from any thread)."""
        self.call_soon(self._start_drain)

    def _start_drain(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("%s: draining (%d tasks running)", self.name, len(self.running))
            if self._welcomed.is_set():
                # Tell the queen now, so it assigns nothing more meanwhile.
                self._send_now(p.Message("hb", self._hb_body(), to="queen"))

    def _on_drain(self, msg: p.Message) -> None:
        self._start_drain()

    def _on_halt(self, msg: p.Message) -> None:
        self._stopping.set()

    def await_reply(self, msg_id: str, fut: Future[Any]) -> None:
        """Resolve ``fut`` with the queen's answer to message ``msg_id`` (``ctx.spawn``).
        Bounded: the oldest unanswered are given up."""
        self._replies[msg_id] = fut
        while len(self._replies) > RESENT_MAX:
            fail(self._replies.popitem(last=False)[1],
                 MeshantError("no answer from the queen", code=Code.TIMEOUT))

    def _on_reply(self, msg: p.Message) -> None:
        fut = self._replies.pop(msg.ref or "", None)
        if fut is not None and not fut.done():
            fut.set_result(msg.b.get("nodes", msg.b))

    def _on_remote_error(self, msg: p.Message) -> None:
        if msg.ref and any(ctx.refused(msg.ref, from_error_body(msg.b))
                           for ctx in list(self.running.values())):
            return  # a refused question: its ctx.ask raises the error
        fut = self._replies.pop(msg.ref or "", None)
        if fut is not None:
            fail(fut, from_error_body(msg.b))
            return
        assign = msg.b.get("assign")
        if msg.b.get("code") == Code.UNKNOWN_TASK and isinstance(assign, str):
            ctx = self.running.get(assign)
            if assign in self._orphans:
                return  # said once already
            self._orphans.add(assign)
            if len(self._orphans) > RESENT_MAX:
                self._orphans.clear()
            if ctx is not None:
                # The queen no longer knows this assignment (it restarted without it): the
                # work has no one to go to. Stop it as if cancelled, and say so once.
                log.warning("%s: the queen does not know task %s (assign %s) any more; "
                            "stopping its handler", self.name, ctx.task_id, assign)
                ctx.cancel()
                if ctx._future is not None:
                    ctx._future.cancel()
            return
        super()._on_remote_error(msg)

    def _on_peer_message(self, msg: p.Message) -> None:
        for cb in self._message_callbacks:
            try:
                cb(msg)
            except Exception:
                log.exception("%s: message callback failed", self.name)

    # -- worker threads -------------------------------------------------------------------

    def _done(self, ctx: TaskContext, body: dict[str, Any]) -> None:
        if self.running.get(ctx.ref) is not ctx:
            # A run the queen told us to stop after it restarted without it, whose id a
            # new assignment (the client re-sent the task) reuses: that one is tracked
            # now, and this run's outcome belongs to nobody.
            return
        if ctx._cancelled:
            body = {"status": "cancelled"}
        self.running.pop(ctx.ref, None)
        self.send_message(p.Message("task.result", body, ref=ctx.ref, to="queen"))

    def _run_one(self, h: Handler, payload: Any, ctx: TaskContext) -> None:
        try:
            result = h.fn(payload, ctx) if h.takes_ctx else h.fn(payload)
            body = {"status": "ok", "result": p.wrap_blob(result)}
        except Exception as e:
            body = error_body(e)
        self._done(ctx, body)

    async def _run_async(self, h: Handler, payload: Any, ctx: TaskContext) -> None:
        try:
            result = await (h.fn(payload, ctx) if h.takes_ctx else h.fn(payload))
            body = {"status": "ok", "result": p.wrap_blob(result)}
        except asyncio.CancelledError:
            body = {"status": "cancelled"}
        except Exception as e:
            body = error_body(e)
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
            bodies = [error_body(r) if isinstance(r, BaseException)
                      else {"status": "ok", "result": p.wrap_blob(r)} for r in results]
        except Exception as e:
            bodies = [error_body(e)] * len(items)
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
