#!/usr/bin/env python3
"""How long a queen's loop stalls on its PostgreSQL journal under load: before and after
the journal's reads became effects (issue #23).

    python -m benchmarks.loop_stall [--seconds 10] TREE [TREE ...]

For each TREE (a checkout of meshant), a CLI queen on a fresh PostgreSQL database and one
forager run from that tree. This process's client then, for ``--seconds``:

* submits tasks with idempotency keys (each a key the queen has not seen: before, every
  one cost a query of the journal inside the loop), pipelined 32 deep;
* asks, now and then, the state of a task finished before the queen restarted (in the
  journal only: a read);

while a second client measures the loop from outside: a ``tool.query`` every 2 ms, whose
round trip is the time the loop takes to get to it. Its p50, p99 and maximum are what a
message waits while the loop is busy elsewhere. PostgreSQL runs on loopback, with
``fsync=off``: a database across a network costs each read a network round trip more.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from meshant.actors.client import Client
from meshant.apps import _procs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.pg_server import PgServer


def colony(tree: str, url: str, workdir: str) -> tuple[list[Any], str]:
    env = {"PYTHONPATH": tree}
    q = _procs.spawn(["queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                      "--journal", url, "--lease", "5", "--json"], env=env)
    ready = _procs.read_json_line(q, 60)
    ep = ready["router"]
    f = _procs.spawn(["forager", "--queen", ep, "--slots", "8", "--json"], env=env)
    _procs.read_json_line(f, 30)
    return [q, f], ep


def run(tree: str, server: PgServer, seconds: float, n: int) -> dict[str, float]:
    url = server.create_db(f"stall{n}")
    here = os.getcwd()
    os.chdir(tempfile.gettempdir())
    procs, ep = colony(tree, url, tempfile.gettempdir())
    try:
        # Tasks that end up in the journal only: finished, then the queen restarted.
        with Client(ep, timeout=30) as c:
            old = [c.submit("echo", i) for i in range(300)]
            for f in old:
                f.result(30)
        _procs.stop(procs)
        procs, ep = colony(tree, url, tempfile.gettempdir())
        rtts: list[float] = []
        stop = threading.Event()

        def ping() -> None:
            with Client(ep, timeout=30, threaded=False, name="pinger") as p:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    p.tool_query("echo", timeout=30)
                    rtts.append(time.perf_counter() - t0)
                    time.sleep(0.002)
        pinger = threading.Thread(target=ping)
        pinger.start()
        done = 0
        with Client(ep, timeout=30, name="loader") as c:
            t_end = time.monotonic() + seconds
            window: list[Any] = []
            k = 0
            while time.monotonic() < t_end:
                while len(window) < 32:
                    k += 1
                    window.append(c.submit("echo", k, key=f"key-{n}-{k}"))
                    if k % 25 == 0:
                        c.task_status(old[k % len(old)].task_id)
                window.pop(0).result(30)
                done += 1
            for f in window:
                f.result(30)
                done += 1
        stop.set()
        pinger.join(30)
        rtts.sort()
        return {"p50": statistics.median(rtts) * 1e6, "p99": rtts[int(len(rtts) * 0.99)] * 1e6,
                "max": rtts[-1] * 1e6, "pings": len(rtts), "tput": done / seconds}
    finally:
        _procs.stop(procs)
        os.chdir(here)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", metavar="TREE")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    server = PgServer()
    out: dict[str, list[dict[str, float]]] = {t: [] for t in args.trees}
    try:
        n = 0
        for _ in range(args.rounds):
            for tree in args.trees:
                n += 1
                out[tree].append(run(os.path.abspath(tree), server, args.seconds, n))
    finally:
        server.close()
    print(f"{'tree':28} {'ping p50':>10} {'p99':>10} {'max':>10} {'keyed tasks/s':>14}")
    for tree, rs in out.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{tree:28} {med['p50']:8.0f} µs {med['p99']:8.0f} µs {med['max']:8.0f} µs "
              f"{med['tput']:12.0f}")


if __name__ == "__main__":
    main()
