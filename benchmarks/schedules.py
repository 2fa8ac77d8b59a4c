#!/usr/bin/env python3
"""10,000 schedules firing each minute: the queen's CPU between ticks and at a tick (#32).

    python -m benchmarks.schedules [--schedules 10000] [--minutes 2] [--journal file]

A CLI queen (journal in a temp dir) and one CLI forager (the builtin ``echo``, 64 slots)
on loopback; this process adds the schedules (``* * * * *``: every minute), then watches
``--minutes`` ticks. At each tick it waits until the tick's tasks have all completed
(the burst), then reads the queen's CPU time (``/proc``: user + system, every thread)
from one second after the burst to one second before the next tick: the cost of holding
the schedules. At the end it checks the journal: one task per schedule per tick.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshant import Client
from meshant.apps._procs import stop

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen[str], dict[str, object]]:
    p = subprocess.Popen([sys.executable, "-m", "meshant", *args, "--json"],
                         stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"{args[0]} did not start: see {log}")
    return p, json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--minutes", type=int, default=2, help="ticks to watch")
    ap.add_argument("--journal", default="file", help="'file' or ':memory:'")
    ap.add_argument("--json", action="store_true", help="one JSON line of results")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="meshant-sched-"))
    journal = str(tmp / "q.db") if a.journal == "file" else ":memory:"
    procs: list[subprocess.Popen[str]] = []
    try:
        q, info = _start(["queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                          "--journal", journal, "--max-queued", str(max(100_000,
                                                                       2 * a.schedules))],
                         tmp / "queen.log")
        procs.append(q)
        ep = str(info["router"])
        f, _ = _start(["forager", "--queen", ep, "--slots", "64"], tmp / "forager.log")
        procs.append(f)
        with Client(ep) as c:
            t0 = time.perf_counter()
            for i in range(a.schedules):
                c.add_schedule(f"s{i:05d}", "* * * * *", "echo", {"i": i})
            added = time.perf_counter() - t0
            print(f"added {a.schedules:,} schedules in {added:.1f} s "
                  f"({added / a.schedules * 1e3:.2f} ms each)", file=sys.stderr)
            rows = []
            for _ in range(a.minutes):
                tick = math.floor(time.time() / 60) * 60 + 60
                done0 = c.status()["counters"]["completed"]
                time.sleep(max(0.0, tick - time.time()))
                cpu0, w0 = cpu_of(q.pid), time.time()
                while c.status(timeout=30)["counters"]["completed"] < done0 + a.schedules:
                    time.sleep(0.05)
                burst = time.time() - w0
                burst_cpu = cpu_of(q.pid) - cpu0
                time.sleep(1.0)
                q0, s0 = cpu_of(q.pid), time.time()
                time.sleep(max(0.0, tick + 59.0 - time.time()))
                idle = (cpu_of(q.pid) - q0) / (time.time() - s0)
                rows.append({"tick": tick, "burst_s": round(burst, 2),
                             "burst_cpu_s": round(burst_cpu, 2),
                             "cpu_us_per_task": round(burst_cpu / a.schedules * 1e6, 1),
                             "between_ticks_cpu_pct": round(idle * 100, 2),
                             "between_s": round(time.time() - s0, 1)})
                print(json.dumps(rows[-1]), file=sys.stderr)
        once = None
        if a.journal == "file":
            db = sqlite3.connect(journal)
            n, keys = db.execute("SELECT count(*), count(DISTINCT idem_key) FROM tasks WHERE "
                                 "idem_key LIKE 'schedule:%'").fetchone()
            db.close()
            once = n == keys
            print(f"journal: {n:,} scheduled tasks, {keys:,} distinct ticks "
                  f"({'one task per tick' if once else 'DUPLICATES'})", file=sys.stderr)
        out = {"schedules": a.schedules, "ticks": rows, "one_per_tick": once,
               "add_ms": round(added / a.schedules * 1e3, 3)}
        if a.json:
            print(json.dumps(out))
        else:
            worst = max(r["between_ticks_cpu_pct"] for r in rows)
            print(f"{a.schedules:,} schedules: queen CPU between ticks ≤ {worst:.2f} % of a "
                  f"core; each tick's burst {max(r['burst_s'] for r in rows):.1f} s, "
                  f"{max(r['cpu_us_per_task'] for r in rows):.0f} µs of queen CPU a task")
    finally:
        stop(procs, timeout=10)


if __name__ == "__main__":
    main()
