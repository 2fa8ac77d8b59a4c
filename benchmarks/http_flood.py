#!/usr/bin/env python3
"""Does a flood of connections on the queen's --http port slow the colony? Round trips
quiet and under a flood, in one run.

    python -m benchmarks.http_flood [--connections 10000] [--quick] [--json]

One queen started from the CLI with --http on loopback, one echo forager, and raw pyzmq
on the same hops (the floor). The round trip is measured quiet, then while
:class:`Flood` keeps ``--connections`` connections open on the HTTP port — half idle,
half having sent half a request, each one the server closes opened again at once (the
harshest form: a connect flood) — then quiet again; quiet and flooded slices each take
turns with raw pyzmq. Meanwhile a prober times /healthz and /metrics, and the queen's
threads, resident memory and descriptors are sampled. Loopback only, bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from meshant import Client
from meshant.apps.bench import PAYLOAD, seq_mesh, seq_raw
from meshant.apps.bench_topologies import RawTopology
from meshant.apps.stats import summary

from .observe_bench import _Queen, print_table

HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def raise_open_files(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE toward ``want`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = min(hard, max(soft, want)) if hard != resource.RLIM_INFINITY else max(soft, want)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


class Flood(threading.Thread):
    """Keeps ``count`` connections open to ``127.0.0.1:port``: every other one sends
    half a request and stops, the rest send nothing. A connection the server closes is
    opened again at once (unless ``reopen`` is false). Stops on :meth:`stop` or after
    ``limit`` seconds, closing everything."""

    def __init__(self, port: int, count: int, *, reopen: bool = True,
                 limit: float = 300.0) -> None:
        super().__init__(name="http-flood", daemon=True)
        self.port, self.count, self.reopen, self.limit = port, count, reopen, limit
        self.opened = 0  # connects started
        self.connected = 0  # connects that completed
        self.closed_by_server = 0
        self.failed = 0
        self.live = 0  # open or connecting now
        self._halt = threading.Event()

    def stop(self, timeout: float = 30.0) -> None:
        self._halt.set()
        self.join(timeout)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        deadline = time.monotonic() + self.limit
        budget = self.count  # connects left, when not re-opening
        try:
            while not self._halt.is_set() and time.monotonic() < deadline:
                want = min(256, self.count - self.live, budget if not self.reopen else 1 << 30)
                for _ in range(max(0, want)):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.setblocking(False)
                    s.connect_ex(("127.0.0.1", self.port))
                    sel.register(s, selectors.EVENT_WRITE, self.opened % 2 == 0)
                    self.opened += 1
                    self.live += 1
                    budget -= 1
                for key, _ in sel.select(timeout=0.02):
                    s = key.fileobj
                    assert isinstance(s, socket.socket)
                    if key.events == selectors.EVENT_WRITE:
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            self.failed += 1
                            self._close(sel, s)
                            continue
                        self.connected += 1
                        if key.data:
                            try:
                                s.send(HALF_REQUEST)
                            except OSError:
                                pass
                        sel.modify(s, selectors.EVENT_READ)
                    else:  # the server answered (408, 503) or closed: either way, gone
                        self.closed_by_server += 1
                        self._close(sel, s)
        finally:
            for key in list(sel.get_map().values()):
                self._close(sel, key.fileobj)  # type: ignore[arg-type]
            sel.close()

    def figures(self) -> dict[str, int]:
        return {"opened": self.opened, "connected": self.connected, "live": self.live,
                "closed_by_server": self.closed_by_server, "failed": self.failed}

    def _close(self, sel: selectors.BaseSelector, s: socket.socket) -> None:
        sel.unregister(s)
        s.close()
        self.live -= 1


class FloodProcess:
    """A :class:`Flood` in a process of its own, so its work takes no turn from the
    measuring process's threads (they share no interpreter lock): started at once,
    stopped (and its figures read) by :meth:`stop`."""

    def __init__(self, port: int, count: int, *, reopen: bool = True,
                 limit: float = 300.0) -> None:
        args = [sys.executable, "-m", "benchmarks.http_flood", "--flood", str(port),
                "--connections", str(count), "--limit", str(limit)]
        if not reopen:
            args.append("--hold")
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=root)
        self.figures: dict[str, int] = {}

    def wait_connected(self, n: int, timeout: float) -> dict[str, int]:
        """Wait until ``n`` connects completed (or ``timeout``); the latest figures."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not select.select([self.proc.stdout], [], [], 0.5)[0]:
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            self.figures = json.loads(line)
            if self.figures["connected"] >= n:
                break
        return self.figures

    def stop(self, timeout: float = 30.0) -> dict[str, int]:
        """Stop the flood (closing every connection) and return its final figures."""
        proc = self.proc
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()  # the flood stops when its stdin closes
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not proc.stdout.closed and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                if not line:
                    proc.stdout.close()
                elif line.strip():
                    self.figures = json.loads(line)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        return self.figures


def _flood_main(port: int, count: int, reopen: bool, limit: float) -> None:
    """The flood process: a figures line every 0.2 s; stops when stdin closes."""
    flood = Flood(port, count, reopen=reopen, limit=limit)
    flood.start()
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not done.wait(0.2) and flood.is_alive():
        print(json.dumps(flood.figures()), flush=True)
    flood.stop()
    print(json.dumps(flood.figures()), flush=True)


def proc_status(pid: int) -> dict[str, int]:
    """A process's threads, resident memory (bytes) and open descriptors, from /proc."""
    out = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "Threads":
                out["threads"] = int(value)
            elif key == "VmRSS":
                out["rss"] = int(value.split()[0]) * 1024
    return out


class Prober(threading.Thread):
    """Times GET /healthz and /metrics every ``every`` seconds; samples the queen."""

    def __init__(self, url: str, pid: int, every: float = 0.5) -> None:
        super().__init__(name="http-prober", daemon=True)
        self.url, self.pid, self.every = url, pid, every
        self.times: dict[str, list[float]] = {"healthz": [], "metrics": []}
        self.failures: list[str] = []
        self.peak: dict[str, int] = {}
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)

    def run(self) -> None:
        while not self._halt.wait(self.every):
            for path, t in self.times.items():
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(self.url + path, timeout=20) as r:
                        r.read()
                    t.append(time.perf_counter() - t0)
                except OSError as e:
                    self.failures.append(f"{path}: {e}")
            for k, v in proc_status(self.pid).items():
                self.peak[k] = max(self.peak.get(k, 0), v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--hold", action="store_true",
                    help="open each connection once, without re-opening what the server "
                         "closes")
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--flood", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=float, default=300.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flood:
        raise_open_files(args.connections + 1024)
        _flood_main(args.flood, args.connections, not args.hold, args.limit)
        return
    raise_open_files(args.connections + 1024)
    n, rounds = (600, 3) if args.quick else (12000, 12)
    q, raw = _Queen(True), RawTopology("tcp", workers=1)
    assert q.http is not None
    pid = q.procs[0].pid
    port = int(q.http.rstrip("/").rsplit(":", 1)[1])
    samples: dict[str, list[float]] = {"quiet": [], "flood": [], "raw": []}
    base = proc_status(pid)
    flood: FloodProcess | None = None
    figures: dict[str, int] = {}
    prober = Prober(q.http, pid)
    try:
        s = raw.client()
        with Client(q.endpoint, timeout=10) as c:
            per = n // rounds
            seq_mesh(c, PAYLOAD, 50, 0)
            for phase in ("quiet", "flood", "quiet"):
                if phase == "flood":
                    flood = FloodProcess(port, args.connections, reopen=not args.hold)
                    flood.wait_connected(args.connections, 60)
                    prober.start()
                for _ in range(rounds // 2 if phase == "quiet" else rounds):
                    samples[phase] += seq_mesh(c, PAYLOAD, per, 5)
                    samples["raw"] += seq_raw(s, PAYLOAD, per, 5)
                if phase == "flood":
                    prober.stop()
                    assert flood is not None
                    figures = flood.stop()
        s.close(0)
    finally:
        try:
            if flood is not None:
                figures = flood.stop() or figures
        finally:
            q.close()
            raw.close()
    stats = {k: summary([x * 1e6 for x in v]) for k, v in samples.items()}
    report: dict[str, Any] = {
        "round_trip_us": stats, "connections": args.connections, "reopen": not args.hold,
        "flood": figures,
        "probe_ms": {k: summary([x * 1e3 for x in v]) for k, v in prober.times.items() if v},
        "probe_max_ms": {k: max(v) * 1e3 for k, v in prober.times.items() if v},
        "probe_failures": prober.failures, "queen_before": base, "queen_peak": prober.peak}
    if args.json:
        print(json.dumps(report))
        return
    print(f"round trip, tcp, one echo forager: quiet, then {args.connections:,} connections "
          f"on the HTTP port ({'re-opened as closed' if not args.hold else 'held'}), then "
          "quiet again; each slice beside raw pyzmq")
    print_table(stats, 10)
    fl, qu = stats["flood"], stats["quiet"]
    print(f"flood / quiet: p50 {fl['p50'] / qu['p50']:.2f}x, p99 {fl['p99'] / qu['p99']:.2f}x")
    print(f"flood: {figures.get('opened', 0):,} connects, {figures.get('connected', 0):,} "
          f"completed, {figures.get('closed_by_server', 0):,} closed by the server")
    for k, st in report["probe_ms"].items():
        print(f"/{k} during the flood: p50 {st['p50']:.1f} ms, max "
              f"{report['probe_max_ms'][k]:.0f} ms, {len(prober.times[k])} probes")
    print(f"probe failures: {len(prober.failures)}")
    print(f"queen: threads {base['threads']} -> peak {prober.peak.get('threads')}, "
          f"RSS {base['rss'] / 2**20:.0f} -> peak {prober.peak.get('rss', 0) / 2**20:.0f} MB, "
          f"descriptors {base['fds']} -> peak {prober.peak.get('fds')}")


if __name__ == "__main__":
    main()
