"""Broadcast, control and colony memory over real loopback sockets (in-process agents)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from meshant import MeshantError
from meshant.apps.builtin import BUILTINS

from .conftest import Colony, wait_for


def test_broadcast_to_20_foragers_once_each_with_prefix_filtering(colony: Colony) -> None:
    colony.start_queen()
    lock = threading.Lock()
    got: dict[str, list[tuple[str, Any]]] = {}
    for i in range(20):
        f = colony.forager({"echo": lambda x: x}, name=f"f{i:02}", start=False)
        prefix = "news." if i % 2 == 0 else "weather."

        def record(topic: str, data: Any, name: str = f.name) -> None:
            with lock:
                got.setdefault(name, []).append((topic, data))

        f.on(prefix)(record)
        f.start()
    c = colony.client()
    # A subscription reaches the PUB asynchronously: wait until every forager hears one.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(got) < 20:
        c.broadcast("news.warmup", 0)
        c.broadcast("weather.warmup", 0)
        time.sleep(0.1)
    assert len(got) == 20
    with lock:
        got.clear()
    c.broadcast("news.today", {"headline": "ants"})
    c.broadcast("weather.rain", 3)
    c.broadcast("sports.score", 1)  # nobody subscribed
    # End markers, published after the broadcasts above: PUB to each subscriber is in
    # order, so a forager that has its marker already has any duplicate it was sent.
    c.broadcast("news.zz-end", None)
    c.broadcast("weather.zz-end", None)
    end = {"news.zz-end", "weather.zz-end"}

    def all_ended() -> bool:
        with lock:
            return len(got) == 20 and all(v and v[-1][0] in end for v in got.values())

    wait_for(all_ended, what="the end markers")
    with lock:
        for items in got.values():
            assert items.pop()[0] in end
    assert sorted(got) == [f"f{i:02}" for i in range(20)]
    for name, items in got.items():
        i = int(name[1:])
        expected = ("news.today", {"headline": "ants"}) if i % 2 == 0 else ("weather.rain", 3)
        assert items == [expected], name
    assert colony.queen is not None and colony.queen.counters["broadcasts"] >= 5


def test_bad_topics_are_refused(colony: Colony) -> None:
    colony.start_queen()
    c = colony.client()
    with pytest.raises(ValueError):
        c.broadcast("has space", 1)
    with pytest.raises(ValueError):
        c.broadcast("", 1)


def test_drain_finishes_running_work_and_takes_no_new_work(colony: Colony) -> None:
    colony.start_queen()
    a = colony.forager({"sleep": BUILTINS["sleep"]}, name="a", slots=2)
    c = colony.client()
    running = [c.submit("sleep", {"seconds": 0.5, "n": n}) for n in range(2)]
    wait_for(lambda: len(a.running) == 2, what="both tasks running on a")
    c.drain("a")
    wait_for(lambda: a.draining, what="drain to arrive")
    later = c.submit("sleep", {"seconds": 0, "n": 99})
    assert [f.result(10)["n"] for f in running] == [0, 1]  # a finishes its work ...
    # ... and takes nothing new: the queen freed a's slots and ran an assignment pass
    # before it sent those results (and the status round trip follows the submission).
    assert c.task_status(later.task_id)["state"] == "queued"
    wait_for(lambda: a._stopped.is_set(), what="a to leave after draining")
    colony.forager({"sleep": BUILTINS["sleep"]}, name="b")
    assert later.result(10)["n"] == 99
    st = c.status()
    assert [f["name"] for f in st["foragers"]] == ["b"]
    assert st["counters"]["reissued"] == 0


def test_halt_reissues_running_work(colony: Colony) -> None:
    colony.start_queen()
    a = colony.forager({"sleep": BUILTINS["sleep"]}, name="a")
    c = colony.client()
    fut = c.submit("sleep", {"seconds": 30})
    wait_for(lambda: len(a.running) == 1, what="task running on a")
    colony.forager({"sleep": lambda p: "done elsewhere"}, name="b")
    c.halt("a")
    assert fut.result(10) == "done elsewhere"
    wait_for(lambda: a._stopped.is_set(), what="a to stop")
    assert c.task_status(fut.task_id)["attempt"] == 2


def test_control_of_unknown_forager_is_an_error(colony: Colony,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    colony.start_queen()
    c = colony.client()
    c.drain("nobody")
    # The queen's refusal comes back to the client (which logs it): the drain was handled.
    wait_for(lambda: any("unknown-recipient" in r.getMessage() and "nobody" in r.getMessage()
                         for r in caplog.records), what="the queen's refusal")
    assert colony.queen is not None and colony.queen.counters["ctl_drain"] == 0


def test_memory_concurrent_sets_converge_everywhere(colony: Colony) -> None:
    colony.start_queen()
    foragers = [colony.forager({"echo": lambda x: x}, name=f"m{i}") for i in range(4)]
    client = colony.client()

    def writer(f: Any, n: int) -> None:
        for i in range(25):
            f.memory.set(f"k{i % 7}", {"by": n, "i": i})
            if i % 5 == 0:
                f.memory.delete(f"k{(i + 3) % 7}")

    threads = [threading.Thread(target=writer, args=(f, n)) for n, f in enumerate(foragers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    final = colony.queen.memory  # type: ignore[union-attr]
    for agent in [*foragers, client]:
        wait_for(lambda a=agent: a.memory.seq == final.seq, what=f"{agent.name} to catch up")
        assert agent.memory.items() == final.items


def test_memory_late_joiner_and_forced_gap_resync(colony: Colony) -> None:
    colony.start_queen()
    early = colony.client()
    for i in range(10):
        early.memory.set(f"k{i}", i)
    late = colony.forager({"echo": lambda x: x}, name="late")
    assert late.memory.get("k9") == 9  # the snapshot
    changes: list[tuple[str, Any, bool]] = []
    late.memory.on_change(lambda k, v, d: changes.append((k, v, d)))
    early.memory.set("k0", "new")
    wait_for(lambda: late.memory.get("k0") == "new", what="a later update")
    assert ("k0", "new", False) in changes
    # Force a gap: this replica "misses" the next update, so the one after reveals it.
    rewound = threading.Event()

    def rewind() -> None:
        late.memory._replica.seq = late.memory.seq - 1
        rewound.set()

    late.call_soon(rewind)
    assert rewound.wait(5)
    early.memory.set("k1", "gap")
    wait_for(lambda: late.memory.get("k1") == "gap", what="resync after the gap")
    assert late.memory.resyncs >= 1
    assert late.memory.items() == early.memory.items()


def test_memory_ttl_and_limits(colony: Colony) -> None:
    colony.start_queen(mem_max_value=100)
    c = colony.client()
    c.memory.set("lease", "mine", ttl=0.3)
    assert c.memory.get("lease") == "mine"
    wait_for(lambda: "lease" not in c.memory, what="the ttl to expire")
    with pytest.raises(MeshantError) as info:
        c.memory.set("big", "x" * 500)
    assert info.value.code == "too-large" and "big" not in c.memory
    with pytest.raises(ValueError):
        c.memory.set("", 1)


def test_cpu_bound_handler_is_not_declared_offline(colony: Colony) -> None:
    # hb 0.1 s x 3 misses = 0.3 s offline window; the handler computes for ~1.5 s,
    # several windows, in pure Python. The forager's I/O thread still gets the GIL
    # (Python switches threads every 5 ms), so its heartbeats keep going.
    colony.start_queen(hb_interval=0.1, hb_misses=3, assign_timeout=0.5)

    def burn(seconds: float) -> int:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += sum(i * i for i in range(200))
        return n

    colony.forager({"burn": burn}, name="cpu")
    colony.forager({"burn": lambda s: -1}, name="idle")
    c = colony.client()
    assert c.run("burn", 1.5, to="cpu", result_timeout=20) > 0
    st = c.status()
    assert st["counters"]["reissued"] == 0
    assert {f["name"] for f in st["foragers"]} == {"cpu", "idle"}
