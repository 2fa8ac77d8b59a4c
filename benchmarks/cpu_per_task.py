#!/usr/bin/env python3
"""Where a task's CPU goes: each process's CPU time per task, meshant beside raw pyzmq.

    python -m benchmarks.cpu_per_task [--journal :memory:|file] [--mode seq|pipelined]

A CLI queen and one forager (tcp), the client in this process; raw pyzmq's broker and
worker on the same hops. CPU time is read from ``/proc`` (user + system, every thread,
libzmq's I/O threads included) before and after 3,000 sequential round trips or 20,000
pipelined tasks (window 64, the threaded client), and divided by the tasks. Also how busy
each of the queen's threads was over the wall time: a thread near 100 % is the bottleneck;
a pipeline in which none is has stages waiting on each other.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

from meshant.apps.bench import PAYLOAD, pipelined_mesh, pipelined_raw, seq_mesh, seq_raw
from meshant.apps.bench_topologies import MeshTopology, RawTopology

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(stat: str) -> float:
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return _cpu(f.read())


def thread_cpu(pid: int) -> dict[str, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        out[f"{raw[raw.index('(') + 1:raw.rindex(')')]}:{tid}"] = _cpu(raw)
    return out


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--journal", default=":memory:", help="':memory:' or 'file'")
    ap.add_argument("--mode", choices=("seq", "pipelined"), default="seq")
    args = ap.parse_args()
    pipelined = args.mode == "pipelined"
    n = 20000 if pipelined else 3000
    with tempfile.TemporaryDirectory() as d:
        journal = ":memory:" if args.journal == ":memory:" else f"{d}/j.db"
        mesh = MeshTopology("tcp", foragers=1, slots=64 if pipelined else 1, journal=journal)
        raw = RawTopology("tcp", workers=1)
        try:
            mesh_pids = {"queen": mesh.procs[0].pid, "forager": mesh.procs[1].pid}
            raw_pids = {"broker": raw.procs[0].pid, "worker": raw.procs[1].pid}
            with mesh.client(threaded=pipelined) as c:
                s = raw.client()
                try:
                    for side, pids in (("meshant", mesh_pids), ("raw pyzmq", raw_pids)):
                        def run(k: int, side: str = side) -> None:
                            if side == "meshant":
                                if pipelined:
                                    pipelined_mesh(c, PAYLOAD, k, 64)
                                else:
                                    seq_mesh(c, PAYLOAD, k, 0)
                            elif pipelined:
                                pipelined_raw(s, PAYLOAD, k, 64)
                            else:
                                seq_raw(s, PAYLOAD, k, 0)
                        run(n // 10)  # warm-up
                        first = pids[next(iter(pids))]
                        threads0 = thread_cpu(first)
                        before = {k: process_cpu(p) for k, p in pids.items()}
                        mine, t0 = own_cpu(), time.perf_counter()
                        run(n)
                        wall = time.perf_counter() - t0
                        mine = own_cpu() - mine
                        after = {k: process_cpu(p) for k, p in pids.items()}
                        threads1 = thread_cpu(first)
                        per = "  ".join(f"{k} {(after[k] - before[k]) / n * 1e6:.1f}"
                                        for k in pids)
                        print(f"{side:10s} {n / wall:8.0f} tasks/s  CPU µs per task: {per}  "
                              f"client {mine / n * 1e6:.1f}")
                        busy = {k: round((v - threads0.get(k, 0.0)) / wall * 100)
                                for k, v in threads1.items() if v > threads0.get(k, 0.0)}
                        print(f"{'':10s} {next(iter(pids))}'s threads, % of the wall time "
                              f"busy: {busy}")
                finally:
                    s.close(0)
        finally:
            mesh.close()
            raw.close()


if __name__ == "__main__":
    main()
