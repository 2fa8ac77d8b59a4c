#!/usr/bin/env python3
"""The scheduler's cost with concurrency limits (#32.2): tasks through the sans-IO
scheduler alone (submit, dispatch, result), pipelined with a window in flight, without
limits and with 10 limits over 1,000 keys, in interleaved rounds; with ``--colony``,
through a whole colony (a CLI queen and one forager over tcp, a direct client), the
queen started without and with ``--limit`` the same 10 rules.

    python -m benchmarks.limits_bench [--tasks 20000] [--rounds 5] [--window 64] [--colony]

Prints the median tasks/s of each and their ratio (the target: with limits >= 0.9x).
The limits are generous (no task waits at one): this is what the bookkeeping costs a
task, not what waiting costs it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from meshant.core.nodes.registry import Node, Registry
from meshant.core.tasks.limits import parse_rules
from meshant.core.tasks.model import Task
from meshant.core.tasks.scheduler import Scheduler
from meshant.core.tasks.work import Assign

RULES = [f"llm:payload.k{j}=1000" for j in range(9)] + ["llm=100000"]


def run_colony(n: int, window: int, limited: bool) -> tuple[float, float]:
    """Tasks/s through a CLI queen and one echo forager (64 slots), pipelined, and the
    queen's CPU µs a task (steadier than throughput on a busy machine)."""
    from benchmarks.ab import pipelined_direct
    from meshant.actors.client import Client
    from meshant.apps import _procs
    from meshant.apps.bench import _cpu_seconds

    rules = [r.replace("llm", "echo") for r in RULES] if limited else []
    args = ["queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0", "--json",
            "--journal", ":memory:", *[x for r in rules for x in ("--limit", r)]]
    qp = _procs.spawn(args)
    procs = [qp]
    try:
        ep = _procs.read_json_line(qp, 20)["router"]
        fp = _procs.spawn(["forager", "--queen", ep, "--slots", str(window), "--json"])
        procs.append(fp)
        _procs.read_json_line(fp, 20)
        payloads = [{f"k{j}": str(i % 1000) for j in range(9)} for i in range(1000)]
        with Client(ep, timeout=10, threaded=False) as c:
            c.run("echo", payloads[0])
            it = iter(range(n))
            orig = c.submit

            def submit(cap: str, _payload: object) -> object:
                return orig(cap, payloads[next(it) % 1000])
            c.submit = submit  # type: ignore[method-assign,assignment]
            cpu0 = _cpu_seconds(qp.pid)
            rate = pipelined_direct(c, n - 1, window)
            return rate, (_cpu_seconds(qp.pid) - cpu0) / (n - 1) * 1e6
    finally:
        _procs.stop(procs)


def run(n: int, window: int, limited: bool) -> float:
    reg = Registry(hb_interval=1.0, hb_misses=3)
    s = Scheduler(reg, assign_timeout=60.0)
    if limited:
        s.limits.configure(parse_rules(RULES))
    node = Node(name="f", identity=b"f", role="forager", codec="iacp2", slots=window,
                tools=frozenset({"llm"}))
    reg.add(node, 0.0)
    s.forager_joined(node)
    payloads = [{f"k{j}": str(i % 1000) for j in range(9)} for i in range(1000)]
    now = 0.0
    t0 = time.perf_counter()
    sent = done = 0
    while done < n:
        while sent < n and sent - done < window:
            s.submit(Task(id=f"t{sent}", capability="llm", payload=payloads[sent % 1000],
                          client=b"c"), now)
            sent += 1
        s.dispatch(now)
        work = s.work[:]
        s.work.clear()
        for w in work:
            if isinstance(w, Assign):
                s.result(w.attempt, {"status": "ok", "result": None}, now)
                done += 1
        s.work.clear()
        now += 0.001
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--colony", action="store_true", help="a whole colony over tcp")
    a = ap.parse_args()
    if a.colony:
        pc: list[tuple[float, float]] = []
        lc: list[tuple[float, float]] = []
        for _ in range(a.rounds):
            pc.append(run_colony(a.tasks, a.window, False))
            lc.append(run_colony(a.tasks, a.window, True))
        p, q = statistics.median(x for x, _ in pc), statistics.median(x for x, _ in lc)
        pu, qu = statistics.median(u for _, u in pc), statistics.median(u for _, u in lc)
        print(f"colony over tcp, window {a.window}, {a.tasks} tasks x {a.rounds} rounds")
        print(f"  no limits            {p:10,.0f} tasks/s   queen {pu:6.1f} µs CPU a task")
        print(f"  10 limits, 1000 keys {q:10,.0f} tasks/s   queen {qu:6.1f} µs CPU a task"
              f"   {q / p:.2f}x throughput, {pu / qu:.2f}x by CPU")
        return
    plain: list[float] = []
    limited: list[float] = []
    run(2000, a.window, True)  # warm up
    for _ in range(a.rounds):
        plain.append(run(a.tasks, a.window, False))
        limited.append(run(a.tasks, a.window, True))
    p, q = statistics.median(plain), statistics.median(limited)
    print(f"scheduler alone, window {a.window}, {a.tasks} tasks x {a.rounds} rounds")
    print(f"  no limits            {p:10,.0f} tasks/s")
    print(f"  10 limits, 1000 keys {q:10,.0f} tasks/s   {q / p:.2f}x")


if __name__ == "__main__":
    main()
