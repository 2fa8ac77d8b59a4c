#!/usr/bin/env python3
"""The task graph shapes of ``benchmarks/graph.py`` on Dask distributed and Ray, each only
if installed: 10,000 trivial nodes as one fan-out (1 -> N-2 -> 1), as chains of 100, as
one chain, and as independent tasks, in nodes per second.

Install the peers in a venv of their own (never as meshant dependencies):

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install 'dask[distributed]' ray
    /work/peers-venv/bin/python benchmarks/peers/graph_compare.py [--nodes 10000] [--json]

One worker process with one thread each (Dask: LocalCluster(n_workers=1,
threads_per_worker=1); Ray: num_cpus=1), like ``compare.py``; the best of ``--rounds``.
Dask runs each graph as one low-level task graph (``client.get``), Ray as chained
object references (``f.remote(ref)``), which is how each is meant to run dependent work.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from typing import Any

PAYLOAD = {"n": 1, "text": "x" * 16}


def echo(x: Any) -> Any:
    return x


def count(*xs: Any) -> int:
    return len(xs)


def shapes(n: int) -> dict[str, dict[str, Any]]:
    """Dask low-level graphs (key -> task) and their output keys, per shape."""
    fan: dict[str, Any] = {"root": (echo, PAYLOAD)}
    leaves = [f"l{i}" for i in range(n - 2)]
    fan.update({k: (echo, "root") for k in leaves})
    fan["gather"] = (count, *leaves)
    ch: dict[str, Any] = {}
    for c in range(n // 100):
        for i in range(100):
            ch[f"c{c}.{i}"] = (echo, f"c{c}.{i - 1}") if i else (echo, PAYLOAD)
    one: dict[str, Any] = {f"s{i}": (echo, f"s{i - 1}") if i else (echo, PAYLOAD)
                           for i in range(n)}
    return {f"graph: fan-out 1 -> {n - 2:,} -> 1": {"dsk": fan, "out": ["gather"]},
            f"graph: {n // 100} chains of 100": {"dsk": ch,
                                                 "out": [f"c{c}.99" for c in range(n // 100)]},
            f"graph: 1 chain of {n:,}": {"dsk": one, "out": [f"s{n - 1}"]}}


def dask_peer(n: int, rounds: int) -> dict[str, float]:
    from dask.distributed import Client, LocalCluster

    best: dict[str, float] = {}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather(client.map(echo, [PAYLOAD] * 200, pure=False))  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            client.gather(client.map(echo, [PAYLOAD] * n, pure=False))
            _best(best, f"{n:,} independent tasks", n / (time.perf_counter() - t0))
            for name, s in shapes(n).items():
                t0 = time.perf_counter()
                client.get(s["dsk"], s["out"])
                _best(best, name, len(s["dsk"]) / (time.perf_counter() - t0))
    return best


def ray_peer(n: int, rounds: int) -> dict[str, float]:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    best: dict[str, float] = {}
    try:
        r_echo = ray.remote(echo)
        r_count = ray.remote(count)
        ray.get([r_echo.remote(PAYLOAD) for _ in range(200)])  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            ray.get([r_echo.remote(PAYLOAD) for _ in range(n)])
            _best(best, f"{n:,} independent tasks", n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            root = r_echo.remote(PAYLOAD)
            ray.get(r_count.remote(*[r_echo.remote(root) for _ in range(n - 2)]))
            _best(best, f"graph: fan-out 1 -> {n - 2:,} -> 1", n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            ends = []
            for _ in range(n // 100):
                ref = r_echo.remote(PAYLOAD)
                for _ in range(99):
                    ref = r_echo.remote(ref)
                ends.append(ref)
            ray.get(ends)
            _best(best, f"graph: {n // 100} chains of 100", n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            ref = r_echo.remote(PAYLOAD)
            for _ in range(n - 1):
                ref = r_echo.remote(ref)
            ray.get(ref)
            _best(best, f"graph: 1 chain of {n:,}", n / (time.perf_counter() - t0))
    finally:
        ray.shutdown()
    return best


def _best(best: dict[str, float], name: str, v: float) -> None:
    best[name] = max(best.get(name, 0.0), v)


PEERS: dict[str, tuple[str, Callable[[int, int], dict[str, float]]]] = {
    "dask": ("distributed", dask_peer),
    "ray": ("ray", ray_peer),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=tuple(PEERS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    for name, (module, fn) in PEERS.items():
        if args.only and name != args.only:
            continue
        if importlib.util.find_spec(module) is None:
            results[name] = {"skipped": f"{module} is not installed"}
            continue
        try:
            results[name] = {k: round(v, 1) for k, v in fn(args.nodes, args.rounds).items()}
        except Exception as e:  # a peer that will not run here is reported, not fatal
            results[name] = {"skipped": f"{type(e).__name__}: {e}"}
    if args.json:
        print(json.dumps(results))
        return 0
    for name, r in results.items():
        if "skipped" in r:
            print(f"{name}: skipped: {r['skipped']}")
            continue
        for shape, v in r.items():
            print(f"{name:6} {shape:40} {v:10,.0f} /s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
