#!/usr/bin/env python3
"""Task graph scheduling overhead: 10,000 trivial nodes (chains and wide fan-outs), in
nodes per second, beside 10,000 independent tasks and raw pyzmq on the same hops.

    python -m benchmarks.graph [--nodes 10000] [--rounds 3] [--transport ipc] [--json]
                                [--journal]

A queen and one forager (``--slots``, serving the built-in ``echo``, which runs in the
forager's I/O thread) run as processes, the client here. Each shape runs ``--rounds``
times, interleaved with the others; the best round is reported (the least disturbed by
the other users of the machine). The floors, raw pyzmq through a forwarding broker
(``meshant.apps._rawzmq``): independent tasks and fan-outs against N pipelined round
trips, a chain against N sequential round trips (each node needs the previous result).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

from meshant import Client, Graph
from meshant.apps.bench import pipelined_raw, seq_raw
from meshant.apps.bench_topologies import MeshTopology, RawTopology

PAYLOAD = {"n": 1, "text": "x" * 16}


def chains(n: int, length: int) -> Graph:
    """``n // length`` chains of ``length`` nodes, each passing its result on."""
    g = Graph()
    for c in range(n // length):
        for i in range(length):
            prev = f"c{c}.{i - 1}"
            g.node(f"c{c}.{i}", "echo", g.result(prev) if i else PAYLOAD)
    return g


def fan(n: int) -> Graph:
    """One root, ``n - 2`` nodes using its result, and a node gathering all of theirs."""
    g = Graph()
    g.node("root", "echo", PAYLOAD)
    leaves = [g.node(f"l{i}", "echo", g.result("root")) for i in range(n - 2)]
    g.node("gather", "echo", {"count": len(leaves)}, after=leaves)
    return g


def run_graph(c: Client, g: Graph, timeout: float = 300.0) -> float:
    t0 = time.perf_counter()
    out = c.submit_graph(g).result(timeout)
    took = time.perf_counter() - t0
    assert len(out) == len(g.nodes)
    return len(g.nodes) / took


def run_tasks(c: Client, n: int, timeout: float = 300.0) -> float:
    t0 = time.perf_counter()
    futs = [c.submit("echo", PAYLOAD) for _ in range(n)]
    for f in futs:
        f.result(timeout)
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--transport", default="ipc", choices=("ipc", "tcp"))
    ap.add_argument("--journal", action="store_true", help="the queen journals (SQLite)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.nodes
    tmp = tempfile.mkdtemp(prefix="meshant-graph-bench-")
    journal = f"{tmp}/q.db" if args.journal else None
    mesh = MeshTopology(args.transport, foragers=1, slots=args.slots, journal=journal)
    raw = RawTopology(args.transport, workers=1)
    best: dict[str, float] = {}
    shapes: dict[str, Any] = {
        f"{n:,} independent tasks": lambda c: run_tasks(c, n),
        f"graph: fan-out 1 -> {n - 2:,} -> 1": lambda c: run_graph(c, fan(n)),
        f"graph: {n // 100} chains of 100": lambda c: run_graph(c, chains(n, 100)),
        f"graph: 1 chain of {n:,}": lambda c: run_graph(c, chains(n, n)),
    }
    try:
        with mesh.client(threaded=True) as c:
            s = raw.client()
            try:
                run_tasks(c, 500)  # warm-up
                run_graph(c, fan(500))
                for _ in range(args.rounds):
                    for name, fn in shapes.items():
                        best[name] = max(best.get(name, 0.0), fn(c))
                    best["raw pyzmq, pipelined"] = max(
                        best.get("raw pyzmq, pipelined", 0.0),
                        pipelined_raw(s, PAYLOAD, n, args.slots))
                    t = seq_raw(s, PAYLOAD, n, 10)
                    best["raw pyzmq, sequential"] = max(
                        best.get("raw pyzmq, sequential", 0.0), len(t) / sum(t))
            finally:
                s.close(0)
    finally:
        mesh.close()
        raw.close()
    if args.json:
        print(json.dumps({k: round(v, 1) for k, v in best.items()}))
        return 0
    ind = best[f"{n:,} independent tasks"]
    print(f"{'shape':40} {'per s':>10} {'vs tasks':>9}")
    for name, v in best.items():
        print(f"{name:40} {v:10,.0f} {v / ind:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
