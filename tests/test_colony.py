"""A colony in one process over real loopback sockets, through the public API."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from meshant import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    NoForager,
    QueenUnreachable,
    QueueFull,
    Refused,
    TaskCancelled,
    TaskContext,
    TaskFailed,
)
from meshant.apps.builtin import BUILTINS
from meshant.errors import BadInput

from .conftest import Colony, wait_for


def echo(x: Any) -> Any:
    return x


def test_task_roundtrip_and_blobs(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": echo})
    c = colony.client()
    assert c.run("echo", {"a": [1, 2]}, result_timeout=10) == {"a": [1, 2]}
    big = bytes(range(256)) * 4096  # 1 MiB travels as a raw frame
    assert c.run("echo", big, result_timeout=10) == big
    assert c.run("echo", None, result_timeout=10) is None


def test_priority_order(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client()
    order: list[int] = []
    futs = [c.submit("record", p, priority=p) for p in (70, 5, 50, 5, 99, 0)]
    c.status()  # a round trip: the queen has queued all six before the only forager joins
    colony.forager({"record": lambda p: order.append(p) or p}, slots=1)
    for f in futs:
        f.result(10)
    assert order == [0, 5, 5, 50, 70, 99]


def test_slots_are_never_exceeded(colony: Colony) -> None:
    colony.start_queen()
    lock = threading.Lock()
    running = {"now": 0, "max": 0}

    def work(x: Any) -> Any:
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(0.02)
        with lock:
            running["now"] -= 1
        return x

    colony.forager({"work": work}, slots=3)
    c = colony.client()
    assert [f.result(20) for f in c.map("work", range(30))] == list(range(30))
    assert running["max"] == 3


def test_routing_by_labels_and_name(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"who": lambda _p: "cpu"}, name="cpu-1", labels={"gpu": False})
    colony.forager({"who": lambda _p: "gpu"}, name="gpu-1", labels={"gpu": True})
    c = colony.client()
    assert {c.run("who", labels={"gpu": True}, result_timeout=10) for _ in range(5)} == {"gpu"}
    assert {c.run("who", to="cpu-1", result_timeout=10) for _ in range(5)} == {"cpu"}
    tools = c.tool_query("who")
    assert sorted(t["name"] for t in tools) == ["cpu-1", "gpu-1"]


def test_reject_goes_to_another_forager(colony: Colony) -> None:
    colony.start_queen()
    release = threading.Event()

    def other(payload: Any) -> str:
        if payload == "block":
            release.wait(10)
        return "other"

    colony.forager({"echo": other}, name="other", slots=1)
    c = colony.client()
    blocker = c.submit("echo", "block", to="other")
    wait_for(lambda: c.task_status(blocker.task_id)["state"] == "accepted", 10, "busy other")
    picky = colony.forager({"echo": echo}, name="picky")
    picky.handlers.pop("echo")  # announced echo, but rejects it ("no handler")
    fut = c.submit("echo", 1)  # only picky is free: it rejects, and the task waits
    wait_for(lambda: c.status()["counters"]["rejected"] == 1, 10, "the rejection")
    release.set()
    assert fut.result(10) == "other" and blocker.result(10) == "other"


def test_unknown_capability_is_rejected_then_fails(colony: Colony) -> None:
    colony.start_queen()
    f = colony.forager({"echo": echo}, name="f")
    # The queen routes only to foragers that announced the tool; a forager asked for a
    # capability it does not serve (here: by its own mistake) answers task.reject.
    f.handlers.pop("echo")
    c = colony.client()
    with pytest.raises(TaskFailed) as info:
        c.run("echo", 1, result_timeout=10)
    assert info.value.code == "rejected" and "no handler" in info.value.message


def test_no_forager_for_capability(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client(wait=0.3)
    with pytest.raises(NoForager) as info:
        c.run("nobody-serves-this", 1, result_timeout=10)
    assert "nobody-serves-this" in str(info.value)


def test_handler_exception_becomes_failed_result(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"fail": BUILTINS["fail"], "echo": echo})
    c = colony.client()
    with pytest.raises(TaskFailed) as info:
        c.run("fail", {"message": "kaboom"}, result_timeout=10)
    assert info.value.remote_type == "DemoError" and info.value.message == "kaboom"
    assert c.run("echo", 3, result_timeout=10) == 3  # the forager keeps serving


def test_unencodable_result_fails_clearly(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"bad": lambda _p: {1, 2, 3}})
    c = colony.client()
    with pytest.raises(TaskFailed) as info:
        c.run("bad", result_timeout=10)
    assert info.value.remote_type == "EncodeError"


def test_progress_and_partials_arrive_in_order_exactly_once(colony: Colony) -> None:
    colony.start_queen()

    def tokens(n: int, ctx: TaskContext) -> str:
        for i in range(n):
            ctx.partial(f"t{i}")
            ctx.progress((i + 1) / n, note=f"token {i}")
        return "done"

    colony.forager({"tokens": tokens})
    seen: list[Any] = []
    c = colony.client(on_progress=lambda tid, u: seen.append(u.seq))
    fut = c.submit("tokens", 50)
    ups = list(fut.updates(10))
    assert fut.result(10) == "done"
    assert [u.value for u in ups if u.kind == "partial"] == [f"t{i}" for i in range(50)]
    assert [u.seq for u in ups] == list(range(1, 101))
    assert seen == list(range(1, 101))
    assert ups[-1].fraction == 1.0 and ups[-1].note == "token 49"
    # Read again once the task ended: its end is still there (no wait for its timeout).
    assert list(fut.updates(0.2)) == []
    assert list(c.submit("tokens", 0).updates(10)) == [] and list(fut.updates(0.2)) == []


def test_async_and_batch_handlers(colony: Colony) -> None:
    colony.start_queen()
    f = colony.forager(start=False, slots=8)

    @f.task("aecho")
    async def aecho(p: Any, ctx: TaskContext) -> Any:
        await asyncio.sleep(0.001)
        return {"p": p, "attempt": ctx.attempt}

    sizes: list[int] = []

    @f.task("embed", batch=4)
    def embed(payloads: list[Any]) -> list[Any]:
        sizes.append(len(payloads))
        return [ValueError("odd") if p % 2 else p * 10 for p in payloads]

    f.start()
    c = colony.client()
    assert c.run("aecho", 1, result_timeout=10) == {"p": 1, "attempt": 1}
    futs = c.map("embed", range(16), max_attempts=1)  # each task once: no retries
    for i, fut in enumerate(futs):
        if i % 2:
            with pytest.raises(TaskFailed, match="odd"):
                fut.result(10)
        else:
            assert fut.result(10) == i * 10
    assert max(sizes) <= 4 and sum(sizes) == 16


def test_cancel_queued_and_running(colony: Colony) -> None:
    colony.start_queen()
    f = colony.forager({"sleep": BUILTINS["sleep"]}, slots=1)
    c = colony.client()
    running = c.submit("sleep", {"seconds": 30})
    queued = c.submit("sleep", {"seconds": 30})
    deadline = time.monotonic() + 10
    while not f.running and time.monotonic() < deadline:
        time.sleep(0.01)
    c.cancel(queued.task_id)
    with pytest.raises(TaskCancelled):
        queued.result(5)
    c.cancel(running.task_id)
    with pytest.raises(TaskCancelled):
        running.result(5)
    # The forager stopped sleeping (cancel reached the handler) and serves again.
    deadline = time.monotonic() + 5
    while f.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not f.running
    assert c.run("sleep", {"seconds": 0}, result_timeout=10) == {"seconds": 0}


def test_task_timeout_ends_a_task_on_a_live_forager(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"sleep": BUILTINS["sleep"]})
    c = colony.client()
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        c.run("sleep", {"seconds": 30}, timeout=0.5, result_timeout=10)
    assert time.monotonic() - t0 < 10


def test_hung_handler_lease_is_renewed_by_heartbeats(colony: Colony) -> None:
    # A task longer than assign_timeout on a live forager is not run twice.
    q = colony.start_queen(assign_timeout=0.5)
    runs: list[int] = []
    colony.forager({"long": lambda p: runs.append(1) or time.sleep(1.5) or "ok"}, name="a")
    # b would take the task if a's lease ran out (the reissue would avoid a).
    colony.forager({"long": lambda p: runs.append(2) or "other"}, name="b")
    # Spy on the heartbeats' lease renewals: (when, the lease it replaced) per attempt.
    renewals: list[tuple[float, float]] = []
    renew = q.scheduler.renew

    def spy(node: Any, refs: list[Any], now: float) -> None:
        runs = q.scheduler.running_on(node)
        renewals.extend((now, runs[r].lease) for r in refs if isinstance(r, str) and r in runs)
        renew(node, refs, now)

    q.scheduler.renew = spy  # type: ignore[method-assign]
    c = colony.client()
    # Sent to a by name, so the long task is the one that runs.
    assert c.run("long", to="a", result_timeout=10) == "ok"
    assert q.scheduler.counters["reissued"] == 0
    assert len(runs) == 1
    # The path under test ran: heartbeats renewed the lease, and the task outlived the
    # lease it was first given (assign_timeout 0.5 s, the handler takes 1.5 s).
    assert renewals, "no heartbeat renewed the running task's lease"
    first_lease = min(lease for _, lease in renewals)
    assert max(when for when, _ in renewals) > first_lease


def test_duplicate_name_refused(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": echo}, name="same")
    with pytest.raises(Refused) as info:
        colony.forager({"echo": echo}, name="same")
    assert info.value.code == "name-taken"


def test_queue_full_is_immediate(colony: Colony) -> None:
    colony.start_queen(max_queue=3)
    c = colony.client()
    futs = [c.submit("nobody", i, wait=60, ack=True) for i in range(5)]
    with pytest.raises(QueueFull):
        futs[3].result(5)
    with pytest.raises(QueueFull):
        futs[4].result(5)
    deadline = time.monotonic() + 5
    while not all(f.acknowledged for f in futs[:3]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(f.acknowledged and not f.done() for f in futs[:3])
    assert not futs[3].acknowledged


def test_queen_unreachable_is_a_clear_error(ctx: Any) -> None:
    t0 = time.monotonic()
    with pytest.raises(QueenUnreachable, match="no answer from the queen"):
        Client("tcp://127.0.0.1:1", timeout=0.5, context=ctx)
    assert time.monotonic() - t0 < 5


def test_status_and_task_status(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": echo}, name="f1", slots=2)
    c = colony.client()
    fut = c.submit("echo", 1)
    fut.result(10)
    st = c.status()
    assert [f["name"] for f in st["foragers"]] == ["f1"]
    rec = st["foragers"][0]
    assert rec["slots"] == 2 and rec["in_flight"] == 0 and rec["tools"] == ["echo"]
    assert rec["state"] == "active"
    assert st["counters"]["completed"] == 1
    ts = c.task_status(fut.task_id)
    assert ts["state"] == "completed"
    assert [h[1] for h in ts["history"]] == ["queued", "assigned", "accepted", "completed"]


def test_directed_messages_and_notes(colony: Colony) -> None:
    colony.start_queen()
    got: list[Any] = []
    f = colony.forager({"echo": echo}, name="listener", start=False)
    f.on_message(lambda m: got.append((m.kind, m.frm, m.body)))
    f.start()
    c = colony.client(name="boss")
    c.send("listener", {"hello": 1})
    c.note("listener", "short note")
    with pytest.raises(ValueError):
        c.note("listener", "x" * 81)
    c.send("nobody-here", {"x": 1})
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [("msg", "boss", {"hello": 1}), ("note", "boss", {"text": "short note"})]


def test_async_client(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": echo}, slots=4)

    async def main() -> list[Any]:
        async with AsyncClient(colony.endpoint, context=colony.ctx) as ac:
            return list(await asyncio.gather(*(ac.submit("echo", i) for i in range(20))))

    assert asyncio.run(asyncio.wait_for(main(), 20)) == list(range(20))


def test_forager_run_async(colony: Colony) -> None:
    colony.start_queen()
    f = colony.forager({"echo": echo}, start=False)
    c = colony.client()

    async def main() -> Any:
        runner = asyncio.create_task(f.run_async())
        try:
            return await asyncio.wrap_future(c.submit("echo", "async"))
        finally:
            runner.cancel()
            try:
                await runner
            except asyncio.CancelledError:
                pass

    assert asyncio.run(asyncio.wait_for(main(), 20)) == "async"


def test_forager_stop_hands_its_tasks_back(colony: Colony) -> None:
    colony.start_queen()
    a = colony.forager({"sleep": BUILTINS["sleep"]}, name="a")
    c = colony.client()
    fut = c.submit("sleep", {"seconds": 0.3})
    deadline = time.monotonic() + 5
    while not a.running and time.monotonic() < deadline:
        time.sleep(0.01)
    a.stop()  # leaves cleanly: the queen reissues at once
    colony.forager({"sleep": BUILTINS["sleep"]}, name="b")
    assert fut.result(10) == {"seconds": 0.3}


def test_client_closed_fails_pending(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client()
    fut = c.submit("nobody", wait=60)
    c.close()
    with pytest.raises(Exception, match="closed"):
        fut.result(5)


def test_many_clients_and_foragers(colony: Colony) -> None:
    colony.start_queen()
    for i in range(3):
        colony.forager({"echo": echo}, name=f"f{i}", slots=4)
    clients = [colony.client() for _ in range(3)]
    futs = [(i, c.submit("echo", i)) for c in clients for i in range(200)]
    assert all(f.result(20) == i for i, f in futs)
    assert isinstance(clients[0], Client)


def test_direct_client_mode(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"echo": echo, "tokens": lambda n, ctx: [ctx.partial(i) for i in range(n)]},
                   slots=2)
    c = colony.client(threaded=False)
    assert c.run("echo", {"x": 1}, result_timeout=10) == {"x": 1}
    futs = c.map("echo", range(50))
    assert [f.result(10) for f in futs] == list(range(50))
    fut = c.submit("tokens", 3)
    assert [u.value for u in fut.updates(10)] == [0, 1, 2]
    assert fut.result(10) == [None, None, None]
    assert c.status()["foragers"][0]["slots"] == 2
    with pytest.raises(NoForager):
        c.run("nobody", wait=0.2, result_timeout=10)
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            c.submit("echo", 1)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(5)
    assert errors and "belongs to the thread" in str(errors[0])


def test_direct_client_resends_after_the_queen_forgot_it(colony: Colony) -> None:
    # An idle direct client sends no heartbeats; the queen forgets it after
    # hb_interval * hb_misses * CLIENT_IDLE_FACTOR (here 0.02 * 1 * 60 = 1.2 s).
    q = colony.start_queen(hb_interval=0.02, hb_misses=1)
    colony.forager({"echo": echo})
    c = colony.client(threaded=False)
    assert c.run("echo", 1, result_timeout=10) == 1
    deadline = time.monotonic() + 10
    while q.status()["clients"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert q.status()["clients"] == 0
    assert c.run("echo", 2, result_timeout=10) == 2  # refused, said hello again, resent
    assert c.status()["clients"] == 1


def test_cancel_answers_with_what_the_task_became(colony: Colony) -> None:
    colony.start_queen()
    colony.forager({"sleep": BUILTINS["sleep"], "echo": BUILTINS["echo"]}, slots=1)
    c = colony.client()
    running = c.submit("sleep", {"seconds": 30})
    wait_for(lambda: c.task_status(running.task_id)["state"] == "accepted", 10, "running")
    assert c.cancel(running.task_id) == "cancelled"
    with pytest.raises(TaskCancelled):
        running.result(5)
    done = c.submit("echo", 1)
    assert done.result(10) == 1
    assert c.cancel(done.task_id) == "completed"  # ended already: said, not an error
    assert c.cancel(running.task_id) == "cancelled"
    with pytest.raises(BadInput) as e:
        c.cancel("no-such-task")
    assert e.value.code == "unknown-task" and "no-such-task" in e.value.message


def test_a_handler_streaming_faster_than_the_connection_waits_for_room(
        colony: Colony, monkeypatch: pytest.MonkeyPatch) -> None:
    # #26: a handler's partials queue ahead of the connection at most STREAM_BACKLOG
    # messages (the forager's memory stays bounded); every one still arrives, in order.
    from meshant.actors import forager as forager_mod

    monkeypatch.setattr(forager_mod, "STREAM_BACKLOG", 64)
    colony.start_queen()
    backlog: list[int] = []

    def tokens(n: int, ctx: TaskContext) -> int:
        for i in range(n):
            ctx.partial(i)
            backlog.append(f._backlog())
        return n

    f = colony.forager({"tokens": tokens})
    c = colony.client()
    fut = c.submit("tokens", 20_000)
    assert [u.value for u in fut.updates(30)] == list(range(20_000))
    assert fut.result(10) == 20_000
    assert max(backlog) <= 64 + 1, max(backlog)


def test_a_batch_that_cannot_go_goes_again_one_by_one(colony: Colony) -> None:
    # Found by a review of #26: a task.batch that could not be encoded (a partial msgpack
    # cannot carry) or was over a small --max-message was split back and batched again,
    # identically, every turn: the forager spun and the task never ended. Now its items
    # go one by one: the bad partial is dropped (logged), the rest arrive, in order.
    import datetime

    colony.start_queen(max_message=100_000)

    def odd(_p: Any, ctx: TaskContext) -> str:
        ctx.partial("a")
        ctx.partial(datetime.datetime.now())  # msgpack cannot carry it
        ctx.partial("b")
        return "done"

    def burst(_p: Any, ctx: TaskContext) -> str:
        for i in range(100):
            ctx.partial(f"{i:04d}" + "t" * 2000)  # 2 KB tokens: 200 KB, over the limit
        return "done"

    colony.forager({"odd": odd, "burst": burst})
    c = colony.client()
    fut = c.submit("odd")
    assert [u.value for u in fut.updates(10) if u.kind == "partial"] == ["a", "b"]
    assert fut.result(10) == "done"
    fut = c.submit("burst")
    got = [u.value[:4] for u in fut.updates(10) if u.kind == "partial"]
    assert got == [f"{i:04d}" for i in range(100)] and fut.result(10) == "done"
