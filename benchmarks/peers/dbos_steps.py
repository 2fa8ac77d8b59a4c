#!/usr/bin/env python3
"""DBOS Transact (Python, 3.x) beside meshant's durable steps: a workflow of 10 trivial
``@DBOS.step`` functions on DBOS's SQLite system database (a file in a temp dir).

    python -m venv .venv-dbos && .venv-dbos/bin/pip install dbos
    .venv-dbos/bin/python benchmarks/peers/dbos_steps.py [--runs 300] [--json]

Sequential: the workflow called ``--runs`` times in a row (p50/p99 of each call,
workflows/s). Concurrent: ``--runs`` workflows started at once with
``DBOS.start_workflow`` (DBOS's own thread pool), then every result (workflows/s): the
peer of meshant's pipelined submissions. Also a 1-step workflow, the peer of a plain task.
DBOS leaves SQLite's defaults (rollback journal, synchronous=FULL: an fsync per commit).
Run by benchmarks/peers/compare_steps.py; needs nothing of meshant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sqlite-sync", choices=["default", "normal"], default="default",
                    help="normal: every SQLite connection in WAL mode, synchronous=NORMAL "
                    "(no fsync per commit, as meshant's default 'process' durability)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    if args.sqlite_sync == "normal":
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        @event.listens_for(Engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")
    from importlib.metadata import version

    from dbos import DBOS, DBOSConfig

    d = tempfile.mkdtemp(prefix="dbos-steps-")
    db = os.path.join(d, "dbos.sqlite")
    config: DBOSConfig = {"name": "meshant-compare", "system_database_url": f"sqlite:///{db}",
                          "log_level": "WARNING"}
    DBOS(config=config)

    @DBOS.step()
    def trivial(i: int) -> int:
        return i

    @DBOS.workflow()
    def steps_n(n: int, k: int) -> int:
        total = 0
        for i in range(k):
            total += trivial(i)
        return n + total

    DBOS.launch()
    out: dict[str, Any] = {"peer": "dbos", "version": version("dbos"), "database": "sqlite",
                           "sqlite_sync": ("WAL, synchronous=NORMAL" if args.sqlite_sync ==
                                           "normal" else "rollback journal, synchronous=FULL"),
                           "runs": args.runs}
    try:
        for label, k in ((f"{args.steps}_steps", args.steps), ("1_step", 1)):
            for i in range(20):  # warm-up
                steps_n(i, k)
            lat = []
            t0 = time.perf_counter()
            for i in range(args.runs):
                t = time.perf_counter()
                r = steps_n(i, k)
                lat.append(time.perf_counter() - t)
                assert r == i + k * (k - 1) // 2, r
            seq_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            handles = [DBOS.start_workflow(steps_n, i, k) for i in range(args.runs)]
            results = [h.get_result() for h in handles]
            conc_s = time.perf_counter() - t0
            assert results == [i + k * (k - 1) // 2 for i in range(args.runs)]
            out[label] = {"p50_ms": round(statistics.median(lat) * 1000, 3),
                          "p99_ms": round(pct(lat, 0.99) * 1000, 3),
                          "sequential_per_s": round(args.runs / seq_s, 1),
                          "concurrent_per_s": round(args.runs / conc_s, 1)}
    finally:
        DBOS.destroy()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    if args.json:
        print(json.dumps(out))
    else:
        for label in (f"{args.steps}_steps", "1_step"):
            r = out[label]
            print(f"DBOS {out['version']} ({label}, SQLite {out['sqlite_sync']}): p50 "
                  f"{r['p50_ms']} ms, p99 "
                  f"{r['p99_ms']} ms, sequential {r['sequential_per_s']}/s, concurrent "
                  f"{r['concurrent_per_s']}/s over {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
