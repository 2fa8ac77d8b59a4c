#!/usr/bin/env python3
"""Failover time: the leader killed -> the first result from the new leader.

    python -m benchmarks.failover [--runs 7] [--lease 5] [--hb-interval 1]
                                  [--fault kill|freeze] [--json FILE]

Each run starts its own PostgreSQL database (on a throwaway server, initdb in a temp dir:
``tests/pg_server.py``; or ``--postgres URL`` for one you run), two queens from the CLI
sharing it as their journal (A leads, B stands by), two foragers and a client given both
endpoints. The client keeps a window of 50 short tasks in flight; once results flow, A is
``kill -9``ed (``--fault freeze``: SIGSTOPped, in the middle of whatever it was doing,
and left frozen). The figure is the time from the kill to the first result the client gets
through B, with the phases it is made of: the foragers' and client's detection of the
silence (``hb_interval x hb_misses``), the lease lapsing, B's restore.

Only 127.0.0.1 and ipc:// are used; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from meshant import Client
from meshant.apps import _procs


def one_run(url: str, lease: float, hb: float, misses: int, tmp: Path,
            fault: str = "kill") -> dict[str, float]:
    procs = []
    hbargs = ["--hb-interval", str(hb), "--hb-misses", str(misses)]

    def queen(name: str) -> Any:
        p = _procs.spawn(["queen", "--name", name, "--bind", f"ipc://{tmp}/{name}",
                          "--pub", f"ipc://{tmp}/{name}-pub", "--json", "--journal", url,
                          "--lease", str(lease), *hbargs])
        procs.append(p)
        _procs.read_json_line(p, 30)
        return p

    both = f"ipc://{tmp}/qa,ipc://{tmp}/qb"
    try:
        a = queen("qa")
        time.sleep(0.3)
        queen("qb")
        for i in range(2):
            f = _procs.spawn(["forager", "--queen", both, "--name", f"f{i}", "--slots", "8",
                              "--json"])
            procs.append(f)
            _procs.read_json_line(f, 30)
        first_after: list[float] = []
        killed = [0.0]
        lock = threading.Lock()
        with Client(both, queen_wait=120) as c:
            stop = threading.Event()

            def done(fut: Any) -> None:
                if killed[0] and c.queen.endswith("/qb") and not first_after:
                    with lock:
                        if not first_after:
                            first_after.append(time.monotonic())

            def pump() -> None:
                inflight: list[Any] = []
                while not stop.is_set():
                    inflight = [f for f in inflight if not f.done()]
                    while len(inflight) < 50:
                        fut = c.submit("sleep", {"seconds": 0.005})
                        fut.add_done_callback(done)
                        inflight.append(fut)
                    time.sleep(0.002)

            t = threading.Thread(target=pump, daemon=True)
            t.start()
            time.sleep(1.5)  # steady state
            a.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            killed[0] = time.monotonic()
            deadline = time.monotonic() + 60
            while not first_after and time.monotonic() < deadline:
                time.sleep(0.01)
            stop.set()
            t.join(5)
        if fault == "freeze":
            a.send_signal(signal.SIGCONT)
        if not first_after:
            raise RuntimeError("no result through the new leader within 60 s")
        return {"failover_s": round(first_after[0] - killed[0], 3)}
    finally:
        _procs.stop(procs, timeout=5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--lease", type=float, default=5.0)
    ap.add_argument("--hb-interval", type=float, default=1.0)
    ap.add_argument("--hb-misses", type=int, default=5)
    ap.add_argument("--fault", choices=["kill", "freeze"], default="kill")
    ap.add_argument("--postgres", metavar="URL", help="a database to use (else a throwaway "
                    "server is started with initdb)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    server = None
    if args.postgres is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.pg_server import PgServer

        server = PgServer()
    times = []
    try:
        for i in range(args.runs):
            url = args.postgres or server.create_db(f"failover_{i}")  # type: ignore[union-attr]
            with tempfile.TemporaryDirectory(prefix="meshant-failover-") as d:
                r = one_run(url, args.lease, args.hb_interval, args.hb_misses, Path(d),
                            args.fault)
            times.append(r["failover_s"])
            print(f"run {i + 1}: {r['failover_s']:.2f} s", file=sys.stderr)
    finally:
        if server is not None:
            server.close()
    out = {"fault": args.fault, "lease": args.lease, "hb_interval": args.hb_interval,
           "hb_misses": args.hb_misses,
           "runs": times, "min": min(times), "median": statistics.median(times),
           "max": max(times)}
    print(f"failover (leader {args.fault} -> first result via the new leader), lease "
          f"{args.lease} s,"
          f" heartbeat {args.hb_interval} s x {args.hb_misses}: min {out['min']:.2f} s, "
          f"median {out['median']:.2f} s, max {out['max']:.2f} s over {len(times)} runs")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
