#!/usr/bin/env python3
"""Two versions of meshant's queen and forager, side by side: A/B in interleaved rounds.

    python -m benchmarks.ab [--journal file|:memory:] [--rounds 10] TREE_A TREE_B

Each TREE is a checkout of meshant (a ``git worktree`` of the commit to compare). Per
round, for each tree in turn, a CLI queen and one forager are started from that tree
(``PYTHONPATH=TREE``, from a neutral directory so the current one does not shadow it),
and the same client (this process's meshant) measures 800 sequential round trips and the
throughput of 6,000 tasks pipelined with a window of 64; raw pyzmq is measured in the
same round. Medians over the rounds, and each ratio to raw's median, are printed: the
rounds interleave, so the machine's drifts fall on both versions alike.

``--cpu`` also reads the queen's and the forager's CPU time (``/proc``, every thread)
around the pipelined run and prints each one's microseconds per task: which process a
difference in throughput comes from (the client is this process's, the same for all).
The kernel counts CPU time in clock ticks (10 ms): with ``--cpu`` the pipelined run is
20,000 tasks, so one tick is 0.5 µs a task.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from typing import Any

from meshant.actors.client import Client
from meshant.apps import _procs
from meshant.apps.bench import PAYLOAD, pipelined_raw, seq_mesh, seq_raw
from meshant.apps.bench_topologies import MeshTopology, RawTopology

from .cpu_per_task import process_cpu

PIPELINED = 6000  # tasks in the throughput run (PIPELINED_CPU with --cpu)
PIPELINED_CPU = 20_000


def pipelined_direct(c: Client, n: int, window: int) -> float:
    """Tasks/s with ``window`` in flight, one thread (as raw pyzmq's loop does)."""
    t0 = time.perf_counter()
    q: collections.deque[Any] = collections.deque(
        c.submit("echo", PAYLOAD) for _ in range(min(window, n)))
    sent = len(q)
    while q:
        q.popleft().result(30)
        if sent < n:
            q.append(c.submit("echo", PAYLOAD))
            sent += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", metavar="TREE")
    ap.add_argument("--journal", default="file", help="'file' (a fresh one per run) or "
                    "':memory:'")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cpu", action="store_true", help="also the queen's and the forager's "
                    "CPU time per pipelined task")
    args = ap.parse_args()
    n = PIPELINED_CPU if args.cpu else PIPELINED
    spawn = _procs.spawn
    trees = [os.path.abspath(t) for t in args.trees]
    res: dict[str, dict[str, list[float]]] = {
        t: {"p50": [], "p99": [], "tput": [], "queen": [], "forager": []}
        for t in [*trees, "raw"]}
    raw = RawTopology("tcp", workers=1)
    s = raw.client()
    here = os.getcwd()
    try:
        os.chdir(tempfile.gettempdir())
        for _ in range(args.rounds):
            for tree in trees:
                def from_tree(a: list[str], env: dict[str, str] | None = None,
                              prefix: list[str] | None = None, t: str = tree) -> Any:
                    return spawn(a, {**(env or {}), "PYTHONPATH": t}, prefix)

                _procs.spawn = from_tree  # type: ignore[assignment]
                with tempfile.TemporaryDirectory() as d:
                    journal = args.journal if args.journal == ":memory:" else f"{d}/j.db"
                    for slots in (1, 64):
                        mesh = MeshTopology("tcp", foragers=1, slots=slots, journal=journal)
                        try:
                            with mesh.client(False) as c:
                                if slots == 1:
                                    xs = sorted(seq_mesh(c, PAYLOAD, 800, 100))
                                    res[tree]["p50"].append(xs[len(xs) // 2] * 1e6)
                                    res[tree]["p99"].append(xs[int(len(xs) * .99)] * 1e6)
                                else:
                                    pipelined_direct(c, 500, 64)
                                    pids = [pr.pid for pr in mesh.procs[:2]]
                                    before = [process_cpu(pid) for pid in pids] if args.cpu else []
                                    res[tree]["tput"].append(pipelined_direct(c, n, 64))
                                    if args.cpu:
                                        for role, pid, t0 in zip(("queen", "forager"), pids,
                                                                 before, strict=True):
                                            res[tree][role].append(
                                                (process_cpu(pid) - t0) / n * 1e6)
                        finally:
                            mesh.close()
            _procs.spawn = spawn
            ys = sorted(seq_raw(s, PAYLOAD, 800, 100))
            res["raw"]["p50"].append(ys[len(ys) // 2] * 1e6)
            res["raw"]["p99"].append(ys[int(len(ys) * .99)] * 1e6)
            res["raw"]["tput"].append(pipelined_raw(s, PAYLOAD, n, 64))
    finally:
        _procs.spawn = spawn
        os.chdir(here)
        s.close(0)
        raw.close()
    med = statistics.median
    r = {k: med(v) for k, v in res["raw"].items() if v}
    for name, v in res.items():
        print(f"{name:28s} p50 {med(v['p50']):7.0f} µs ({med(v['p50']) / r['p50']:.2f}x)  "
              f"p99 {med(v['p99']):7.0f} µs ({med(v['p99']) / r['p99']:.2f}x)  "
              f"{med(v['tput']):7.0f} tasks/s ({med(v['tput']) / r['tput']:.2f} of raw)"
              + (f"  queen {med(v['queen']):5.1f} forager {med(v['forager']):5.1f} µs CPU/task"
                 if v["queen"] else ""))


if __name__ == "__main__":
    main()
