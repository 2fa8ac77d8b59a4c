"""The heartbeat monitor with an injected clock."""

from __future__ import annotations

import pytest

from meshant.core.nodes.heartbeat import HeartbeatMonitor


def test_exactly_n_misses_boundary() -> None:
    m = HeartbeatMonitor(interval=1.0, misses=3)
    m.add("f", now=10.0)
    assert m.check(12.999) == []
    assert m.missed("f", 12.999) == 2
    assert m.check(13.0) == ["f"]  # the third whole interval without a beat
    assert not m.is_online("f")


def test_offline_reported_once_and_recovery() -> None:
    m = HeartbeatMonitor(interval=0.5, misses=2)
    m.add("a", 0.0)
    m.add("b", 0.0)
    m.beat("b", 0.9)
    assert m.check(1.0) == ["a"]
    assert m.check(1.5) == []  # a is already offline: no second report
    assert m.check(1.95) == ["b"]
    assert m.beat("a", 2.0) is True  # back online
    assert m.beat("a", 2.1) is False
    assert m.is_online("a") and not m.is_online("b")
    assert m.check(2.9) == []
    assert m.check(3.1) == ["a"]


def test_beats_keep_a_peer_online_indefinitely() -> None:
    m = HeartbeatMonitor(interval=1.0, misses=2)
    m.add("f", 0.0)
    for t in range(1, 100):
        m.beat("f", float(t))
        assert m.check(t + 1.5) == []


def test_per_peer_timeout_and_next_deadline() -> None:
    m = HeartbeatMonitor(interval=1.0, misses=5)
    m.add("slow", 0.0, timeout=50.0)
    m.add("fast", 0.0)
    assert m.next_deadline() == 5.0
    assert m.check(6.0) == ["fast"]
    assert m.next_deadline() == 50.0
    assert m.check(49.0) == [] and m.check(50.0) == ["slow"]
    assert m.next_deadline() is None


def test_unknown_peers_and_removal() -> None:
    m = HeartbeatMonitor(1.0, 1)
    assert m.beat("nobody", 1.0) is False
    m.add("x", 0.0)
    m.remove("x")
    assert m.check(100.0) == [] and "x" not in m and len(m) == 0


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        HeartbeatMonitor(0, 3)
    with pytest.raises(ValueError):
        HeartbeatMonitor(1.0, 0)
