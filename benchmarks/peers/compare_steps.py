#!/usr/bin/env python3
"""Durable steps beside DBOS Transact: meshant's 10-step task against a DBOS workflow of
10 trivial steps, in the same run, on the same machine.

    python -m venv .venv-dbos && .venv-dbos/bin/pip install dbos     # the peer, apart
    python -m benchmarks.peers.compare_steps [--runs 300] [--dbos-python PATH] [--json]

meshant: a CLI queen on a file journal (SQLite) and a CLI forager serving
benchmarks/durable_soak_app.py (``steps10``: 10 ``ctx.step`` calls of a trivial function;
``plain``: no step); a client's sequential ``c.run`` (p50/p99, tasks/s) and pipelined
throughput (``--runs`` submissions, then every result). DBOS: benchmarks/peers/
dbos_steps.py, run with the other venv's python (skipped with a note if it has no dbos).
Each side twice: without an fsync per commit (meshant ``--durability process``, its
default; DBOS's SQLite in WAL with synchronous=NORMAL) and with one (meshant ``--durability
power``; DBOS's SQLite defaults, synchronous=FULL). Ratios are meshant / DBOS.

Only 127.0.0.1; every process started is stopped by PID. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.durable_soak import ROOT, Procs, write_json
from meshant import Client

APP = "benchmarks.durable_soak_app:forager"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def measure_meshant(runs: int, durability: str, slots: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="meshant-steps-") as d:
        tmp = Path(d)
        procs = Procs(tmp, {"MESHANT_SOAK_LOG": os.devnull})
        try:
            _, info = procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                                  "tcp://127.0.0.1:0", "--json", "--journal",
                                  str(tmp / "queen.db"), "--durability", durability)
            ep = info["router"]
            procs.start("forager", "--queen", ep, "--slots", str(slots), "--json",
                        "--app", APP)
            out: dict[str, Any] = {"peer": "meshant", "durability": durability,
                                   "runs": runs}
            with Client(ep, timeout=30) as c:
                for label, cap, extra in (("10_steps", "steps10", 45),
                                          ("1_step", "plain", 45)):
                    for i in range(20):  # warm-up
                        c.run(cap, i, timeout=30)
                    lat = []
                    t0 = time.perf_counter()
                    for i in range(runs):
                        t = time.perf_counter()
                        r = c.run(cap, i, timeout=30)
                        lat.append(time.perf_counter() - t)
                        assert r == i + extra, r
                    seq_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    futs = [c.submit(cap, i) for i in range(runs)]
                    results = [f.result(120) for f in futs]
                    pipe_s = time.perf_counter() - t0
                    assert results == [i + extra for i in range(runs)]
                    out[label] = {"p50_ms": round(statistics.median(lat) * 1000, 3),
                                  "p99_ms": round(_pct(lat, 0.99) * 1000, 3),
                                  "sequential_per_s": round(runs / seq_s, 1),
                                  "concurrent_per_s": round(runs / pipe_s, 1)}
        finally:
            procs.close()
    out["1_step"]["what"] = "a plain task (no ctx.step)"
    return out


def measure_dbos(python: str, runs: int, sync: str) -> dict[str, Any] | str:
    script = Path(__file__).with_name("dbos_steps.py")
    try:
        r = subprocess.run([python, str(script), "--runs", str(runs), "--sqlite-sync", sync,
                            "--json"], capture_output=True, text=True, timeout=1800,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"DBOS not measured: {e}"
    if r.returncode != 0:
        return f"DBOS not measured ({python}): {r.stderr.strip()[-400:]}"
    line = [x for x in r.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)  # type: ignore[no-any-return]


def _row(name: str, r: dict[str, Any]) -> str:
    return (f"  {name:<44} p50 {r['p50_ms']:>8.2f} ms  p99 {r['p99_ms']:>8.2f} ms  "
            f"seq {r['sequential_per_s']:>7.1f}/s  concurrent {r['concurrent_per_s']:>7.1f}/s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--slots", type=int, default=16, help="the meshant forager's slots")
    ap.add_argument("--dbos-python", default=str(ROOT / ".venv-dbos" / "bin" / "python"),
                    help="a python with dbos installed")
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    pairs: list[dict[str, Any]] = []
    for durability, sync in (("process", "normal"), ("power", "default")):
        m = measure_meshant(args.runs, durability, args.slots)
        dbos = measure_dbos(args.dbos_python, args.runs, sync)
        pairs.append({"meshant": m, "dbos": dbos})
    out = {"runs": args.runs, "load_before": [round(x, 2) for x in load0],
           "load_after": [round(x, 2) for x in os.getloadavg()], "pairs": pairs}
    for pair in pairs:
        m, dbos = pair["meshant"], pair["dbos"]
        fsync = "no fsync per commit" if m["durability"] == "process" else "fsync per commit"
        print(f"{fsync}:")
        print(_row(f"meshant 10-step task (--durability {m['durability']})", m["10_steps"]))
        print(_row("meshant plain task", m["1_step"]))
        k = m["10_steps"]["p50_ms"] / max(m["1_step"]["p50_ms"], 1e-9)
        print(f"    meshant 10-step / plain: p50 x{k:.2f}, concurrent throughput "
              f"x{m['10_steps']['concurrent_per_s'] / m['1_step']['concurrent_per_s']:.2f}")
        if isinstance(dbos, str):
            print("  " + dbos)
            continue
        print(_row(f"DBOS {dbos['version']} 10-step workflow ({dbos['sqlite_sync']})",
                   dbos["10_steps"]))
        print(_row("DBOS 1-step workflow", dbos["1_step"]))
        ratios = {}
        for label in ("10_steps", "1_step"):
            a, b = m[label], dbos[label]
            ratios[label] = {
                "p50": round(a["p50_ms"] / b["p50_ms"], 3),
                "p99": round(a["p99_ms"] / b["p99_ms"], 3),
                "sequential_per_s": round(a["sequential_per_s"] / b["sequential_per_s"], 3),
                "concurrent_per_s": round(a["concurrent_per_s"] / b["concurrent_per_s"], 3)}
        pair["ratio_meshant_over_dbos"] = ratios
        r = ratios["10_steps"]
        print(f"    meshant / DBOS, 10 steps: p50 x{r['p50']}, p99 x{r['p99']}, sequential "
              f"x{r['sequential_per_s']}, concurrent x{r['concurrent_per_s']} (plain task "
              f"vs 1-step workflow: p50 x{ratios['1_step']['p50']}, concurrent "
              f"x{ratios['1_step']['concurrent_per_s']})")
    print(f"load average before {out['load_before']}, after {out['load_after']} "
          f"({os.cpu_count()} cores)")
    if args.json:
        write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
