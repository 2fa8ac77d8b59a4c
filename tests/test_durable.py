"""Durable agents (docs/durable.md): a handler's steps, sub-tasks and waits survive its
forager, its queen and its retries — each step runs once for its task."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from meshant import Client, TaskContext
from meshant.errors import NonDeterministic, StepFailed, TaskFailed
from meshant.testing import run_handler
from tests.conftest import Colony, Procs, wait_for


def _ran() -> tuple[list[Any], Any]:
    calls: list[Any] = []

    def model(x: Any) -> Any:
        calls.append(x)
        return x + 1
    return calls, model


def test_steps_replay_after_the_handler_fails_and_is_retried(colony: Colony) -> None:
    colony.start_queen()
    calls, model = _ran()
    runs = []

    def agent(n: int, ctx: TaskContext) -> Any:
        runs.append(ctx.attempt)
        a = ctx.step("model", model, n)
        b = ctx.step("model", model, a)
        if ctx.attempt == 1:
            raise ConnectionError("the tool is down")  # retried (retry_on)
        return [a, b, ctx.step("model", model, b)]
    f = colony.forager(start=False)
    f.add_handler("agent", agent, retry_on=ConnectionError)
    f.start(timeout=10)
    c = colony.client()
    assert c.run("agent", 1, timeout=20) == [2, 3, 4]
    assert runs == [1, 2]
    assert calls == [1, 2, 3]  # the first run's two steps were not run again
    st = c.task_status(c.submit("agent", 10).task_id)
    assert st["task"]


def test_a_sleep_frees_the_slot_and_the_task_wakes_not_before_its_time(colony: Colony) -> None:
    colony.start_queen()
    woke: list[float] = []

    def sleeper(s: float, ctx: TaskContext) -> float:
        t0 = ctx.step("start", time.time)
        ctx.sleep(s)
        woke.append(time.time())
        return t0

    f = colony.forager(slots=1, start=False)
    f.add_handler("sleeper", sleeper)
    f.add_handler("echo", lambda x: x)
    f.start(timeout=10)
    c = colony.client()
    fut = c.submit("sleeper", 0.8)
    wait_for(lambda: c.task_status(fut.task_id)["state"] == "suspended", what="suspended")
    st = c.task_status(fut.task_id)
    assert "until" in st["waiting"]
    assert c.status()["suspended"] == 1  # (meshant status, the dashboard)
    # The one slot is free while it sleeps: other work runs.
    assert c.run("echo", "meanwhile", timeout=5) == "meanwhile"
    t0 = fut.result(10)
    assert woke and woke[0] >= t0 + 0.8
    assert len(woke) == 1


def test_a_durable_ask_suspends_and_the_answer_wakes_it(colony: Colony) -> None:
    colony.start_queen()
    calls, model = _ran()

    def approve(n: int, ctx: TaskContext) -> Any:
        a = ctx.step("draft", model, n)
        ok = ctx.ask(f"publish {a}?", data={"draft": a})
        return [a, ok]
    f = colony.forager(slots=1, start=False)
    f.add_handler("approve", approve, durable=True)
    f.start(timeout=10)
    c = colony.client()
    fut = c.submit("approve", 1)
    wait_for(lambda: c.task_status(fut.task_id)["state"] == "suspended", what="suspended")
    assert c.task_status(fut.task_id)["waiting"]["request"].startswith(fut.task_id)
    c.answer(fut.task_id, "yes")
    assert fut.result(10) == [2, "yes"]
    assert calls == [1]


def test_a_sub_task_runs_once_and_cancelling_the_parent_cancels_it(colony: Colony) -> None:
    colony.start_queen()
    started = threading.Event()
    shouted: list[str] = []

    def parent(text: str, ctx: TaskContext) -> Any:
        return ctx.call("shout", text)

    def shout(text: str, ctx: TaskContext) -> str:
        shouted.append(text)
        if text == "forever":
            started.set()
            while not ctx.is_cancelled:
                time.sleep(0.01)
        return text.upper()
    f = colony.forager(slots=4, start=False)
    f.add_handler("parent", parent)
    f.add_handler("shout", shout)
    f.start(timeout=10)
    c = colony.client()
    assert c.run("parent", "hi", timeout=10) == "HI"
    fut = c.submit("parent", "forever")
    assert started.wait(10)
    st = c.task_status(fut.task_id)
    child = st["children"][0]
    assert child == f"{fut.task_id}/c0"
    assert c.task_status(child)["parent"] == fut.task_id
    c.cancel(fut.task_id)
    wait_for(lambda: c.task_status(child)["state"] == "cancelled", what="the child cancelled")
    assert shouted == ["hi", "forever"]


def test_a_sub_task_of_a_capability_nobody_serves_is_refused(colony: Colony) -> None:
    colony.start_queen()

    def parent(_: Any, ctx: TaskContext) -> Any:
        return ctx.call("nobody", 1)
    colony.forager({"parent": parent})
    c = colony.client()
    with pytest.raises(TaskFailed, match="no forager offers capability 'nobody'"):
        c.run("parent", None, timeout=10)


def test_a_divergent_rerun_fails_with_the_non_determinism_error() -> None:
    calls, model = _ran()

    def first(n: int, ctx: TaskContext) -> Any:
        return ctx.step("search", model, n)

    def changed(n: int, ctx: TaskContext) -> Any:
        return ctx.step("browse", model, n)
    run = run_handler(first, 1)
    assert run.result == 2 and [s["name"] for s in run.steps] == ["search"]
    again = run_handler(changed, 1, steps=run.steps)
    assert isinstance(again.error, NonDeterministic)
    assert "step 0 was recorded as step 'search' #1" in str(again.error)
    assert "asks for step 'browse' #1" in str(again.error)
    assert calls == [1]


def test_a_recorded_exception_is_raised_again_without_running_the_step() -> None:
    n = [0]

    def flaky() -> None:
        n[0] += 1
        raise KeyError("gone")

    class Weird(Exception):
        pass

    def weird() -> None:
        raise Weird("odd")

    def agent(_: Any, ctx: TaskContext) -> Any:
        out = []
        try:
            ctx.step("lookup", flaky)
        except KeyError as e:
            out.append(f"key {e}")
        try:
            ctx.step("weird", weird)
        except Exception as e:
            out.append(type(e).__name__)
        return out
    first = run_handler(agent, None)
    assert first.result == ["key 'gone'", "Weird"]
    again = run_handler(agent, None, steps=first.steps)
    assert again.result == ["key 'gone'", "StepFailed"]
    assert n == [1]
    assert first.steps[1]["error"]["type"] == "Weird"
    assert issubclass(StepFailed, TaskFailed)


def test_a_step_value_the_journal_cannot_carry_fails_clearly() -> None:
    def agent(_: Any, ctx: TaskContext) -> Any:
        return ctx.step("big", lambda: b"x" * (2 << 20))

    def odd(_: Any, ctx: TaskContext) -> Any:
        return ctx.step("odd", lambda: object())
    assert "over 1,048,576" in str(run_handler(agent).error)
    err = run_handler(odd).error
    assert err is not None and "cannot record" in str(err) and "odd" in str(err)


def test_a_suspended_task_survives_a_queen_restart(colony: Colony, tmp_path: Path) -> None:
    journal = str(tmp_path / "q.db")
    q = colony.start_queen(journal=journal)
    endpoint = q.endpoint
    calls, model = _ran()

    def sleeper(n: int, ctx: TaskContext) -> Any:
        a = ctx.step("model", model, n)
        ctx.sleep(1.0)
        return ctx.step("model", model, a)
    f = colony.forager(start=False)
    f.add_handler("sleeper", sleeper)
    f.start(timeout=10)
    c = colony.client()
    fut = c.submit("sleeper", 1)
    wait_for(lambda: c.task_status(fut.task_id)["state"] == "suspended", what="suspended")
    q.stop()
    from meshant import Queen
    colony.queen = Queen(endpoint, "tcp://127.0.0.1:0", context=colony.ctx, journal=journal,
                         hb_interval=0.2, hb_misses=5).start()
    assert fut.result(20) == 3
    assert calls == [1, 2]


@pytest.mark.slow
def test_a_killed_foragers_steps_are_not_run_again(procs: Procs, tmp_path: Path) -> None:
    log, go = tmp_path / "ran.log", tmp_path / "go"
    env = {"MESHANT_TEST_LOG": str(log), "MESHANT_TEST_GO": str(go)}
    _, ep = procs.queen("--journal", str(tmp_path / "q.db"))
    first, _ = procs.start("forager", "--queen", ep, "--json", "--app",
                           "tests.durable_app:forager", env=env)
    with Client(ep) as c:
        fut = c.submit("agent", 5)
        # Killed once its held step runs, the three before it journaled.
        wait_for(lambda: len(c.task_status(fut.task_id).get("steps", [])) == 3
                 and log.exists() and "hold" in log.read_text(), 20, "three steps journaled")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        go.touch()
        procs.start("forager", "--queen", ep, "--json", "--app",
                    "tests.durable_app:forager", env=env)
        result = fut.result(60)
    assert result == ["answer 0", "answer 1", "answer 2", "held", "answer 3", "answer 4",
                      "ANSWER 0"]
    ran = log.read_text().splitlines()
    # Each journaled step ran once; the one in flight at the kill ran again.
    assert ran == ["model 0", "model 1", "model 2", "hold", "hold", "model 3", "model 4",
                   "shout answer 0"]


def test_meshant_replay_shows_each_step_and_stops_at_a_divergence(
        colony: Colony, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from tests import durable_app
    log, go = tmp_path / "ran.log", tmp_path / "go"
    go.touch()
    monkeypatch.setenv("MESHANT_TEST_LOG", str(log))
    monkeypatch.setenv("MESHANT_TEST_GO", str(go))
    journal = str(tmp_path / "q.db")
    colony.start_queen(journal=journal)
    f = colony.forager(start=False)
    for cap, h in durable_app.forager.handlers.items():
        f.add_handler(cap, h.fn)
    f.start(timeout=10)
    c = colony.client()
    fut = c.submit("agent", 4)
    assert fut.result(20)[-1] == "ANSWER 0"
    colony.close()
    colony.queen = None
    colony.foragers, colony.clients = [], []
    ran = log.read_text()

    def replay(*extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshant", "replay", fut.task_id,
                               "--app", "tests.durable_app:forager", "--journal", journal,
                               *extra], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
    same = replay()
    assert same.returncode == 0, same.stderr
    assert "6 steps recorded" in same.stdout
    assert "same  -> 'answer 1'" in same.stdout
    assert "the handler returned" in same.stdout
    assert log.read_text() == ran  # nothing ran again
    changed = replay("--json", MESHANT_TEST_DIVERGE="1")
    assert changed.returncode == 1
    import json
    out = json.loads(changed.stdout)
    assert out["end"] == "diverged"
    assert out["steps"][1] == {"position": 1, "recorded": "step 'model' #2",
                               "replayed": "step 'llm' #1", "same": False, "outcome": ""}
    assert log.read_text() == ran
    unknown = subprocess.run([sys.executable, "-m", "meshant", "replay", "no-such-task",
                              "--app", "tests.durable_app:forager", "--journal", journal],
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "no task 'no-such-task'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_a_divergence_fails_at_once_as_nondeterministic_whatever_retry_on(
        colony: Colony) -> None:
    from meshant.errors import NonDeterministic as ND
    colony.start_queen()
    runs: list[int] = []

    def changing(_: Any, ctx: TaskContext) -> Any:
        runs.append(ctx.attempt)
        ctx.step("first" if ctx.attempt == 1 else "renamed", lambda: 1)
        if ctx.attempt == 1:
            raise ConnectionError("retry me")
        return "done"
    f = colony.forager(start=False)
    f.add_handler("changing", changing, retry_on=ConnectionError)
    f.start(timeout=10)
    c = colony.client()
    with pytest.raises(ND, match="step 0 was recorded as step 'first'"):
        c.run("changing", None, timeout=20, retry_on=["*"])
    assert runs == [1, 2]  # the divergent run was not retried


def test_a_failed_sub_task_raises_alike_first_and_on_replay() -> None:
    def bad(x: Any) -> Any:
        raise ValueError("no")

    def parent(_: Any, ctx: TaskContext) -> Any:
        try:
            ctx.call("child", 1)
        except TaskFailed as e:
            return f"{type(e).__name__}: {e}"
        return "no error"
    first = run_handler(parent, children={"child": bad})
    again = run_handler(parent, steps=first.steps)
    assert first.result == again.result == "TaskFailed: ValueError: no"


def test_a_step_raising_what_retry_on_names_is_not_recorded_and_runs_again(
        colony: Colony) -> None:
    colony.start_queen()
    calls: list[int] = []

    def flaky_tool(attempt: int) -> str:
        calls.append(attempt)
        if attempt == 1:
            raise ConnectionError("the tool is down")
        return "up"

    def agent(_: Any, ctx: TaskContext) -> Any:
        return ctx.step("tool", flaky_tool, ctx.attempt)
    f = colony.forager(start=False)
    f.add_handler("agent", agent, retry_on=ConnectionError)
    f.start(timeout=10)
    assert colony.client().run("agent", None, timeout=20) == "up"
    assert calls == [1, 2]


def test_meshants_own_errors_replay_as_their_class() -> None:
    from meshant.errors import QueueFull

    def full() -> None:
        raise QueueFull("the queue is full")

    def agent(_: Any, ctx: TaskContext) -> Any:
        try:
            ctx.step("submit", full)
        except QueueFull as e:
            return e.code
        return "none"
    first = run_handler(agent)
    assert first.result == run_handler(agent, steps=first.steps).result == "queue-full"


def test_a_task_past_the_step_limit_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshant.actors import durable
    from meshant.errors import TooLarge
    monkeypatch.setattr(durable, "STEPS_MAX", 5)

    def looping(_: Any, ctx: TaskContext) -> Any:
        for i in range(10):
            ctx.step("s", lambda i=i: i)
    run = run_handler(looping)
    assert isinstance(run.error, TooLarge) and "at most 5 steps" in str(run.error)
    assert len(run.steps) == 5


def test_run_handler_takes_durable_from_the_registration() -> None:
    from meshant import Forager
    f = Forager("tcp://127.0.0.1:1")

    @f.task("approve", durable=True)
    def approve(x: Any, ctx: TaskContext) -> Any:
        return ctx.ask("ok?")
    run = run_handler(approve, 1, answers=["yes"])
    assert run.suspended is not None and run.suspended["request"] == "test-task.s0"
    assert run_handler(approve, 1, steps=run.steps).result == "yes"
    assert run_handler(approve, 1, answers=["yes"], durable=False).result == "yes"
    tup = run_handler(lambda _, ctx: ctx.step("t", lambda: (1, 2)))
    assert tup.result == [1, 2] and tup.steps[0]["value"] == [1, 2]


def test_a_graph_node_calls_a_typed_sub_task(colony: Colony) -> None:
    from meshant import Forager
    colony.start_queen()
    f = Forager(colony.endpoint, context=colony.ctx, slots=1)
    colony.foragers.append(f)

    @f.task("shout")
    def shout(text: str) -> str:
        return text.upper()

    @f.task("node")
    def node(text: str, ctx: TaskContext) -> str:
        return ctx.call(shout, text) + "!"
    f.start(timeout=10)
    c = colony.client()
    out = c.submit_graph({"a": {"capability": "node", "payload": "hi"}}).result(20)
    assert out["a"] == "HI!"


def test_records_too_many_for_the_assignment_are_fetched_before_a_rerun(
        colony: Colony) -> None:
    colony.start_queen(max_message=8 << 20)
    made: list[int] = []

    def big(i: int) -> str:
        made.append(i)
        return "x" * 700_000

    def agent(_: Any, ctx: TaskContext) -> Any:
        sizes = [len(ctx.step("big", big, i)) for i in range(3)]  # 2.1 MB of records
        if ctx.attempt == 1:
            raise ConnectionError("again")
        return sizes
    f = colony.forager(start=False)
    f.add_handler("agent", agent, retry_on=ConnectionError)
    f.start(timeout=10)
    assert colony.client().run("agent", None, timeout=30) == [700_000] * 3
    assert made == [0, 1, 2]


def test_async_handlers_step_sleep_and_call(colony: Colony) -> None:
    colony.start_queen()
    calls: list[int] = []

    async def model(x: int) -> int:
        calls.append(x)
        return x * 10

    async def agent(x: int, ctx: TaskContext) -> Any:
        a = await ctx.step_async("model", model, x)
        await ctx.sleep_async(0.2)
        b = await ctx.call_async("double", a)
        return [a, b]
    f = colony.forager(start=False)
    f.add_handler("agent", agent)
    f.add_handler("double", lambda v: v * 2)
    f.start(timeout=10)
    assert colony.client().run("agent", 2, timeout=20) == [20, 40]
    assert calls == [2]


def test_a_step_after_its_handler_returned_is_refused(colony: Colony) -> None:
    colony.start_queen()
    kept: list[TaskContext] = []

    def agent(_: Any, ctx: TaskContext) -> str:
        kept.append(ctx)
        return "done"
    colony.forager({"agent": agent})
    assert colony.client().run("agent", None, timeout=10) == "done"
    from meshant.errors import ConfigError
    with pytest.raises(ConfigError, match="after its handler's run ended"):
        kept[0].step("late", lambda: 1)
    with pytest.raises(ConfigError, match="seconds >= 0"):
        run_handler(lambda _, ctx: ctx.sleep(-1)).value()
    with pytest.raises(ConfigError, match="a step's name"):
        run_handler(lambda _, ctx: ctx.step("", lambda: 1)).value()
