"""Concurrency limits by key (#32.2): the rules (core/tasks/limits.py), the scheduler
holding over-limit tasks queued and fair between keys, the queen refusing a task that
lacks its limit's key, real foragers over loopback and the CLI."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from meshant.core.tasks.limits import Rule, parse_rule, parse_rules
from meshant.errors import BadInput, ConfigError

from .conftest import Colony, Procs, wait_for
from .inmemory import InMemoryColony
from .test_cli import meshant
from .test_scheduler import Colony as Sched

# -- the rules ----------------------------------------------------------------------------


def test_rules_as_written() -> None:
    assert parse_rule("llm=10") == Rule("llm", None, None, 10)
    assert parse_rule("llm:payload.tenant=2") == Rule("llm", "payload", "tenant", 2)
    assert parse_rule(" *:labels.region = 5 ").text == "*:labels.region=5"
    assert parse_rules(["# a comment", "", "a=1  # one"]) == [Rule("a", None, None, 1)]
    for bad, says in (("llm", "is not a limit"), ("llm=0", "1 to 1,000,000"),
                      ("llm=-3", "1 to 1,000,000"), ("llm=ten", "not a whole number"),
                      ("llm:body.tenant=2", "is not a limit")):
        with pytest.raises(ValueError, match=says):
            parse_rule(bad)


# -- the scheduler --------------------------------------------------------------------------


def _limited(*rules: str, **kw: Any) -> Sched:
    c = Sched(**kw)
    c.s.limits.configure(parse_rules(rules))
    return c


def _running(c: Sched) -> list[str]:
    return sorted(a.task.id for runs in c.s.running.values() for a in runs.values())


def _finish(c: Sched, task_id: str) -> None:
    for runs in list(c.s.running.values()):
        for att in list(runs.values()):
            if att.task.id == task_id:
                c.s.result(att, {"status": "ok", "result": None}, c.now)
                return
    raise AssertionError(f"{task_id} is not running")


def test_never_more_running_than_the_limit_and_the_rest_wait_queued() -> None:
    c = _limited("llm=2")
    c.forager("f", slots=10, tools=("llm", "echo"))
    for i in range(5):
        c.submit(f"t{i}", "llm")
    c.submit("other", "echo")
    c.step()
    assert _running(c) == ["other", "t0", "t1"]
    assert c.s.queued == 3 and c.s.depths() == {"llm": 3}
    assert "llm=2: 2 of 2 running" in (c.s.limits.why(c.s.tasks["t2"]) or "")
    _finish(c, "t0")
    c.step()
    assert _running(c) == ["other", "t1", "t2"]
    c.s.cancel("t3", c.now)  # a waiting task cancelled: nothing else moves
    _finish(c, "t1")
    _finish(c, "t2")
    c.step()
    assert _running(c) == ["other", "t4"] and c.s.queued == 0


def test_keys_are_fair_and_priorities_hold_within_a_key() -> None:
    c = _limited("llm:payload.tenant=1")
    c.forager("f", slots=3, tools=("llm",))
    # Tenant a's backlog first, then b's two tasks: b is not stuck behind a.
    for i in range(50):
        c.submit(f"a{i}", "llm", payload={"tenant": "a"})
    c.submit("b-low", "llm", payload={"tenant": "b"}, priority=90)
    c.submit("b-high", "llm", payload={"tenant": "b"}, priority=10)
    c.step()
    assert _running(c) == ["a0", "b-low"]
    _finish(c, "b-low")
    c.step()
    assert _running(c) == ["a0", "b-high"]
    _finish(c, "a0")
    c.step()
    assert _running(c) == ["a1", "b-high"]


def test_a_retry_backoff_gives_its_token_back() -> None:
    c = _limited("llm=1")
    c.forager("f", slots=2, tools=("llm",))
    c.submit("t0", "llm", retry_on=("*",))
    c.submit("t1", "llm")
    c.step()
    (att,) = [a for runs in c.s.running.values() for a in runs.values()]
    c.s.result(att, {"status": "error", "error": {"message": "busy", "type": "E"}}, c.now)
    c.step()
    assert _running(c) == ["t1"]  # t0 backs off; t1 took the token


def test_limits_over_1000_keys_never_exceed_and_all_end() -> None:
    rules = [f"llm:payload.k{j}=3" for j in range(9)] + ["llm=200"]
    c = _limited(*rules)
    c.forager("f", slots=500, tools=("llm",))
    for i in range(3000):
        c.submit(f"t{i}", "llm", payload={f"k{j}": str(i % 1000) for j in range(9)})
    done = 0
    while done < 3000:
        c.step()
        running = _running(c)
        assert len(running) <= 200
        for tid in running:
            _finish(c, tid)
            done += 1
    assert c.s.queued == 0 and not c.s.limits.taken and not c.s.limits.parked


# -- the queen core -----------------------------------------------------------------------


def test_a_task_lacking_its_limits_key_is_refused_and_nothing_journaled(
        tmp_path: Path) -> None:
    from meshant.storage.journal import Journal

    j = Journal(tmp_path / "q.db")
    sim = InMemoryColony(journal=j, journal_defer=0,
                         limits=("llm:labels.tenant=2", "llm:payload.user=1"))
    try:
        c = sim.client()
        for body, says in (({}, "needs a label 'tenant' (--label tenant=VALUE)"),
                           ({"labels": {"tenant": "a"}, "payload": 5},
                            "needs a payload map with a field 'user'"),
                           ({"concurrency": {"key": "", "max": 1}}, "'concurrency' is")):
            c.send("task.submit", {"capability": "llm", **body})
            err = c.one("error").b
            assert err["code"] == "bad-value" and says in err["message"], err
        assert j.tasks(limit=10) == []
    finally:
        j.close()


def test_status_and_task_state_say_why_a_task_waits() -> None:
    sim = InMemoryColony(limits=("llm=1",))
    f = sim.forager("f", slots=2, tools=["llm"])
    c = sim.client()
    c.send("task.submit", {"capability": "llm"})
    second = c.send("task.submit", {"capability": "llm"})
    (a,) = sim.assigns(f)
    c.send("task.status", {"task": second.id})
    st = c.one("task.state").b
    assert st["state"] == "queued" and st["held"] == \
        "waits for concurrency limit llm=1: 1 of 1 running"
    (lim,) = sim.core.status(sim.now)["limits"]
    assert lim == {"limit": "llm=1", "key": "", "running": 1, "max": 1, "waiting": 1}
    f.send("task.result", {"status": "ok", "result": 1}, ref=a["id"])
    (b,) = sim.assigns(f)
    assert b["task"] == second.id


# -- over real sockets ------------------------------------------------------------------


def test_a_tenants_share_across_foragers_over_loopback(colony: Colony) -> None:
    colony.start_queen(limits=("work:payload.tenant=2",))
    lock = threading.Lock()
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    gate = threading.Event()

    def work(x: dict[str, Any]) -> str:
        t = x["tenant"]
        with lock:
            now[t] = now.get(t, 0) + 1
            most[t] = max(most.get(t, 0), now[t])
        gate.wait(10)
        with lock:
            now[t] -= 1
        return t

    for _ in range(3):
        colony.forager({"work": work}, slots=4)
    c = colony.client()
    futs = [c.submit("work", {"tenant": t}) for t in ["a"] * 6 + ["b"] * 6]
    own = [c.submit("work", {"tenant": "c"}, concurrency=("c-key", 1)) for _ in range(3)]
    # 2 of a, 2 of b and 1 of c run; the others wait, queued, saying why.
    wait_for(lambda: sum(now.values()) == 5, what="five tasks running")
    held = [c.task_status(f.task_id).get("held") for f in futs + own]
    assert sum(1 for h in held if h) == 10
    assert any("work:payload.tenant=2 (tenant=a)" in (h or "") for h in held)
    assert any("concurrency key 'c-key'" in (h or "") for h in held)
    gate.set()
    assert sorted(f.result(timeout=20) for f in futs + own) == ["a"] * 6 + ["b"] * 6 + \
        ["c"] * 3
    assert most == {"a": 2, "b": 2, "c": 1}
    with pytest.raises(BadInput, match="concurrency is"):
        c.submit("work", {}, concurrency=("k", 0))


def test_a_bad_limit_is_a_config_error() -> None:
    from meshant import Queen

    with pytest.raises(ConfigError, match="is not a limit"):
        Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", limits=("llm:tenant=2",))


# -- the command line -------------------------------------------------------------------


@pytest.mark.slow
def test_cli_queen_limits_flag_file_and_status(procs: Procs, tmp_path: Path) -> None:
    rules = tmp_path / "limits.txt"
    rules.write_text("# per tenant\nsleep:payload.tenant=1\n")
    _, ep = procs.queen("--journal", ":memory:", "--limit", "sleep=5",
                        "--limits-file", str(rules))
    procs.forager(ep, "--slots", "4")
    r = meshant("submit", "--queen", ep, "sleep", '{"seconds": 30, "tenant": "a"}', "-n",
                "2", "--no-wait", "--json")
    assert r.returncode == 0, r.stderr
    ids = [json.loads(x)["task"] for x in r.stdout.splitlines()]
    st = wait_for(lambda: (s := json.loads(meshant("status", "--queen", ep, "--json")
                                           .stdout)) and s["running"] == 1 and s,
                  what="one task running")
    assert {"limit": "sleep:payload.tenant=1", "key": "a", "running": 1, "max": 1,
            "waiting": 1} in st["limits"]
    assert "sleep:payload.tenant=1 a 1/1 running, 1 waiting" in meshant(
        "status", "--queen", ep).stdout
    r = meshant("submit", "--queen", ep, "sleep", '{"seconds": 1}', "--no-wait")
    assert r.returncode == 1 and "needs a payload map with a field 'tenant'" in r.stderr
    r = meshant("submit", "--queen", ep, "echo", "1", "--concurrency", "k")
    assert r.returncode == 2 and "write KEY=N" in r.stderr
    for i in ids:
        meshant("cancel", "--queen", ep, i)
    bad = meshant("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                  "--journal", ":memory:", "--limit", "sleep:tenant=1", timeout=30)
    assert bad.returncode == 1 and "is not a limit" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr



def test_a_dead_letter_retried_keeps_its_limits() -> None:
    c = _limited("llm=5")
    c.forager("f", slots=2, tools=("llm",))
    c.submit("t0", "llm", concurrency=("k", 1), cost=3.0)
    c.step()
    att = next(a for runs in c.s.running.values() for a in runs.values())
    c.s.result(att, {"status": "error", "error": {"message": "no", "type": "E"}}, c.now)
    new = c.s.dlq_retry("t0", b"c", "client", c.now)
    assert new.concurrency == ("k", 1) and new.cost == 3.0


def test_the_snapshot_and_metrics_say_who_waits_at_which_limit() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from meshant.observe import Observer
    from meshant.observe.metrics import _Collector, exposition

    sim = InMemoryColony(limits=("llm:payload.tenant=1", "llm=5/s,burst=1"))
    obs = Observer()
    f = sim.forager("f", slots=4, tools=["llm"])
    c = sim.client()
    for _ in range(3):
        c.send("task.submit", {"capability": "llm", "payload": {"tenant": "a"}})
    c.send("task.submit", {"capability": "llm", "payload": {"tenant": "b"}})
    sim.assigns(f)
    s = obs.publish(sim.core, sim.now, 0.0)
    assert {"limit": "llm:payload.tenant=1", "key": "a", "running": 1, "max": 1,
            "waiting": 2} in s["limits"]
    assert s["rates"] and s["rates"][0]["limit"] == "llm=5/s,burst=1"
    reg = CollectorRegistry()
    reg.register(_Collector(lambda: s))  # type: ignore[arg-type]
    text = exposition(reg)[0].decode()
    fams = {m.name: m for m in text_string_to_metric_families(text)}
    waiting = {(x.labels["limit"], x.labels["key"]): x.value
               for x in fams["meshant_limit_waiting"].samples}
    assert waiting[("llm:payload.tenant=1", "a")] == 2
    assert fams["meshant_rate_waiting"].samples[0].value == 1
