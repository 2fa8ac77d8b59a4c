"""Writing and calling handlers (issue #24, items 3-5): a handler tested without a colony
(``meshant.testing``), a decorated handler as the typed call site, and the forager as a
context manager and on the caller's event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from meshant import Capability, Forager, TaskContext
from meshant.errors import AskTimeout, TaskCancelled
from meshant.protocol import ProtocolError
from meshant.testing import run_handler, run_handler_async

from .conftest import Colony, wait_for

ROOT = Path(__file__).resolve().parent.parent

# -- 3: a handler tested without a colony ---------------------------------------------------

f = Forager("tcp://127.0.0.1:1", name="offline")  # never started: registering is enough


@f.task("publish")
def publish(text: str, ctx: TaskContext) -> dict[str, Any]:
    words = text.split()
    for i, w in enumerate(words):
        if ctx.is_cancelled:
            return {"stopped_at": i}
        ctx.partial(w)
        ctx.progress((i + 1) / len(words), note=f"word {i + 1}")
    ok = ctx.ask("Publish?", data={"words": len(words)}, timeout=30)
    if ok != "yes":
        return {"published": False}
    ctx.spawn("notify", "mail", {"to": "desk"}, priority=10)
    return {"published": True, "attempt": ctx.attempt, "task": ctx.task_id}


@f.task("later")
async def later(n: int, ctx: TaskContext) -> int:
    got = await ctx.ask_async("factor?")
    return n * int(got)


@f.task("embed", batch=4)
def embed(texts: list[str]) -> list[Any]:
    return [ValueError("empty") if not t else len(t) for t in texts]


def test_run_handler_records_everything_the_handler_did() -> None:
    run = run_handler(publish, "hello brave world", answers=["yes"], attempt=2, task_id="t9")
    assert run.ok and run.value() == {"published": True, "attempt": 2, "task": "t9"}
    assert run.partials == ["hello", "brave", "world"]
    assert run.progress == [(1 / 3, "word 1"), (2 / 3, "word 2"), (1.0, "word 3")]
    (q,) = run.questions
    assert (q.prompt, q.data, q.timeout, q.answer, q.answered) == (
        "Publish?", {"words": 3}, 30.0, "yes", True)
    (node,) = run.spawns
    assert node == {"name": "notify", "capability": "mail", "payload": {"to": "desk"},
                    "priority": 10}
    # An answer from a function of the question; another outcome.
    run = run_handler(publish, "a b", answers=lambda prompt, data: "no")
    assert run.result == {"published": False} and run.questions[0].answer == "no"


def test_run_handler_scripts_the_bad_days() -> None:
    # More questions than answers: the handler sees an AskTimeout, as unanswered.
    run = run_handler(publish, "one")
    assert isinstance(run.error, AskTimeout) and not run.questions[0].answered
    assert "no scripted answer to question 1 ('Publish?')" in str(run.error)
    with pytest.raises(AskTimeout):
        run.value()
    # Cancelled after three reports (a partial, a progress, a partial): it stops.
    run = run_handler(publish, "a b c d", cancel_after=3)
    assert run.cancelled and run.result == {"stopped_at": 2} and run.partials == ["a", "b"]
    # Cancelled before it starts: its ask raises TaskCancelled.
    run = run_handler(lambda t, ctx: ctx.ask("?"), "x", cancel_after=0)
    assert isinstance(run.error, TaskCancelled) and run.cancelled
    # A result the wire cannot carry fails as the forager would fail it.
    run = run_handler(lambda t: object(), "x")
    assert isinstance(run.error, ProtocolError) and not run.ok


def test_run_handler_runs_async_and_batch_handlers() -> None:
    assert run_handler(later, 6, answers=["7"]).value() == 42
    assert run_handler(embed, "four").value() == 4  # one task, as a batch of one
    assert isinstance(run_handler(embed, "").error, ValueError)  # its item failed

    async def main() -> int:
        run = await run_handler_async(later, 2, answers=["5"])
        with pytest.raises(Exception, match="await run_handler_async"):
            run_handler(later, 2, answers=["5"])  # from a running loop: said plainly
        return run.value()
    assert asyncio.run(main()) == 10


def test_a_decorated_handler_is_still_the_function() -> None:
    assert isinstance(publish, Capability) and publish.name == "publish"
    assert publish.__name__ == "publish" and publish.__wrapped__ is f.handlers["publish"].fn
    assert embed(["ab", "c"]) == [2, 1]  # a batch handler called with a list
    assert asyncio.run(square_of(3)) == 9


async def square_of(n: int) -> int:
    @f.task("sq")
    async def sq(x: int) -> int:
        return x * x
    return await sq(n)


def test_mistakes_in_the_script_are_said_plainly() -> None:
    from meshant.errors import ConfigError

    with pytest.raises(ConfigError, match=r"answers=\['yes'\]"):
        run_handler(publish, "g", answers="yes")  # not the answers 'y', 'e', 's'
    with pytest.raises(ConfigError, match="cancel_after is a number"):
        run_handler(publish, "g", cancel_after="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs the capability's name"):
        f.task(publish.fn)  # type: ignore[call-overload]  # (a bare @forager.task)


# -- 4: the decorated handler as the call site, typed ----------------------------------------

@pytest.mark.slow
def test_mypy_checks_a_module_shared_by_forager_and_client() -> None:
    ok = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                         "tests/typed/shared.py", "tests/typed/use.py"],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "tests/typed/misuse.py"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = [x for x in bad.stdout.splitlines() if ": error:" in x]
    assert bad.returncode == 1
    assert [int(x.split(":")[1]) for x in lines] == [11, 12, 13, 13], bad.stdout


def test_a_client_submits_by_the_decorated_handler(colony: Colony) -> None:
    from tests.typed import shared

    colony.start_queen()
    shared.forager.configure(colony.endpoint)  # the shared module's forager, served
    colony.foragers.append(shared.forager.start(timeout=10))
    c = colony.client()
    assert c.run(shared.summarise, "one two three", result_timeout=10) == {"words": 3}
    assert c.run(shared.square, 7, result_timeout=10) == 49
    assert [x.result(10) for x in c.map(shared.embed, ["ab", "abc"])] == [[2.0], [3.0]]
    assert c.run("square", 5, result_timeout=10) == 25  # names still work
    with pytest.raises(TypeError, match=r"a name .* or a handler decorated"):
        c.submit(42, 1)  # type: ignore[call-overload]
    # Bad arguments are said plainly, as BadInput (a ValueError), before anything is sent.
    from meshant.errors import BadInput

    for call, says in [
            (lambda: c.run("echo", 1, priority="high"), "priority is an int"),  # type: ignore[arg-type]
            (lambda: c.submit("echo", 1, retry_on=5), "retry_on is exception classes"),  # type: ignore[arg-type]
            (lambda: c.cancel(123), "a task's id"),  # type: ignore[arg-type]
            (lambda: c.submit_graph({"nodes": [1]}), "node 0 must be a map")]:
        with pytest.raises(BadInput, match=says):
            call()


# -- 5: the forager as a context manager, and on the caller's loop ------------------------------

def test_a_forager_is_a_context_manager(colony: Colony) -> None:
    colony.start_queen()
    w = Forager(colony.endpoint, context=colony.ctx, name="ctx-managed")
    w.add_handler("echo", lambda x: x)
    with w as running:
        assert running is w and w.connected
        assert colony.client().run("echo", "hi", result_timeout=10) == "hi"
    assert w._stopped.is_set()
    wait_for(lambda: "ctx-managed" not in {x["name"] for x in colony.client().status()[
        "foragers"] if x["state"] == "active"}, 10, "the queen to see it leave")


def test_run_async_serves_on_the_callers_loop_and_ends_with_the_forager(
        colony: Colony) -> None:
    colony.start_queen()
    w = Forager(colony.endpoint, context=colony.ctx, name="on-loop")
    seen: list[bool] = []

    @w.task("where")
    async def where(x: int) -> int:
        seen.append(asyncio.get_running_loop() is caller)
        await asyncio.sleep(0)
        return x + 1

    caller: asyncio.AbstractEventLoop | None = None
    results: list[Any] = []

    async def main() -> None:
        nonlocal caller
        caller = asyncio.get_running_loop()
        serving = asyncio.create_task(w.run_async())
        c = colony.client()
        results.append(await asyncio.wrap_future(c.submit("where", 1)))
        # Stopped from another thread: run_async returns at once, without polling.
        threading.Thread(target=w.stop).start()
        await asyncio.wait_for(serving, 10)
        # And cancelling the awaiting task stops a forager too.
        w2 = Forager(colony.endpoint, context=colony.ctx, name="on-loop-2")
        w2.add_handler("x", lambda v: v)
        t2 = asyncio.create_task(w2.run_async())
        await asyncio.to_thread(wait_for, lambda: w2.connected, 10, "w2 welcomed")
        t2.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(t2, 10)
        assert w2._stopped.is_set()

    asyncio.run(main())
    assert results == [2] and seen == [True]


def test_an_unanswered_question_is_withdrawn_sync_and_async() -> None:
    # (ask_async's wait_for once cancelled the question's own future: a bare TimeoutError
    # and no withdraw, the task left input-required.)
    from meshant import protocol as p

    sent: list[p.Message] = []

    class Sink:
        features = frozenset({"progress"})

        def send_message(self, msg: p.Message) -> None:
            sent.append(msg)

    ctx = TaskContext(Sink(), "r.1", "r", 1, "c", None)

    async def ask() -> None:
        await ctx.ask_async("ok?", timeout=0.05)
    with pytest.raises(AskTimeout, match=r"within 0\.05 s"):
        asyncio.run(ask())
    with pytest.raises(AskTimeout):
        ctx.ask("sync?", timeout=0.05)
    assert [(m.kind, m.b.get("withdraw")) for m in sent] == [
        ("task.ask", None), ("task.ask", True)] * 2
    assert ctx.pending_asks() == []
