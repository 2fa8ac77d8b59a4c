"""The queen kit's §6a and §7d checks can fail: against a queen that drops questions and
never answers inbox or graph requests, exactly those checks FAIL (a kit that cannot fail
is a defect), while against meshant's own queen they pass (tests/test_conformance.py)."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from meshant import Queen
from meshant.conformance import check_queen

pytestmark = pytest.mark.slow


def _ignore(*_args: Any) -> None:
    pass


def test_new_checks_fail_a_queen_that_drops_them(ctx: zmq.Context[Any]) -> None:
    q = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", context=ctx, hb_interval=0.5).start()
    try:
        # A queen with these parts missing: questions and inbox requests go nowhere,
        # graph submissions and cancels are never answered.
        for kind in ("task.ask", "inbox", "graph.submit", "graph.cancel"):
            q.core._after[kind] = _ignore
        report = check_queen(q.endpoint, timeout=1.0)
    finally:
        q.stop()
    status = {o.id: o.status for o in report.outcomes}
    for check in ("q.questions", "q.attach", "q.inbox", "q.graphs", "q.graph-cancel"):
        assert status[check] == "FAIL", (check, report.summary())
    assert status["q.lifecycle"] == "PASS" and status["q.services"] == "PASS"
