#!/usr/bin/env python3
"""The same round-trip and throughput scenarios on the systems a user might pick instead
of meshant: Dask distributed, Celery (with Redis) and Ray — each only if installed.

    pip install 'dask[distributed]'      # and/or: celery redis (+ a redis-server), ray
    python benchmarks/peers/compare.py [--quick]

Nothing here is needed by the tests; a peer that is not installed is skipped with a note.
meshant's own figures come from `meshant bench` (same payload, same trivial echo task).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from meshant.apps.stats import summary

PAYLOAD = {"task": "echo", "n": 1, "text": "x" * 64}


def echo(x: Any) -> Any:
    return x


def _measure(call: Callable[[], Any], submit_many: Callable[[int], None], n_seq: int,
             n_tput: int) -> dict[str, Any]:
    for _ in range(max(10, n_seq // 10)):
        call()
    samples = []
    for _ in range(n_seq):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    s = summary(samples)
    t0 = time.perf_counter()
    submit_many(n_tput)
    tput = n_tput / (time.perf_counter() - t0)
    return {"p50_us": round(s["p50"], 1), "p99_us": round(s["p99"], 1),
            "throughput_per_s": round(tput, 1)}


def dask_peer(n_seq: int, n_tput: int) -> dict[str, Any]:
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        def one() -> Any:
            return client.submit(echo, PAYLOAD, pure=False).result()

        def many(n: int) -> None:
            client.gather(client.map(echo, [PAYLOAD] * n, pure=False))

        return _measure(one, many, n_seq, n_tput)


def celery_peer(n_seq: int, n_tput: int) -> dict[str, Any]:
    server = shutil.which("redis-server")
    if server is None:
        raise ModuleNotFoundError("redis-server is not on PATH")
    import celery

    port = 6399
    redis = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    worker = None
    try:
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}/0"
        app = celery.Celery("peers", broker=url, backend=url)
        task = app.task(name="peers.echo")(echo)
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A",
                                   "benchmarks.peers.celery_app", "worker", "-c", "1",
                                   "--loglevel", "WARNING"],
                                  env={"PEERS_REDIS": url, **__import__("os").environ})
        time.sleep(3)

        def one() -> Any:
            return task.delay(PAYLOAD).get(timeout=30)

        def many(n: int) -> None:
            for r in [task.delay(PAYLOAD) for _ in range(n)]:
                r.get(timeout=60)

        return _measure(one, many, n_seq, n_tput)
    finally:
        for proc in (worker, redis):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def ray_peer(n_seq: int, n_tput: int) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote_echo = ray.remote(echo)

        def one() -> Any:
            return ray.get(remote_echo.remote(PAYLOAD))

        def many(n: int) -> None:
            ray.get([remote_echo.remote(PAYLOAD) for _ in range(n)])

        return _measure(one, many, n_seq, n_tput)
    finally:
        ray.shutdown()


PEERS: dict[str, tuple[str, Callable[[int, int], dict[str, Any]]]] = {
    "dask": ("distributed", dask_peer),
    "celery": ("celery", celery_peer),
    "ray": ("ray", ray_peer),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n_seq, n_tput = (100, 500) if args.quick else (1000, 5000)
    results: dict[str, Any] = {}
    for name, (module, fn) in PEERS.items():
        if importlib.util.find_spec(module) is None:
            results[name] = {"skipped": f"{module} is not installed"}
            continue
        try:
            results[name] = fn(n_seq, n_tput)
        except ModuleNotFoundError as e:
            results[name] = {"skipped": str(e)}
    if args.json:
        print(json.dumps(results))
    else:
        for name, r in results.items():
            print(f"{name:8} " + (f"skipped: {r['skipped']}" if "skipped" in r else
                                  f"p50 {r['p50_us']} us  p99 {r['p99_us']} us  "
                                  f"{r['throughput_per_s']} tasks/s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
