"""Delayed tasks and concurrency limits across a failover on a real PostgreSQL journal
(#32.1, #32.2): the leader killed while a delayed task waits, the standby takes over,
the task starts no earlier than its journaled time and once; a limit holds for the new
leader too."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from meshant import Client
from meshant.storage import open_journal

from .conftest import Procs, wait_for
from .test_failover import LEASE, Pair

pytestmark = pytest.mark.slow


def test_a_delayed_task_outlives_its_leader_and_starts_on_time(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    procs.forager(pair.both, "--name", "f0", "--slots", "4")
    with Client(pair.both, queen_wait=60) as c:
        fut = c.submit("echo", "late", after=LEASE + 3.0, ack=True)
        wait_for(lambda: fut.acknowledged, what="the delayed task journaled")
        assert c.task_status(fut.task_id)["state"] == "delayed"
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        wait_for(lambda: pair.leads("qb"), timeout=LEASE + 10, what="qb to lead")
        assert fut.result(60) == "late"
    j = open_journal(pg_url, readonly=True)
    try:
        row = j.find(fut.task_id, events=True)
    finally:
        j.close()
    assert row is not None and row["not_before"] is not None
    states = [e["state"] for e in row["events"]]
    assert states.count("completed") == 1 and states[0] == "delayed", states
    released = next(e["ts"] for e in row["events"] if e["state"] == "queued")
    assert released >= row["not_before"] - 1e-3  # never before its time (one host's clock)

