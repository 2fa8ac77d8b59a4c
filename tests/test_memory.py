"""Colony memory, sans-IO: the store and replicas converge; gaps trigger a resync."""

from __future__ import annotations

import random

import pytest

from meshant.core.memory.model import RESYNC, MemoryError_, MemoryReplica, MemoryStore


def synced_replica(store: MemoryStore) -> MemoryReplica:
    r = MemoryReplica()
    assert r.load(store.snapshot()) is not RESYNC
    return r


def test_updates_in_order_converge() -> None:
    store = MemoryStore()
    replicas = [synced_replica(store) for _ in range(3)]
    rng = random.Random(1)
    updates = []
    for i in range(200):
        key = f"k{rng.randint(0, 20)}"
        if rng.random() < 0.2:
            u = store.delete(key)
            if u is None:
                continue
        else:
            u = store.set(key, {"i": i}, now=0.0)
        updates.append(u)
    for r in replicas:
        for u in updates:
            assert r.apply(u) != RESYNC
        assert r.items == store.items and r.seq == store.seq


def test_gap_triggers_resync_and_snapshot_plus_newer_updates_catch_up() -> None:
    store = MemoryStore()
    r = synced_replica(store)
    u1 = store.set("a", 1, 0.0)
    u2 = store.set("b", 2, 0.0)
    u3 = store.set("c", 3, 0.0)
    assert r.apply(u1) == [("a", 1, False)]
    assert r.apply(u3) == RESYNC  # u2 was missed
    assert not r.synced and r.resyncs == 1
    snap = store.snapshot()  # taken at seq 3
    u4 = store.set("a", 10, 0.0)
    assert r.apply(u4) == []  # buffered while resyncing
    changes = r.load(snap)
    assert changes != RESYNC
    assert r.items == {"a": 10, "b": 2, "c": 3} == store.items and r.seq == 4
    assert r.apply(u2) == []  # old news


def test_late_joiner_gets_snapshot_then_later_updates() -> None:
    store = MemoryStore()
    for i in range(10):
        store.set(f"k{i}", i, 0.0)
    late = MemoryReplica()
    u = store.set("k0", "new", 0.0)
    assert late.apply(u) == []  # not synced yet: buffered
    assert late.load(store.snapshot()) != RESYNC
    assert late.items == store.items


def test_heartbeat_seq_reveals_a_missed_last_update() -> None:
    store = MemoryStore()
    r = synced_replica(store)
    store.set("x", 1, 0.0)  # published, but this replica missed it
    assert r.behind(store.seq) is True and not r.synced
    assert r.load(store.snapshot()) != RESYNC and r.items == {"x": 1}
    assert r.behind(store.seq) is False


def test_ttl_expiry_publishes_deletions() -> None:
    store = MemoryStore()
    store.set("lease", "me", now=10.0, ttl=5.0)
    store.set("keep", 1, now=10.0)
    assert store.expire(14.9) == []
    (u,) = store.expire(15.0)
    assert u["key"] == "lease" and u["deleted"] and "lease" not in store.items
    store.set("lease", "again", now=16.0, ttl=5.0)
    store.set("lease", "forever", now=17.0)  # a later set without ttl cancels the expiry
    assert store.expire(30.0) == [] and store.items["lease"] == "forever"


def test_limits_refuse_and_change_nothing() -> None:
    store = MemoryStore(max_keys=2, max_value=100)
    store.set("a", 1, 0.0)
    store.set("b", 1, 0.0)
    with pytest.raises(MemoryError_) as e:
        store.set("c", 1, 0.0)
    assert e.value.code == "memory-full"
    with pytest.raises(MemoryError_) as e:
        store.set("a", "x" * 200, 0.0)
    assert e.value.code == "too-large"
    with pytest.raises(MemoryError_) as e:
        store.set("", 1, 0.0)
    assert e.value.code == "bad-key"
    with pytest.raises(MemoryError_) as e:
        store.set("a", {1, 2}, 0.0)
    assert e.value.code == "bad-value"
    assert store.items == {"a": 1, "b": 1} and store.seq == 2
    assert store.delete("zzz") is None and store.seq == 2
