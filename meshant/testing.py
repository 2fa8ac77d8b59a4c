"""Test a handler without a colony: :func:`run_handler` calls it as a forager would, with a
recording context, and returns what it did — its result or exception, the partial results
and progress it reported, the questions it asked (answered from a script) and the graph
nodes it spawned. Like Celery's eager mode or httpcore's mock transports, nothing is sent
anywhere::

    from meshant.testing import run_handler

    def test_summarise():
        run = run_handler(summarise, "a long text", answers=["yes"])
        assert run.result == "done"
        assert run.partials == ["a long", "text"]
        assert run.questions[0].prompt == "Publish?"
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar, Unpack, overload

import msgpack

from meshant import protocol as p
from meshant.actors.capability import AsyncCapability, BatchCapability, Capability
from meshant.actors.durable import Diverged, Suspend, blob_bytes
from meshant.actors.handlers import TaskContext, positional_args
from meshant.errors import AskTimeout, ConfigError, NonDeterministic, TaskCancelled

R = TypeVar("R")

_NO_ANSWER = object()


@dataclass(slots=True)
class Question:
    """A question the handler asked (``ctx.ask``) and the scripted answer it was given
    (``answered`` False: the script had none, and ``ask`` raised AskTimeout)."""

    prompt: Any
    data: Any = None
    timeout: float | None = None
    answer: Any = None
    answered: bool = False


@dataclass(slots=True)
class Run(Generic[R]):
    """What one handler call did, in the order it did it."""

    result: R | None = None
    error: BaseException | None = None  # what the handler raised (or a result not sendable)
    partials: list[Any] = field(default_factory=list)
    progress: list[tuple[float | None, str | None]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    spawns: list[dict[str, Any]] = field(default_factory=list)  # nodes, as ctx.spawn made them
    cancelled: bool = False  # the script cancelled the task while it ran
    seconds: float = 0.0
    # Durable steps: the records this run made (ctx.step, ctx.call, ctx.sleep, a
    # durable ctx.ask), each a map as the journal keeps it; the steps it was given
    # back (replayed, not run); and what it suspended on (its run ended waiting).
    steps: list[dict[str, Any]] = field(default_factory=list)
    replayed: int = 0
    suspended: dict[str, Any] | None = None
    _answers: dict[str, Any] = field(default_factory=dict, repr=False)  # durable asks'
    _ask: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True when the handler returned a result the wire can carry."""
        return self.error is None

    def value(self) -> R:
        """The result, or the handler's exception raised again."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class _Recorder:
    """Plays the forager for one context: records what the handler sends and answers its
    questions from the script."""

    features = frozenset({"progress", "steps"})

    def __init__(self, run: Run[Any], answers: Callable[[Any, Any], Any] | Iterable[Any],
                 cancel_after: int | None) -> None:
        self.run = run
        self.ctx: TaskContext | None = None
        self._script = answers if callable(answers) else iter(answers)
        self._cancel_after = cancel_after
        self._reports = 0
        # ctx.call's sub-tasks: capability -> a function of the payload (or a value).
        self.children: dict[str, Any] = {}
        run._ask = self._durable_ask

    def _durable_ask(self, wait: dict[str, Any]) -> None:
        """A durable question (it came with the suspension): the script answers it."""
        q = Question(p.unwrap_blob(wait.get("prompt")), p.unwrap_blob(wait.get("data")))
        self.run.questions.append(q)
        answer = self._answer(q)
        if answer is not _NO_ANSWER:
            q.answer, q.answered = answer, True
            self.run._answers[wait["request"]] = answer

    def call_child(self, ref: str, child: str, body: dict[str, Any]) -> Any:
        """A sub-task, run here: by the script's function (or value) for its capability."""
        from concurrent.futures import Future
        fut: Future[dict[str, Any]] = Future()
        cap = body["capability"]
        if cap not in self.children:
            fut.set_exception(ConfigError(f"the handler calls a sub-task of {cap!r}: give "
                                          f"run_handler children={{{cap!r}: fn}}"))
            return fut
        fn = self.children[cap]
        try:
            value = fn(p.unwrap_blob(body.get("payload"))) if callable(fn) else fn
            final: dict[str, Any] = {"state": "completed", "result": value}
        except Exception as e:
            from meshant.actors.failures import error_body
            final = {"state": "failed", "error": error_body(e)["error"]}
        fut.set_result({"child": child, "state": final["state"], "final": final})
        return fut

    def send_message(self, msg: p.Message) -> None:
        b = msg.b
        ctx = self.ctx
        assert ctx is not None
        if msg.kind == "task.result" and b.get("partial"):
            self.run.partials.append(p.unwrap_blob(b.get("value")))
            self._reported(ctx)
        elif msg.kind == "task.progress":
            self.run.progress.append((b.get("fraction"), b.get("note")))
            self._reported(ctx)
        elif msg.kind == "task.ask" and not b.get("withdraw"):
            q = Question(p.unwrap_blob(b.get("prompt")), p.unwrap_blob(b.get("data")),
                         b.get("timeout"))
            self.run.questions.append(q)
            answer = self._answer(q)
            if answer is _NO_ANSWER:
                ctx.refused(msg.id, AskTimeout(
                    f"no scripted answer to question {len(self.run.questions)} "
                    f"({q.prompt!r}): give run_handler more answers", request=b["request"]))
            else:
                q.answer, q.answered = answer, True
                ctx.answered(b["request"], answer)
                self.run._answers[b["request"]] = answer  # (a durable ask's: recorded)
        elif msg.kind == "task.step":
            # As the journal keeps it (a tuple comes back a list), its number dropped.
            rec = msgpack.unpackb(msgpack.packb({k: v for k, v in b.items() if k != "n"},
                                                default=blob_bytes), raw=False)
            self.run.steps.append(rec)
        elif msg.kind == "graph.spawn":
            self.run.spawns.extend({**n, "payload": p.unwrap_blob(n.get("payload"))}
                                   for n in b.get("nodes", []))

    def _answer(self, q: Question) -> Any:
        if callable(self._script):
            return self._script(q.prompt, q.data)
        return next(self._script, _NO_ANSWER)

    def _reported(self, ctx: TaskContext) -> None:
        self._reports += 1
        if self._cancel_after is not None and self._reports >= self._cancel_after:
            self.run.cancelled = True
            ctx.cancel()


def _prepare(handler: Any, payload: Any, answers: Any, cancel_after: int | None,
             attempt: int, task_id: str, capability: str | None,
             timeout: float | None, steps: list[dict[str, Any]] | None = None,
             children: dict[str, Any] | None = None, durable: bool | None = None
             ) -> tuple[Run[Any], Callable[[], Any], bool]:
    if isinstance(answers, str | bytes):
        raise ConfigError("answers is a list of answers (or a function of the prompt and "
                          f"data), not one string: answers=[{answers!r}]")
    if cancel_after is not None and (cancel_after.__class__ is not int or cancel_after < 0):
        raise ConfigError(f"cancel_after is a number of reports >= 0, not {cancel_after!r}")
    if isinstance(handler, Capability):
        name, fn = handler.name, handler.fn
    elif callable(handler):
        name, fn = getattr(handler, "__name__", "handler"), handler
    else:
        raise ConfigError(f"run_handler takes a handler, not {type(handler).__name__}")
    run: Run[Any] = Run()
    rec = _Recorder(run, answers, cancel_after)
    deadline = time.monotonic() + timeout if timeout is not None else None
    ctx = TaskContext(rec, f"{task_id}.{attempt}", task_id, attempt, capability or name,
                      deadline)
    rec.ctx = ctx
    ctx._durable = bool(getattr(handler, "durable", False)) if durable is None else durable
    if steps is not None:
        if not isinstance(steps, list) or not all(isinstance(r, dict) for r in steps):
            raise ConfigError("steps is a list of step records (maps, as a Run's steps or "
                              "`meshant task ID --json` give them)")
        ctx.recorded(steps)
        run.replayed = len(steps)
    if children is not None:
        rec.children = children
    if cancel_after == 0:
        run.cancelled = True
        ctx.cancel()
    batch = isinstance(handler, BatchCapability)
    takes_ctx = positional_args(fn, 2) >= 2
    if batch:  # one task, as the forager would batch it alone
        def call() -> Any:
            out = list(fn([payload], [ctx]) if takes_ctx else fn([payload]))
            if len(out) != 1:
                raise ValueError(f"batch handler returned {len(out)} results for 1 task")
            if isinstance(out[0], BaseException):
                raise out[0]
            return out[0]
    else:
        def call() -> Any:
            return fn(payload, ctx) if takes_ctx else fn(payload)
    is_async = isinstance(handler, AsyncCapability) or inspect.iscoroutinefunction(fn)
    return run, call, is_async


@contextmanager
def _recording(run: Run[Any]) -> Iterator[list[Any]]:
    """Around the handler's call: its result (appended to the list yielded) or its
    exception goes into ``run``, with the time it took."""
    t0 = time.monotonic()
    result: list[Any] = []
    try:
        yield result
    except TaskCancelled as e:
        run.error, run.cancelled = e, True
    except Exception as e:
        run.error = e
    except Suspend as s:
        run.suspended = w = s.wait
        if isinstance(w.get("request"), str) and run._ask is not None:
            run._ask(w)  # (a durable question: asked as the queen would, from the wait)
        if w.get("request") in run._answers:
            # Answered by the script: the record the queen would make, so a run given
            # these steps goes on past the question.
            run.steps.append({"position": w["position"], "kind": "ask", "name": w["name"],
                              "occurrence": w["occurrence"], "request": w["request"],
                              "value": run._answers[w["request"]]})
    except Diverged as d:
        run.error = NonDeterministic(d.message)
    else:
        try:  # what the forager would send: a result the wire cannot carry fails the task
            p.binary.encode(p.Message("task.result", {"status": "ok",
                                                      "result": p.wrap_blob(result[0])}))
            run.result = result[0]
        except p.ProtocolError as e:
            run.error = e
    run.seconds = time.monotonic() - t0


class Script(TypedDict, total=False):
    """The keyword arguments of :func:`run_handler`: what the test scripts around the
    handler."""

    answers: Iterable[Any] | Callable[[Any, Any], Any]
    cancel_after: int | None
    attempt: int
    task_id: str
    capability: str | None
    timeout: float | None
    steps: list[dict[str, Any]] | None
    children: dict[str, Any] | None
    durable: bool | None


@overload
def run_handler(handler: Capability[Any, R], payload: Any = None,
                **script: Unpack[Script]) -> Run[R]: ...


@overload
def run_handler(handler: Callable[..., Any], payload: Any = None,
                **script: Unpack[Script]) -> Run[Any]: ...


def run_handler(handler: Any, payload: Any = None, *,
                answers: Iterable[Any] | Callable[[Any, Any], Any] = (),
                cancel_after: int | None = None, attempt: int = 1,
                task_id: str = "test-task", capability: str | None = None,
                timeout: float | None = None, steps: list[dict[str, Any]] | None = None,
                children: dict[str, Any] | None = None, durable: bool | None = None
                ) -> Run[Any]:
    """Run ``handler`` (a function, or what ``@forager.task`` returned) on ``payload`` as
    a forager would, and return the :class:`Run`: its ``result`` or ``error``, and what
    it reported meanwhile. Nothing touches a network.

    ``answers``: the answers to its ``ctx.ask`` questions, in order (or a function of
    ``(prompt, data)``); a question beyond them raises AskTimeout in the handler, as an
    unanswered one would. ``cancel_after=N`` cancels the task once the handler has sent
    N partial results or progress reports (0: before it starts); ``attempt``,
    ``task_id``, ``capability`` and ``timeout`` (its deadline) fill the context. An
    ``async def`` handler runs in a new event loop (from a coroutine, use
    :func:`run_handler_async`). The handler's exception is kept in ``error``, not
    raised: ``run.value()`` raises it.

    Durable steps: ``steps`` are the records an earlier run made (a Run's ``steps``, or
    a task's from ``meshant task ID --json``): this run replays them, as a resumption
    would (``run.replayed``), records what it does past them (``run.steps``), and a
    wait it reaches (``ctx.sleep``, a durable ``ctx.ask``) ends it with
    ``run.suspended`` set. ``children``: what ``ctx.call`` gets, by capability (a
    function of the payload, or a value). ``durable``: its ``ctx.ask`` questions are
    durable (default: as ``@forager.task(..., durable=True)`` registered it).
    """
    run, call, is_async = _prepare(handler, payload, answers, cancel_after, attempt, task_id,
                                   capability, timeout, steps, children, durable)
    if is_async:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise ConfigError("run_handler was called from a running event loop: "
                              "await run_handler_async(...) instead")
    with _recording(run) as result:
        result.append(asyncio.run(call()) if is_async else call())
    return run


@overload
async def run_handler_async(handler: Capability[Any, R], payload: Any = None,
                            **script: Unpack[Script]) -> Run[R]: ...


@overload
async def run_handler_async(handler: Callable[..., Any], payload: Any = None,
                            **script: Unpack[Script]) -> Run[Any]: ...


async def run_handler_async(handler: Any, payload: Any = None, *,
                            answers: Iterable[Any] | Callable[[Any, Any], Any] = (),
                            cancel_after: int | None = None, attempt: int = 1,
                            task_id: str = "test-task", capability: str | None = None,
                            timeout: float | None = None,
                            steps: list[dict[str, Any]] | None = None,
                            children: dict[str, Any] | None = None,
                            durable: bool | None = None) -> Run[Any]:
    """:func:`run_handler` from a coroutine: an ``async def`` handler runs on the caller's
    loop, a plain one in a thread."""
    run, call, is_async = _prepare(handler, payload, answers, cancel_after, attempt, task_id,
                                   capability, timeout, steps, children, durable)
    with _recording(run) as result:
        result.append(await call() if is_async else await asyncio.to_thread(call))
    return run


__all__ = ["Question", "Run", "Script", "run_handler", "run_handler_async"]
