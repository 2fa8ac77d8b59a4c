#!/usr/bin/env python3
"""Durable steps' cost, in one run beside the plain path: a 10-step task (ten trivial
``ctx.step``s) against a plain task, sequential round trips and pipelined throughput,
with a file journal (the default) on one in-process queen and forager over loopback.

    python -m benchmarks.steps [--n 300] [--steps 10] [--journal file|:memory:] [--json]

The anchors (issue #31, this 2-core machine): DBOS 3.4 on SQLite, a 10-step workflow of
trivial steps, p50 39.7 ms (3.6 ms a step), 23.5 workflows/s; Temporal's dev server 47-100
ms a workflow.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from meshant import Client, Forager, Queen, TaskContext


def _one(x: int) -> int:
    return x + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--journal", default="file")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    journal = str(Path(tmp) / "q.db") if a.journal == "file" else a.journal
    ctx: zmq.Context[Any] = zmq.Context()
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", context=ctx, journal=journal).start()
    f = Forager(q.endpoint, context=ctx, slots=8)

    @f.task("plain")
    def plain(x: int) -> int:
        return x

    @f.task("stepped")
    def stepped(x: int, c: TaskContext) -> int:
        for _ in range(a.steps):
            x = c.step("s", _one, x)
        return x
    f.start()
    c = Client(q.endpoint, context=ctx)
    out: dict[str, Any] = {"steps": a.steps, "journal": a.journal}
    try:
        for cap in ("plain", "stepped", "plain", "stepped"):  # (the second pair counts)
            lat = []
            for i in range(a.n):
                t0 = time.perf_counter()
                c.run(cap, i, timeout=30)
                lat.append(time.perf_counter() - t0)
            lat.sort()
            t0 = time.perf_counter()
            window: collections.deque[Any] = collections.deque()
            for i in range(a.n * 4):
                window.append(c.submit(cap, i))
                if len(window) >= 64:
                    window.popleft().result(30)
            for fut in window:
                fut.result(30)
            out[cap] = {"p50_ms": statistics.median(lat) * 1e3,
                        "p99_ms": lat[int(0.99 * len(lat))] * 1e3,
                        "per_s": a.n * 4 / (time.perf_counter() - t0)}
    finally:
        c.close()
        f.stop()
        q.stop()
        ctx.destroy(0)
    p, s = out["plain"], out["stepped"]
    out["step_ms"] = (s["p50_ms"] - p["p50_ms"]) / a.steps
    out["p50_ratio"] = s["p50_ms"] / p["p50_ms"]
    if a.json:
        print(json.dumps(out))
        return
    for k in ("plain", "stepped"):
        v = out[k]
        print(f"{k:8} p50 {v['p50_ms']:7.3f} ms  p99 {v['p99_ms']:7.3f} ms  "
              f"{v['per_s']:8.0f} tasks/s pipelined")
    print(f"a step: {out['step_ms']:.3f} ms (p50 difference / {a.steps}); {a.steps}-step p50 "
          f"{out['p50_ratio']:.2f}x a plain task's; journal {a.journal}")


if __name__ == "__main__":
    main()
