"""The strictness the spec's "Changes" section asks of the queen core, without a socket
(tests/inmemory.py): malformed forager answers are refused and change nothing, features
not negotiated are not used, flags agree with the kind; and the kit's report logic."""

from __future__ import annotations

from typing import Any

import pytest

from meshant import protocol as p
from meshant.conformance.report import FAIL, PASS, SKIP, CheckFailed, Report, Skipped

from .inmemory import InMemoryColony, InMemoryPeer


def _task(sim: InMemoryColony, **forager: Any
          ) -> tuple[InMemoryPeer, InMemoryPeer, p.Message, dict[str, Any]]:
    f = sim.forager("f1", **forager)
    c = sim.client()
    sub = c.send("task.submit", {"capability": "echo", "payload": 1})
    (a,) = sim.assigns(f)
    return f, c, sub, a


@pytest.mark.parametrize("body", [
    {"result": 5}, {}, {"status": "meh"}, {"status": "error"},
    {"status": "error", "error": {"type": "E"}}, {"status": "error", "error": {"message": 1}},
    {"partial": True},
])
def test_a_malformed_result_is_bad_value_and_the_attempt_stays_current(
        body: dict[str, Any]) -> None:
    sim = InMemoryColony()
    f, c, sub, a = _task(sim)
    sent = f.send("task.result", body, ref=a["id"])
    err = f.one("error")
    assert err.b["code"] == "bad-value" and err.ref == sent.id and err.b["assign"] == a["id"]
    assert sim.core.scheduler.tasks[sub.id].current is not None  # nothing changed
    assert not sim.results(c)
    f.send("task.result", {"status": "ok", "result": 2}, ref=a["id"])
    assert sim.results(c)[sub.id]["result"] == 2


def test_a_malformed_progress_is_refused_and_renews_nothing() -> None:
    sim = InMemoryColony(assign_timeout=10.0)
    f, c, _sub, a = _task(sim)
    sim.advance(1.5)  # (f's heartbeats, listing the task, renew its lease meanwhile)
    lease = sim.core.scheduler.attempts[a["id"]].lease
    assert lease < sim.now + 10.0  # so a renewal now would show
    f.send("task.progress", {"fraction": 1.5}, ref=a["id"])
    assert f.one("error").b["code"] == "bad-value"
    assert sim.core.scheduler.attempts[a["id"]].lease == lease
    assert not c.take("task.progress")


def test_a_malformed_batch_item_is_refused_alone() -> None:
    sim = InMemoryColony()
    f = sim.forager("f1", slots=2)
    c = sim.client()
    subs = [c.send("task.submit", {"capability": "echo", "payload": i}) for i in range(2)]
    a1, a2 = sim.assigns(f)
    f.send("task.batch", {"results": [{"ref": a1["id"], "status": "ok", "result": 1},
                                      {"ref": a2["id"], "status": "ok", "result": 2,
                                       "partial": "yes"}]})
    err = f.one("error")
    assert err.b["code"] == "bad-type" and err.b["assign"] == a2["id"]
    results = sim.results(c)
    assert results[subs[0].id]["result"] == 1 and subs[1].id not in results


def test_progress_reaches_only_clients_that_negotiated_it() -> None:
    for features, relayed in ((["progress"], True), ([], False)):
        sim = InMemoryColony()
        f = sim.forager("f1")
        c = sim.client(features=features)
        sub = c.send("task.submit", {"capability": "echo"})
        (a,) = sim.assigns(f)
        f.send("task.progress", {"fraction": 0.5}, ref=a["id"])
        f.send("task.result", {"partial": True, "value": "x"}, ref=a["id"])
        f.send("task.result", {"status": "ok", "result": 1}, ref=a["id"])
        got = [m for m in c.inbox if m.b.get("task") == sub.id]
        kinds = [("partial" if m.b.get("partial") else m.kind) for m in got]
        assert kinds == (["task.progress", "partial", "task.result"] if relayed
                         else ["task.result"])


@pytest.mark.parametrize(("kind", "body", "feature"), [
    ("mem.sync", {"op": "snapshot"}, "mem.sync"),
    ("broadcast", {"topic": "t", "data": 1}, "broadcast"),
    ("task.batch", {"results": []}, "batch"),
])
def test_a_feature_not_negotiated_is_unsupported(kind: str, body: dict[str, Any],
                                                 feature: str) -> None:
    sim = InMemoryColony()
    c = sim.client(features=[f for f in p.negotiation.FEATURES if f != feature])
    c.send(kind, body)
    assert c.one("error").b["code"] == "unsupported"


def test_a_forager_without_progress_may_not_send_it() -> None:
    sim = InMemoryColony()
    f, _c, _sub, a = _task(sim, features=["batch"])
    f.send("task.progress", {"fraction": 0.1}, ref=a["id"])
    assert f.one("error").b["code"] == "unsupported"
    f.send("task.result", {"partial": True, "value": 1}, ref=a["id"])
    assert f.one("error").b["code"] == "unsupported"


def test_blobs_go_inline_to_a_peer_without_blobs_and_blob_frames_from_it_are_refused() -> None:
    sim = InMemoryColony()
    f = sim.forager("f1", features=["progress"])
    c = sim.client()
    data = b"x" * p.BLOB_MIN
    c.send("task.submit", {"capability": "echo", "payload": p.Blob(data)})
    (a,) = sim.assigns(f)
    assert a["payload"] == data  # bytes, inline: it did not negotiate blobs
    frames = p.binary.encode(p.Message("task.result", {"status": "ok", "result": p.Blob(data)},
                                       frm="f1", ref=a["id"]))
    assert len(frames) == 2
    sim.deliver(f.identity, frames)
    assert f.one("error").b["code"] == "unsupported"


def test_an_error_sent_to_the_queen_is_not_answered() -> None:
    sim = InMemoryColony()
    c = sim.client()
    c.send("error", {"code": "bad-value", "message": "no"})
    c.send("task.state", {"task": "t", "state": "queued"})
    assert [m.b["code"] for m in c.take()] == ["unsupported"]  # only the second


def test_the_batch_flag_is_set_on_both_batch_kinds() -> None:
    for kind, body in (("task.batch", {"results": []}), ("task.assigns", {"assigns": []})):
        f0 = p.binary.encode(p.Message(kind, body, frm="q"))[0]
        assert f0[4] == 2
    assert p.binary.encode(p.Message("task.result", {}, frm="q"))[0][4] == 0


def test_inline_blobs_copies_only_what_holds_a_blob() -> None:
    plain = {"a": [1, {"b": 2}]}
    assert p.inline_blobs(plain) is plain
    mixed = {"a": [1, p.Blob(b"z")], "c": 3}
    assert p.inline_blobs(mixed) == {"a": [1, b"z"], "c": 3}
    assert isinstance(mixed["a"][1], p.Blob)  # the original is untouched


def test_a_report_never_passes_a_check_that_raised() -> None:
    lines: list[str] = []
    r = Report("queen", "x", echo=lines.append)

    def broken() -> str:
        raise KeyError("kit bug")

    def skipped() -> str:
        raise Skipped("not served")

    def failed() -> str:
        raise CheckFailed("wrong")

    assert r.run("q.welcome", lambda: "fine")
    assert not r.run("q.refusals", broken)
    assert r.run("q.legacy", skipped)
    assert not r.run("q.batch", failed)
    assert [o.status for o in r.outcomes] == [PASS, FAIL, SKIP, FAIL]
    assert r.failed == 2 and r.to_json()["ok"] is False
    assert lines[1].startswith("FAIL §5.3") and "KeyError" in lines[1]
