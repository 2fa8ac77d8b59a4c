"""The benchmark suite's smoke test: it runs and its output has the promised shape.

Timing is never asserted: only that figures exist, are positive, and come with raw pyzmq's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here starts subprocesses

ROOT = Path(__file__).resolve().parent.parent


def test_meshant_bench_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    csv = tmp_path / "bench.csv"
    r = subprocess.run([sys.executable, "-m", "meshant", "bench", "--quick",
                        "-s", "roundtrip", "-s", "pipelined", "-s", "payload-1MB",
                        "-s", "inproc", "--json", str(out), "--csv", str(csv)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "raw pyzmq" in r.stdout and "ratio" in r.stdout
    report = json.loads(out.read_text())
    assert report["machine"]["cpus"] >= 1 and report["machine"]["libzmq"]
    rows = report["rows"]
    metrics = {(row["scenario"], row["metric"]) for row in rows}
    assert ("round trip, tcp", "p50") in metrics and ("round trip, tcp", "p99.9") in metrics
    assert any(m == "throughput" for _, m in metrics)
    for row in rows:
        assert row["meshant"] > 0 and row["raw"] > 0 and row["ratio"] > 0
    assert csv.read_text().splitlines()[0] == "scenario,metric,unit,meshant,raw,ratio"


def test_bench_list_and_unknown_scenario() -> None:
    r = subprocess.run([sys.executable, "-m", "meshant", "bench", "--list"],
                       capture_output=True, text=True, timeout=60)
    assert "roundtrip" in r.stdout and "payload-1MB" in r.stdout
    r = subprocess.run([sys.executable, "-m", "meshant", "bench", "-s", "nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown scenario" in r.stderr


def test_codec_benchmark_runs() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "codec_bench.py"),
                        "--seconds", "0.05", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["message"] for row in rows} == {"task.assign", "task.result"}
    assert all(row["ratio"] > 0 for row in rows)


def test_zmqio_benchmark_runs() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zmqio_bench.py"),
                        "--rounds", "2", "--batch", "50", "--json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(row["transport"], row["op"]) for row in rows} == {
        (t, op) for t in ("inproc", "ipc") for op in ("recv", "send")}
    assert all(row["us_per_msg"] > 0 for row in rows)


def test_roundtrip_benchmark_script_runs() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "roundtrip.py"), "--quick",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["rows"]) == 11


def test_heartbeat_scenario_runs_real_foragers() -> None:
    from meshant.apps.bench import Sizes, run_heartbeat_cost

    (row,) = run_heartbeat_cost(Sizes.quick(), peers=(3,))
    assert row.metric == "queen CPU" and row.meshant >= 0 and row.raw is None
    assert row.extra["foragers"].startswith("real Forager objects")


def test_bench_quick_is_quick_and_shows_units() -> None:
    # Issue #24: `bench --quick` took 87 s on two busy cores; its help promises seconds.
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "meshant", "bench", "--quick"],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 15, f"bench --quick took {took:.1f} s"
    header, *rows = [x for x in r.stdout.splitlines() if x.startswith(("scenario", "round",
                                                                         "pipelined"))]
    assert header.split()[:3] == ["scenario", "metric", "unit"]
    assert any(" µs " in x for x in rows) and any(" tasks/s " in x for x in rows)


def test_streaming_scenarios_and_script_run() -> None:
    # #26: partials from 10 tasks to 10 clients through one queen, with and without a
    # progress report after each, beside raw's relay; every partial is counted (the
    # scenario raises if one is missing).
    r = subprocess.run([sys.executable, "-m", "meshant", "bench", "--quick", "-s", "streaming",
                        "-s", "streaming-progress", "--json", "-"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["unit"] for row in rows] == ["partials/s", "partials/s"]
    assert "progress" in rows[1]["scenario"] and "progress" not in rows[0]["scenario"]
    for row in rows:
        assert row["meshant"] > 0 and row["raw"] > 0 and row["ratio"] > 0
    s = subprocess.run([sys.executable, "-m", "benchmarks.streaming", "--rounds", "1",
                        "--tasks", "3", "--partials", "200", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    out = json.loads(s.stdout)
    assert out["meshant_partials_per_s"] > 0 and out["raw_msgs_per_s"] > 0
