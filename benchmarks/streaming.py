#!/usr/bin/env python3
"""Token streams from many tasks through one queen to many clients, against a raw pyzmq
relay of the same messages in the same run (#26's streaming target).

    python -m benchmarks.streaming [--tasks 10] [--partials 2000] [--rounds 3]
                                   [--journal :memory:|file] [--json]

meshant: a CLI queen and one CLI forager with a slot per task
(``benchmarks/streaming_app.py``: ``tokens`` calls ``ctx.partial`` n times, as fast as
it can); ``--tasks`` clients in this process, one thread and one ``Client`` each, submit
one task each at the same moment and count the partial results their ``updates()``
yield. Raw pyzmq: the benchmark broker (``meshant.apps._rawzmq``: ROUTER in front, ROUTER
behind, frames forwarded untouched) and a streaming worker that answers each request with
n msgpack messages; ``--tasks`` DEALER clients, one thread each, count them. Messages per
second is every client's count over the time from the first request to the last message.
The target: meshant's rate at least 2x the raw relay's (raw sends one message per token;
meshant may batch a turn's partials per client).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshant import Client
from meshant.apps import _procs


def _together(n: int, work: Any) -> float:
    """Run ``work(i)`` on n threads started together; the seconds until the last ends."""
    go = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        go.wait()
        try:
            work(i)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a stream did not end within 120 s")
    return time.perf_counter() - t0


def mesh_rate(queen: str, tasks: int, partials: int, progress: bool = False) -> float:
    clients = [Client(queen, timeout=10) for _ in range(tasks)]
    try:
        for c in clients:  # connected and welcomed before the clock starts
            c.run("tokens", {"n": 1}, result_timeout=10)
        got = [0] * tasks

        def one(i: int) -> None:
            fut = clients[i].submit("tokens", {"n": partials, "progress": progress})
            got[i] = sum(1 for u in fut.updates(30) if u.kind == "partial")
            fut.result(30)

        secs = _together(tasks, one)
    finally:
        for c in clients:
            c.close()
    if sum(got) != tasks * partials:
        raise RuntimeError(f"meshant delivered {sum(got)} of {tasks * partials} partials")
    return sum(got) / secs


def raw_rate(front: str, tasks: int, partials: int) -> float:
    ctx = zmq.Context()
    socks = []
    try:
        for _ in range(tasks):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 0)
            s.connect(front)
            s.send(msgpack.packb({"n": 1}))
            if not s.poll(10_000):
                raise RuntimeError("the raw streamer did not answer within 10 s")
            s.recv()
            socks.append(s)
        got = [0] * tasks

        def one(i: int) -> None:
            s = socks[i]
            s.send(msgpack.packb({"n": partials}))
            unpackb = msgpack.unpackb
            for _ in range(partials):
                if not s.poll(30_000):
                    raise RuntimeError("the raw stream stalled for 30 s")
                unpackb(s.recv())
                got[i] += 1

        secs = _together(tasks, one)
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return sum(got) / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--partials", type=int, default=2000, help="partials per task")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--journal", default=":memory:", help="':memory:' or 'file' (a fresh one)")
    ap.add_argument("--progress", action="store_true", help="a progress report after "
                    "each partial (counted apart: the rate is of partials)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rates: dict[str, list[float]] = {"meshant": [], "raw": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            journal = args.journal if args.journal == ":memory:" else f"{d}/j{r}.db"
            procs: list[subprocess.Popen[str]] = []
            try:
                q = _procs.spawn(["queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                                  "tcp://127.0.0.1:0", "--json", "--journal", journal], env)
                procs.append(q)
                router = _procs.read_json_line(q, 20)["router"]
                f = _procs.spawn(["forager", "--queen", router, "--app",
                                  "benchmarks.streaming_app:forager", "--slots",
                                  str(args.tasks), "--json"], env)
                procs.append(f)
                _procs.read_json_line(f, 20)
                rates["meshant"].append(mesh_rate(router, args.tasks, args.partials,
                                                 args.progress))
            finally:
                _procs.stop(procs)
            rates["raw"].append(_raw_round(args.tasks, args.partials))
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {"tasks": args.tasks, "partials_per_task": args.partials, "journal": args.journal,
           "progress": args.progress,
           "rounds": args.rounds, "meshant_msgs_per_s": round(med["meshant"]),
           "raw_msgs_per_s": round(med["raw"]), "ratio": round(med["meshant"] / med["raw"], 2),
           "target": 2.0}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.tasks} streams x {args.partials} partials, {args.rounds} rounds "
              f"(medians), journal {args.journal}")
        print(f"  meshant  {out['meshant_msgs_per_s']:>9,} partials/s")
        print(f"  raw      {out['raw_msgs_per_s']:>9,} messages/s")
        print(f"  ratio    {out['ratio']:.2f}x raw (target >= 2x)")


def _raw_round(tasks: int, partials: int) -> float:
    procs: list[subprocess.Popen[str]] = []
    py = [sys.executable, "-m", "meshant.apps._rawzmq"]
    try:
        b = subprocess.Popen([*py, "broker", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"],
                             stdout=subprocess.PIPE, text=True)
        procs.append(b)
        ready = _procs.read_json_line(b, 20)
        w = subprocess.Popen([*py, "streamer", ready["back"]], stdout=subprocess.PIPE, text=True)
        procs.append(w)
        _procs.read_json_line(w, 20)
        return raw_rate(ready["front"], tasks, partials)
    finally:
        _procs.stop(procs)


if __name__ == "__main__":
    main()
