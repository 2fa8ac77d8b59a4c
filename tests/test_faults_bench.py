"""Smoke test of benchmarks/faults.py: a cheap scenario runs and produces its figures.

No timing or threshold is asserted: those are the benchmark's figures, not test results.
"""

from __future__ import annotations

import os

import pytest

from benchmarks import faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_faults_bench_quick_scenarios(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # helpers run `python -m benchmarks.faults` from here
    sizes = faults.Sizes.quick()
    sizes.queue_tasks = 500
    sizes.hb_foragers, sizes.hb_procs, sizes.hb_seconds = 10, 1, 1.0
    report = faults.run(["queue", "heartbeats"], sizes, quick=True)
    for name in ("queue", "heartbeats"):
        sc = report["scenarios"][name]
        assert sc["error"] is None, sc["error"]
        assert sc["figures"], name
    q = report["scenarios"]["queue"]["figures"]
    assert q["journal :memory:: queued per status()"]["value"] == 500
    assert q["journal file: queen RSS, 500 queued"]["value"] > 0
    hb = report["scenarios"]["heartbeats"]["figures"]
    assert hb["foragers registered per status()"]["value"] == 10
    assert not faults._LIVE  # every process it started was stopped
