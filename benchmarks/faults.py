#!/usr/bin/env python3
"""The promises under faults and load: the queen's memory and CPU, measured from outside.

    python -m benchmarks.faults [--scenario NAME ...] [--quick] [--json FILE]

Every scenario starts a real queen from the CLI (``python -m meshant queen --bind
tcp://127.0.0.1:0 --pub tcp://127.0.0.1:0 --json ...``) and reads the queen process's
``/proc/PID/status`` (VmRSS, VmHWM: the peak) and ``/proc/PID/stat`` (utime+stime).
Foragers and clients use only the public API (``Client``, ``Forager``) and the CLI, so
the script measures the code as it is today and after it changes.

Scenarios (each prints one line per figure beside its target):

* ``queue``            100,000 small tasks queued for a capability nobody serves,
                       journal ``:memory:`` and a file: queen RSS (< 200 MB)
* ``flood``            20,000 broadcasts of 64 KB as fast as possible, one subscriber
                       SIGSTOPped, a healthy client doing echo round trips meanwhile:
                       queen peak RSS (< 300 MB), and whether the healthy client was served
* ``slow-subscriber``  a SUB socket that never reads while a client broadcasts 64 KB
                       steadily: queen peak RSS (< 300 MB)
* ``heartbeats``       1,000 real Foragers in helper processes: queen CPU (< 10 % of a core)
* ``restart``          kill -9 a queen whose journal holds 100,000 finished tasks, restart
                       it: spawn→ready (< 2 s), RSS beside a fresh queen's (< +30 MB)
* ``wal``              the journal's ``-wal`` file during a 100,000-task run: its max size
* ``backpressure``     one client submitting 100,000 tasks as fast as it can at default
                       queen settings: failures by error code (target 0)

``--quick`` shrinks the counts about 10x (a smoke run). Progress goes to stderr.
Only 127.0.0.1 is used; every process started is stopped by PID, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshant.apps import _procs

MB = 1024 * 1024
LOCAL = "tcp://127.0.0.1:0"
NOBODY = "faults.nobody-serves-this"
T0 = time.monotonic()


# -- sizes -----------------------------------------------------------------------------------

@dataclass
class Sizes:
    queue_tasks: int = 100_000
    flood_broadcasts: int = 20_000
    flood_size: int = 64 * 1024
    slow_rate: float = 2_000.0
    slow_seconds: float = 10.0
    slow_size: int = 64 * 1024
    hb_foragers: int = 1_000
    hb_procs: int = 4
    hb_seconds: float = 20.0
    restart_tasks: int = 100_000
    wal_tasks: int = 100_000
    bp_tasks: int = 100_000
    window: int = 500

    @classmethod
    def quick(cls) -> Sizes:
        return cls(queue_tasks=10_000, flood_broadcasts=2_000, slow_seconds=2.0,
                   hb_foragers=100, hb_procs=2, hb_seconds=4.0, restart_tasks=10_000,
                   wal_tasks=10_000, bp_tasks=10_000)


# -- output ----------------------------------------------------------------------------------

def progress(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {text}", file=sys.stderr, flush=True)


@dataclass
class Figure:
    scenario: str
    name: str
    value: Any
    unit: str = ""
    target: str = ""
    ok: bool | None = None

    def line(self) -> str:
        v = self.value
        if isinstance(v, float):
            v = f"{v:,.1f}" if abs(v) >= 10 else f"{v:,.3g}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        verdict = {True: "ok", False: "MISSED", None: ""}[self.ok]
        tgt = f"target {self.target}" if self.target else ""
        return f"{self.scenario:16} {self.name:44} {v!s:>12} {self.unit:8} {tgt:22} {verdict}"

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "target": self.target, "ok": self.ok}


class Report:
    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.figures: list[Figure] = []
        self.notes: list[str] = []

    def fig(self, name: str, value: Any, unit: str = "", target: str = "",
            ok: bool | None = None) -> None:
        f = Figure(self.scenario, name, value, unit, target, ok)
        self.figures.append(f)
        print(f.line(), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"{self.scenario:16} note: {text}", flush=True)


# -- processes -------------------------------------------------------------------------------

_LIVE: list[subprocess.Popen[str]] = []  # everything started and not yet stopped


class Proc:
    """A subprocess whose stderr is drained in a thread (a queen that logs a lot must
    never block on a full pipe); its last lines are kept for error messages."""

    def __init__(self, popen: subprocess.Popen[str], what: str) -> None:
        self.p = popen
        self.what = what
        self.pid = popen.pid
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.stderr_lines = 0
        _LIVE.append(popen)
        self._drain: threading.Thread | None = None

    def ready(self, timeout: float) -> dict[str, Any]:
        info = _procs.read_json_line(self.p, timeout)
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        return info

    def _read_stderr(self) -> None:
        try:
            for line in self.p.stderr:  # type: ignore[union-attr]
                self.stderr_lines += 1
                self.tail.append(line.rstrip())
        except (ValueError, OSError):
            pass

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        try:
            _procs.stop([self.p], timeout)
        finally:
            if self.p.stdin is not None:
                try:
                    self.p.stdin.close()
                except OSError:
                    pass
            if self.p in _LIVE:
                _LIVE.remove(self.p)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.p.wait(10)


def spawn_meshant(args: list[str], what: str) -> Proc:
    return Proc(_procs.spawn(args), what)


def spawn_helper(args: list[str], what: str) -> Proc:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.faults", "--helper", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         stdin=subprocess.PIPE)
    return Proc(p, what)


def stop_all(procs: list[Proc]) -> None:
    for pr in reversed(procs):
        try:
            pr.stop()
        except Exception as e:  # keep stopping the others
            progress(f"could not stop {pr.what} (pid {pr.pid}): {e}")


class QueenProc(Proc):
    router = ""
    pub = ""
    ready_seconds = 0.0


def start_queen(extra: list[str], journal: str = ":memory:", timeout: float = 60.0,
                what: str = "queen") -> QueenProc:
    args = ["queen", "--bind", LOCAL, "--pub", LOCAL, "--json", "--journal", journal, *extra]
    t = time.monotonic()
    q = QueenProc(_procs.spawn(args), what)
    try:
        info = q.ready(timeout)
    except BaseException:
        q.stop()
        raise
    q.ready_seconds = time.monotonic() - t
    q.router, q.pub = info["router"], info["pub"]
    return q



def _boot(procs: list[Any], path: str, what: str, timeout: float) -> tuple[Any, float]:
    """Start a queen on ``path``; returns it and the seconds from spawn to its first
    status() answer (its memory is read a second later, once it has settled)."""
    t = time.monotonic()
    q = start_queen([], path, timeout=timeout, what=what)
    procs.append(q)
    c = client(q.router, timeout=timeout)
    try:
        c.status(timeout=timeout)
        seconds = time.monotonic() - t
    finally:
        c.close()
    time.sleep(1.0)
    return q, seconds

def start_echo_foragers(q: QueenProc, n: int, procs: list[Proc]) -> None:
    fs = [spawn_meshant(["forager", "--queen", q.router, "--json"], "echo forager")
          for _ in range(n)]
    procs.extend(fs)
    for f in fs:
        f.ready(30)


# -- /proc -----------------------------------------------------------------------------------

def mem(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) / 1024
    return out


def rss(pid: int) -> float:
    return mem(pid)["VmRSS"]


def hwm(pid: int) -> float:
    return mem(pid)["VmHWM"]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """Samples ``fn()`` every ``every`` seconds in a thread; keeps the max and the series."""

    def __init__(self, fn: Callable[[], float | None], every: float = 0.1) -> None:
        self.fn = fn
        self.every = every
        self.max = 0.0
        self.series: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def sample(self) -> None:
        try:
            v = self.fn()
        except (OSError, ValueError, KeyError):
            return
        if v is not None:
            self.max = max(self.max, v)
            self.series.append((round(time.monotonic() - self._t0, 2), round(v, 2)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)


def client(router: str, threaded: bool = False, timeout: float = 15.0) -> Any:
    from meshant import Client

    return Client(router, threaded=threaded, timeout=timeout)


def error_code(e: BaseException) -> str:
    return str(getattr(e, "code", None) or type(e).__name__)


def wait_futures(futs: list[Any], timeout: float, label: str,
                 stall: float = 30.0) -> collections.Counter[str]:
    """Wait (bounded) for every future; count outcomes: 'ok' or the error code. After
    ``stall`` seconds without an answer, whatever is still pending counts as 'no answer'."""
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 5
    gave_up = False
    for i, fut in enumerate(futs):
        wait = 0.0 if gave_up else max(0.0, min(stall, deadline - time.monotonic()))
        try:
            fut.result(wait)
            counts["ok"] += 1
        except (TimeoutError, concurrent.futures.TimeoutError):
            counts["no answer"] += 1
            if not gave_up:
                gave_up = True
                progress(f"{label}: no answer for {wait:.0f} s; counting the rest")
        except Exception as e:
            counts[error_code(e)] += 1
        if time.monotonic() > next_note:
            next_note = time.monotonic() + 5
            progress(f"{label}: {i + 1:,}/{len(futs):,} answered {dict(counts)}")
    return counts


def run_pipelined(c: Any, n: int, window: int, label: str, capability: str = "echo",
                  timeout: float = 120.0) -> collections.Counter[str]:
    """n tiny tasks through a direct client with ``window`` in flight."""
    counts: collections.Counter[str] = collections.Counter()
    inflight: collections.deque[Any] = collections.deque()
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 5
    sent = 0
    while sent < n or inflight:
        while sent < n and len(inflight) < window:
            inflight.append(c.submit(capability, sent))
            sent += 1
        fut = inflight.popleft()
        try:
            fut.result(max(0.0, deadline - time.monotonic()))
            counts["ok"] += 1
        except (TimeoutError, concurrent.futures.TimeoutError):
            counts["no answer"] += 1
            if time.monotonic() > deadline:
                counts["no answer"] += len(inflight) + n - sent
                break
        except Exception as e:
            counts[error_code(e)] += 1
        if time.monotonic() > next_note:
            next_note = time.monotonic() + 5
            progress(f"{label}: {sum(counts.values()):,}/{n:,} done {dict(counts)}")
    return counts


# -- scenarios -------------------------------------------------------------------------------

def sc_queue(z: Sizes, r: Report, tmp: str) -> None:
    n = z.queue_tasks
    raised = ["--max-queued", str(max(200_000, 2 * n)), "--submit-rate", "1000000"]
    r.note(f"queen started with {' '.join(raised)}: the default --submit-rate (10000/s) "
           "would refuse part of the load, and the default --max-queued (100000) leaves no "
           "headroom")
    for label, journal in ((":memory:", ":memory:"), ("file", os.path.join(tmp, "queue.db"))):
        procs: list[Proc] = []
        try:
            q = start_queen(raised, journal)
            procs.append(q)
            base = rss(q.pid)
            c = client(q.router)
            try:
                t = time.monotonic()
                futs = []
                chunk = 2_000
                for i in range(n):
                    futs.append(c.submit(NOBODY, {"i": i}, wait=3600.0))
                    if (i + 1) % chunk == 0:
                        c.status(timeout=60)  # a round trip: everything before it arrived
                        if (i + 1) % (chunk * 10) == 0:
                            progress(f"queue ({label}): {i + 1:,}/{n:,} submitted, queen "
                                     f"RSS {rss(q.pid):.0f} MB")
                st = c.status(timeout=60)
                secs = time.monotonic() - t
                failed = sum(1 for f in futs if f.done())
                time.sleep(1.0)  # let a journal write / checkpoint settle
                m = mem(q.pid)
            finally:
                c.close()
            r.fig(f"journal {label}: queued per status()", st.get("queued"), "tasks",
                  f"{n:,}", st.get("queued") == n)
            if failed:
                r.note(f"journal {label}: {failed} submissions failed at once")
            r.fig(f"journal {label}: queen RSS, {n:,} queued", round(m["VmRSS"], 1), "MB",
                  "< 200 MB", m["VmRSS"] < 200)
            r.fig(f"journal {label}: queen peak RSS", round(m["VmHWM"], 1), "MB")
            r.fig(f"journal {label}: queen RSS when idle (before)", round(base, 1), "MB")
            r.fig(f"journal {label}: submit+ack rate", round(n / secs), "tasks/s")
            if label == "file":
                size = sum(os.path.getsize(journal + s) for s in ("", "-wal")
                           if os.path.exists(journal + s))
                r.fig("journal file: db+wal size", round(size / MB, 1), "MB")
        finally:
            stop_all(procs)


def _healthy_loop(router: str, stop: threading.Event, out: dict[str, Any]) -> None:
    lat: list[float] = []
    fails: collections.Counter[str] = collections.Counter()
    gaps = 0.0
    last = time.monotonic()
    try:
        c = client(router)
    except Exception as e:
        out["error"] = f"healthy client could not connect: {e}"
        return
    try:
        while not stop.is_set():
            t = time.monotonic()
            try:
                c.run("echo", {"t": t}, result_timeout=5.0)
                lat.append((time.monotonic() - t) * 1000)
                now = time.monotonic()
                gaps = max(gaps, now - last)
                last = now
            except Exception as e:
                fails[error_code(e)] += 1
            time.sleep(0.005)
    finally:
        try:
            c.close()
        except Exception:
            pass
    lat.sort()
    out["answers"] = len(lat)
    out["failures"] = dict(fails)
    out["max_gap_s"] = round(max(gaps, time.monotonic() - last), 3)
    if lat:
        out["p50_ms"] = round(lat[len(lat) // 2], 2)
        out["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2)
        out["max_ms"] = round(lat[-1], 2)


def sc_flood(z: Sizes, r: Report, tmp: str) -> None:
    n, size = z.flood_broadcasts, z.flood_size
    procs: list[Proc] = []
    stop = threading.Event()
    healthy: dict[str, Any] = {}
    th: threading.Thread | None = None
    try:
        q = start_queen([])
        procs.append(q)
        start_echo_foragers(q, 1, procs)
        sub = spawn_helper(["subscriber", q.router], "subscriber")
        procs.append(sub)
        sub.ready(30)
        time.sleep(0.5)  # let its SUB subscription reach the queen's PUB
        sub.signal(signal.SIGSTOP)
        r.note(f"subscriber pid {sub.pid} SIGSTOPped; queen at default settings, "
               "journal :memory:")
        th = threading.Thread(target=_healthy_loop, args=(q.router, stop, healthy), daemon=True)
        th.start()
        time.sleep(1.0)
        c = client(q.router)
        try:
            data = os.urandom(size)
            with Sampler(lambda: hwm(q.pid), 0.1) as s:
                t = time.monotonic()
                for i in range(n):
                    c.broadcast("flood.data", data)
                    if (i + 1) % 2000 == 0:
                        progress(f"flood: {i + 1:,}/{n:,} sent, queen RSS {rss(q.pid):.0f} MB")
                sent_s = time.monotonic() - t
                try:
                    c.status(timeout=120)  # the queen has taken every broadcast
                    synced = True
                except Exception as e:
                    synced = False
                    r.note(f"status() after the flood failed: {e}")
                took = time.monotonic() - t
                time.sleep(2.0)
        finally:
            c.close()
        stop.set()
        th.join(30)
        m = mem(q.pid)
        r.fig(f"{n:,} x {size // 1024} KB broadcasts sent in", round(sent_s, 2), "s")
        if synced:
            r.fig("queen had them all after", round(took, 2), "s")
        r.fig("queen peak RSS (VmHWM)", round(max(s.max, m["VmHWM"]), 1), "MB", "< 300 MB",
              max(s.max, m["VmHWM"]) < 300)
        r.fig("queen RSS after the flood", round(m["VmRSS"], 1), "MB")
        if "error" in healthy:
            r.note(healthy["error"])
        answers = healthy.get("answers", 0)
        fails = healthy.get("failures", {})
        r.fig("healthy client: echo answers", answers, "", "> 0, no failures",
              answers > 0 and not fails)
        r.fig("healthy client: failures", sum(fails.values()), "", "0", not fails)
        if fails:
            r.note(f"healthy client failures by code: {fails}")
        for k in ("p50_ms", "p99_ms", "max_ms"):
            if k in healthy:
                r.fig(f"healthy client: echo latency {k[:-3]}", healthy[k], "ms")
        if "max_gap_s" in healthy:
            r.fig("healthy client: longest gap between answers", healthy["max_gap_s"], "s")
        r.fig("queen alive after", q.alive(), "", "True", q.alive())
    finally:
        stop.set()
        if th is not None:
            th.join(10)
        stop_all(procs)


def sc_slow_subscriber(z: Sizes, r: Report, tmp: str) -> None:
    import zmq

    procs: list[Proc] = []
    ctx = zmq.Context()
    sub = None
    try:
        q = start_queen([])
        procs.append(q)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(q.pub)  # connected, subscribed, never read
        time.sleep(0.5)
        c = client(q.router)
        try:
            data = os.urandom(z.slow_size)
            n = int(z.slow_rate * z.slow_seconds)
            sent = 0
            with Sampler(lambda: hwm(q.pid), 0.1) as s:
                t = time.monotonic()
                next_note = t + 2
                while sent < n:
                    due = min(n, int((time.monotonic() - t) * z.slow_rate) + 1)
                    while sent < due:
                        c.broadcast("steady.data", data)
                        sent += 1
                    if time.monotonic() > next_note:
                        next_note += 2
                        progress(f"slow-subscriber: {sent:,}/{n:,} sent, queen RSS "
                                 f"{rss(q.pid):.0f} MB")
                    time.sleep(0.002)
                secs = time.monotonic() - t
                try:
                    c.status(timeout=120)
                except Exception as e:
                    r.note(f"status() after the broadcasts failed: {e}")
                time.sleep(2.0)
        finally:
            c.close()
        m = mem(q.pid)
        peak = max(s.max, m["VmHWM"])
        r.note("the subscriber is a raw SUB socket (subscribed to everything) never read; "
               "queen at default settings (--pub-hwm derived from --pub-buffer)")
        r.fig(f"sent {sent:,} x {z.slow_size // 1024} KB at", round(sent / secs), "/s")
        r.fig("queen peak RSS (VmHWM)", round(peak, 1), "MB", "< 300 MB", peak < 300)
        r.fig("queen RSS at the end", round(m["VmRSS"], 1), "MB")
    finally:
        if sub is not None:
            sub.close(0)
        ctx.term()
        stop_all(procs)


def sc_heartbeats(z: Sizes, r: Report, tmp: str) -> None:
    procs: list[Proc] = []
    try:
        q = start_queen([])
        procs.append(q)
        per = [z.hb_foragers // z.hb_procs + (1 if i < z.hb_foragers % z.hb_procs else 0)
               for i in range(z.hb_procs)]
        t = time.monotonic()
        helpers = [spawn_helper(["foragers", q.router, str(k)], f"foragers x{k}") for k in per]
        procs.extend(helpers)
        started = 0
        for h in helpers:
            info = h.ready(240)
            started += info.get("started", 0)
            if info.get("failed"):
                r.note(f"helper {h.pid}: {info['failed']} foragers failed to start: "
                       f"{info.get('error')}")
        join_s = time.monotonic() - t
        c = client(q.router)
        try:
            deadline = time.monotonic() + 60
            while True:
                registered = len(c.status(timeout=30).get("foragers", []))
                if registered >= z.hb_foragers or time.monotonic() > deadline:
                    break
                time.sleep(1)
        finally:
            c.close()
        r.note(f"{z.hb_foragers:,} real Forager objects (default heartbeat settings: a DEALER "
               f"and a SUB each) in {z.hb_procs} helper processes; queen journal :memory:")
        r.fig("foragers registered per status()", registered, "", f"{z.hb_foragers:,}",
              registered == z.hb_foragers)
        r.fig("all started and welcomed in", round(join_s, 1), "s")
        time.sleep(3.0)  # past the joining burst
        c0, w0 = cpu_seconds(q.pid), time.monotonic()
        helper_c0 = sum(cpu_seconds(h.pid) for h in helpers)
        progress(f"heartbeats: measuring the queen's CPU for {z.hb_seconds:g} s")
        time.sleep(z.hb_seconds)
        used, wall = cpu_seconds(q.pid) - c0, time.monotonic() - w0
        helper_used = sum(cpu_seconds(h.pid) for h in helpers) - helper_c0
        pct = used / wall * 100
        r.fig(f"queen CPU, {registered:,} idle foragers", round(pct, 2), "% core", "< 10 %",
              pct < 10)
        r.fig("queen CPU per forager per second", round(used / wall / max(1, registered) * 1e6,
                                                        1), "us")
        r.fig("helper processes' CPU (all foragers)", round(helper_used / wall * 100, 1),
              "% core")
        r.fig("queen RSS with them", round(rss(q.pid), 1), "MB")
        for h in helpers:
            if not h.alive():
                r.note(f"helper {h.pid} died: {' | '.join(h.tail)}")
    finally:
        stop_all(procs)


def _produce_journal(z: Sizes, n: int, path: str, r: Report, label: str,
                     on_sample: Sampler | None = None) -> tuple[QueenProc, list[Proc], float,
                                                                  collections.Counter[str]]:
    """A queen on a file journal and one echo forager; n tiny echo tasks pipelined
    through a direct client. Returns the queen still running."""
    procs: list[Proc] = []
    q = start_queen(["--submit-rate", "1000000", "--max-queued", str(max(200_000, n))], path)
    procs.append(q)
    try:
        start_echo_foragers(q, 1, procs)
        c = client(q.router)
        try:
            t = time.monotonic()
            counts = run_pipelined(c, n, z.window, label, timeout=max(120.0, n / 200))
            secs = time.monotonic() - t
        finally:
            c.close()
    except BaseException:
        stop_all(procs)
        raise
    return q, procs, secs, counts


def _wal_size(path: str) -> float | None:
    try:
        return os.path.getsize(path + "-wal") / MB
    except OSError:
        return 0.0


def sc_wal(z: Sizes, r: Report, tmp: str) -> None:
    n = z.wal_tasks
    path = os.path.join(tmp, "wal.db")
    procs: list[Proc] = []
    r.note("queen started with --submit-rate 1000000 (so the run is not rate-limited), one "
           f"echo forager, a direct client with {z.window} in flight")
    try:
        with Sampler(lambda: _wal_size(path), 0.1) as s:
            q, procs, secs, counts = _produce_journal(z, n, path, r, "wal")
            during = s.max
            time.sleep(5.0)  # idle: does a checkpoint shrink it?
            s.sample()
        idle = _wal_size(path) or 0.0
        r.fig(f"{n:,} echo tasks", dict(counts), "", f"{n:,} ok", counts.get("ok") == n)
        r.fig("throughput", round(n / secs), "tasks/s")
        r.fig("-wal file max size during the run", round(during, 1), "MB")
        r.fig("-wal file size 5 s after the run (idle)", round(idle, 1), "MB")
        r.fig("db file size", round(os.path.getsize(path) / MB, 1), "MB")
        r.fig("queen RSS after the run", round(rss(q.pid), 1), "MB")
        stop_all(procs)
        procs = []
        r.fig("-wal file size after a clean stop", round(_wal_size(path) or 0.0, 1), "MB")
        series = s.series[:: max(1, len(s.series) // 12)]
        r.note("-wal MB over time (s, MB): " + ", ".join(f"{a:g}:{b:g}" for a, b in series))
    finally:
        stop_all(procs)


def _count_finished(path: str) -> int | None:
    """Finished tasks in a journal, read-only (best effort: the schema is meshant's)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT count(*) FROM tasks WHERE final IS NOT NULL")
                       .fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return None


def sc_restart(z: Sizes, r: Report, tmp: str) -> None:
    n = z.restart_tasks
    path = os.path.join(tmp, "restart.db")
    procs: list[Proc] = []
    try:
        q, procs, _, counts = _produce_journal(z, n, path, r, "restart: filling the journal")
        r.fig(f"journal filled by a real run of {n:,} echo tasks", dict(counts), "",
              f"{n:,} ok", counts.get("ok") == n)
        time.sleep(1.5)  # the last results journaled
        before = rss(q.pid)
        q.kill9()
        _LIVE.remove(q.p) if q.p in _LIVE else None
        procs.remove(q)
        finished = _count_finished(path)
        if finished is not None:
            r.fig("finished tasks in the journal", finished, "tasks", f"{n:,}", finished >= n)
        size = sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))
        r.fig("journal size (db + wal) at the kill", round(size / MB, 1), "MB")
        progress("restart: queen killed with SIGKILL; restarting on its journal")
        q2, first_status = _boot(procs, path, "restarted queen", 120)
        ready = q2.ready_seconds
        m2 = mem(q2.pid)
        stop_all([q2])
        procs.remove(q2)
        q3, fresh_status = _boot(procs, os.path.join(tmp, "fresh.db"), "fresh queen", 30)
        m3 = mem(q3.pid)
        r.fig("restart: spawn to ready line", round(ready, 2), "s", "< 2 s", ready < 2)
        r.fig("restart: spawn to first status() answer", round(first_status, 2), "s")
        r.fig("restarted queen RSS", round(m2["VmRSS"], 1), "MB")
        r.fig("restarted queen peak RSS", round(m2["VmHWM"], 1), "MB")
        r.fig("fresh queen RSS (empty journal)", round(m3["VmRSS"], 1), "MB")
        d = m2["VmRSS"] - m3["VmRSS"]
        r.fig("restarted minus fresh RSS", round(d, 1), "MB", "< 30 MB", d < 30)
        r.fig("fresh queen: spawn to ready / to status()",
              f"{q3.ready_seconds:.2f} / {fresh_status:.2f}", "s")
        r.fig("the killed queen's RSS before the kill", round(before, 1), "MB")
    finally:
        stop_all(procs)


def sc_backpressure(z: Sizes, r: Report, tmp: str) -> None:
    n = z.bp_tasks
    r.note("queen at default settings (default --submit-rate) but for the journal; 2 echo "
           "foragers; one client calling submit() for every task at once, then waiting")
    variants = (("default file journal, threaded client", os.path.join(tmp, "bp.db"), True),
                ("journal :memory:, threaded client", ":memory:", True),
                ("journal :memory:, direct client", ":memory:", False))
    for label, journal, threaded in variants:
        procs: list[Proc] = []
        try:
            q = start_queen([], journal)
            procs.append(q)
            start_echo_foragers(q, 2, procs)
            c = client(q.router, threaded=threaded)
            try:
                t = time.monotonic()
                futs = [c.submit("echo", i) for i in range(n)]
                submit_s = time.monotonic() - t
                counts = wait_futures(futs, max(120.0, n / 250), f"backpressure ({label})")
                secs = time.monotonic() - t
                try:
                    counters = c.status(timeout=30).get("counters", {})
                except Exception as e:
                    counters = {}
                    r.note(f"{label}: status() failed: {e}")
            finally:
                c.close()
            failures = n - counts.get("ok", 0)
            r.fig(f"{label}: failures of {n:,}", failures, "tasks", "0", failures == 0)
            for code, k in sorted(counts.items(), key=lambda kv: -kv[1]):
                if code != "ok":
                    r.fig(f"{label}:   {code!r}", k, f"({100 * k / n:.1f}%)")
            r.fig(f"{label}: submit() loop / all answered", f"{submit_s:.1f} / {secs:.1f}", "s")
            if "rate_limited" in counters:
                r.fig(f"{label}: queen counter rate_limited", counters["rate_limited"], "")
        finally:
            stop_all(procs)


SCENARIOS: dict[str, Callable[[Sizes, Report, str], None]] = {
    "queue": sc_queue,
    "flood": sc_flood,
    "slow-subscriber": sc_slow_subscriber,
    "heartbeats": sc_heartbeats,
    "restart": sc_restart,
    "wal": sc_wal,
    "backpressure": sc_backpressure,
}


# -- helper processes ------------------------------------------------------------------------

def _wait_for_stop() -> None:
    """Until SIGTERM/SIGINT, or stdin closes (the parent died)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def watch_stdin() -> None:
        try:
            sys.stdin.read()
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):
        pass


def helper_main(argv: list[str]) -> None:
    from meshant import Forager

    kind, router = argv[0], argv[1]
    if kind == "subscriber":
        heard = [0]
        f = Forager(router, name=f"faults-sub-{os.getpid()}")

        @f.task("faults.noop")
        def noop(payload: Any) -> Any:
            return payload

        @f.on("")
        def on_any(topic: str, data: Any) -> None:
            heard[0] += 1

        f.start(30)
        print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
        try:
            _wait_for_stop()
        finally:
            f.stop()
            print(json.dumps({"event": "heard", "count": heard[0]}), flush=True)
        return
    if kind == "foragers":
        k = int(argv[2])
        fs = []
        failed = 0
        error = ""
        for i in range(k):
            f = Forager(router, name=f"faults-hb-{os.getpid()}-{i}")
            f.add_handler("faults.noop", lambda payload: payload)
            try:
                fs.append(f.start(30))
            except Exception as e:
                failed += 1
                error = f"{type(e).__name__}: {e}"
        print(json.dumps({"event": "ready", "started": len(fs), "failed": failed,
                          "error": error}), flush=True)
        try:
            _wait_for_stop()
        finally:
            for f in fs:
                try:
                    f.stop(1.0)
                except Exception:
                    pass
        return
    raise SystemExit(f"unknown helper {kind!r}")


# -- main ------------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    import msgpack
    import zmq

    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "msgpack": ".".join(map(str, msgpack.version)), "platform": platform.platform()}


def run(names: list[str], z: Sizes, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    t_all = time.monotonic()
    for name in names:
        r = Report(name)
        tmp = tempfile.mkdtemp(prefix=f"meshant-faults-{name}-")
        t = time.monotonic()
        progress(f"scenario {name}: starting")
        err = None
        try:
            SCENARIOS[name](z, r, tmp)
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            print(f"{name:16} ERROR {err}", flush=True)
            traceback.print_exc(file=sys.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        secs = round(time.monotonic() - t, 1)
        progress(f"scenario {name}: {'failed' if err else 'done'} in {secs} s")
        results[name] = {"figures": {f.name.strip(): f.as_dict() for f in r.figures},
                         "notes": r.notes, "error": err, "seconds": secs}
    return {"machine": machine(), "quick": quick, "sizes": z.__dict__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.monotonic() - t_all, 1), "scenarios": results}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--helper"]:
        helper_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.faults",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", "-s", action="append", choices=list(SCENARIOS),
                    metavar="NAME", help=f"run only these (repeatable): {', '.join(SCENARIOS)}")
    ap.add_argument("--quick", action="store_true", help="counts ~10x smaller (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure as JSON here")
    args = ap.parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    z = Sizes.quick() if args.quick else Sizes()

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        report = run(names, z, args.quick)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        for p in list(_LIVE):  # anything a scenario could not stop itself
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            _procs.stop([p])
            if p.stdin is not None:
                p.stdin.close()
            _LIVE.remove(p)
    print(f"({report['seconds']} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")
    return 1 if any(v["error"] for v in report["scenarios"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
