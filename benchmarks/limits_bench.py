#!/usr/bin/env python3
"""The scheduler's cost with concurrency limits (#32.2): tasks through the sans-IO
scheduler alone (submit, dispatch, result), pipelined with a window in flight, without
limits and with 10 limits over 1,000 keys, in interleaved rounds.

    python -m benchmarks.limits_bench [--tasks 20000] [--rounds 5] [--window 64]

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
    a = ap.parse_args()
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
