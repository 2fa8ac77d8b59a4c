#!/usr/bin/env python3
"""Does serving --http slow the queen? Round trips with it off, and on with a scraper.

    python -m benchmarks.observe_bench [--quick] [--queued N] [--json]

Three colonies side by side, started from the CLI on tcp loopback, each one echo forager:
a queen without --http, a queen with --http whose /metrics and /api/snapshot a scraper
polls every second (as Prometheus and an open dashboard would), and raw pyzmq on the same
hops (the floor). They take turns in slices, so drifts in machine load fall on all alike.
``--queued N`` first parks N tasks for a capability nobody serves on both queens, so
each snapshot has a large queue to count. Prints percentiles (microseconds), the ratios
to raw pyzmq, what the scrapes cost and how long the queen's snapshots take to build.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from typing import Any

from meshant import Client
from meshant.apps import _procs
from meshant.apps.bench import PAYLOAD, seq_mesh, seq_raw
from meshant.apps.bench_topologies import Endpoints, RawTopology
from meshant.apps.stats import summary


class _Queen:
    def __init__(self, http: bool) -> None:
        self.eps = Endpoints("tcp")
        args = ["queen", "--bind", self.eps.next(), "--pub", self.eps.next(), "--json",
                "--journal", ":memory:", "--max-queue", "1000000"]
        if http:
            args += ["--http", "127.0.0.1:0"]
        self.procs = [_procs.spawn(args)]
        info = _procs.read_json_line(self.procs[0], 20)
        self.endpoint, self.http = info["router"], info.get("http")
        f = _procs.spawn(["forager", "--queen", self.endpoint, "--json", "--slots", "1"])
        self.procs.append(f)
        _procs.read_json_line(f, 20)

    def close(self) -> None:
        _procs.stop(self.procs)
        self.eps.close()


class _Scraper(threading.Thread):
    """Polls /metrics and /api/snapshot every ``every`` seconds, timing each."""

    def __init__(self, url: str, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.stop = threading.Event()
        self.times: list[float] = []
        self.bytes = 0
        self.build: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(self.every):
            for path in ("metrics", "api/snapshot"):
                t0 = time.perf_counter()
                with urllib.request.urlopen(self.url + path, timeout=10) as r:
                    body = r.read()
                self.times.append(time.perf_counter() - t0)
                self.bytes += len(body)
                if path == "api/snapshot":
                    self.build.append(json.loads(body)["build_seconds"])


def print_table(stats: dict[str, dict[str, float]], width: int) -> None:
    """Percentiles (µs) per row, with the ratios to the row named ``raw``."""
    print(f"{'':{width}}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}   ratio to raw (p50, p99)")
    r = stats["raw"]
    for k, st in stats.items():
        print(f"{k:{width}}" + "".join(f"{st[q]:9.0f}" for q in ("p50", "p90", "p99", "p99.9"))
              + f"   {st['p50'] / r['p50']:.2f}x, {st['p99'] / r['p99']:.2f}x")


def _park(endpoint: str, n: int) -> None:
    with Client(endpoint, timeout=10) as c:
        for i in range(0, n, 1000):
            for _ in range(min(1000, n - i)):
                c.submit("nobody-serves-this", i, wait=3600)
            time.sleep(0.05)  # let the queen keep up (its submit rate limit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds")
    ap.add_argument("--queued", type=int, default=0, help="tasks parked in each queen first")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    n, rounds = (600, 3) if args.quick else (6000, 10)
    off, on, raw = _Queen(False), _Queen(True), RawTopology("tcp", workers=1)
    scraper: _Scraper | None = None
    try:
        for q in (off, on):
            if args.queued:
                _park(q.endpoint, args.queued)
        assert on.http is not None
        scraper = _Scraper(on.http)
        scraper.start()
        samples: dict[str, list[float]] = {"http off": [], "http on + scraper": [], "raw": []}
        s = raw.client()
        with Client(off.endpoint, timeout=10) as c_off, Client(on.endpoint, timeout=10) as c_on:
            per = n // rounds
            for i in range(rounds):
                warm = 50 if i == 0 else 5
                samples["http off"] += seq_mesh(c_off, PAYLOAD, per, warm)
                samples["http on + scraper"] += seq_mesh(c_on, PAYLOAD, per, warm)
                samples["raw"] += seq_raw(s, PAYLOAD, per, warm)
        s.close(0)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join(15)
        for q in (off, on):
            q.close()
        raw.close()
    stats = {k: summary([x * 1e6 for x in v]) for k, v in samples.items()}
    report: dict[str, Any] = {"round_trip_us": stats, "queued": args.queued,
                              "samples": n, "scrapes": len(scraper.times) if scraper else 0}
    if scraper is not None and scraper.times:
        report["scrape_ms"] = summary([x * 1e3 for x in scraper.times])
        report["snapshot_build_ms"] = summary([x * 1e3 for x in scraper.build])
        report["scrape_bytes_each"] = scraper.bytes // len(scraper.times)
    if args.json:
        print(json.dumps(report))
        return
    print(f"round trip, tcp, one echo forager, {n} per colony in {rounds} interleaved "
          f"slices{f', {args.queued:,} tasks parked' if args.queued else ''}")
    print_table(stats, 22)
    on_, off_ = stats["http on + scraper"], stats["http off"]
    print(f"http on / off: p50 {on_['p50'] / off_['p50']:.3f}x, "
          f"p99 {on_['p99'] / off_['p99']:.3f}x")
    if "scrape_ms" in report:
        print(f"scrapes: {report['scrapes']} (/metrics and /api/snapshot each second), "
              f"p50 {report['scrape_ms']['p50']:.1f} ms, {report['scrape_bytes_each']:,} "
              f"bytes each; snapshot build p50 {report['snapshot_build_ms']['p50']:.2f} ms, "
              f"max {max(scraper.build) * 1e3 if scraper else 0:.2f} ms")


if __name__ == "__main__":
    main()
