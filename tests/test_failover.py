"""Queen failover on a real PostgreSQL journal: two CLI queens (one leads, one stands by),
CLI foragers and clients given both endpoints; the leader killed, paused, cut off from its
database, or both queens killed — every task completes exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from meshant import Client
from meshant.errors import MeshantError, Refused
from meshant.storage import open_journal

from .conftest import Procs, wait_for
from .test_cli import meshant

pytestmark = pytest.mark.slow

LEASE = 1.0
HB = ("--hb-interval", "0.2", "--hb-misses", "5")


class Pair:
    """Queens on ipc endpoints in ``tmp_path`` sharing one PostgreSQL journal."""

    def __init__(self, procs: Procs, tmp_path: Path, url: str) -> None:
        self.procs, self.tmp, self.url = procs, tmp_path, url
        self.procs_by: dict[str, subprocess.Popen[str]] = {}

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.tmp}/{name}"

    @property
    def both(self) -> str:
        return f"{self.endpoint('qa')},{self.endpoint('qb')}"

    def start(self, name: str) -> subprocess.Popen[str]:
        p, info = self.procs.start(
            "queen", "--name", name, "--bind", self.endpoint(name),
            "--pub", f"ipc://{self.tmp}/{name}-pub", "--json", "--journal", self.url,
            "--lease", str(LEASE), *HB)
        # A queen says it is ready once it tried for the lease: leader when it was free.
        assert info["role"] in ("leader", "standby")
        self.procs_by[name] = p
        return p

    def role(self, name: str) -> dict[str, Any]:
        """What ``meshant status --json`` says of this queen (``{}``: no answer)."""
        r = meshant("status", "--queen", self.endpoint(name), "--json",
                    "--connect-timeout", "2")
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def leads(self, name: str) -> bool:
        try:
            with Client(self.endpoint(name), follow_leader=False, timeout=1) as c:
                return c.status(timeout=1)["role"] == "leader"
        except MeshantError:
            return False


def _journal_states(url: str) -> dict[str, list[str]]:
    j = open_journal(url, readonly=True)
    try:
        return {t["id"]: [e["state"] for e in j.task(t["id"])["events"]]  # type: ignore[index]
                for t in j.tasks(limit=100_000)}
    finally:
        j.close()


def _exactly_once(url: str, n: int) -> None:
    states = _journal_states(url)
    assert len(states) == n
    for tid, history in states.items():
        assert history.count("completed") == 1 and history[-1] == "completed", (tid, history)
    j = open_journal(url, readonly=True)
    try:
        assert j.verify() == []
    finally:
        j.close()


def test_leader_killed_the_standby_takes_over_and_every_task_completes_once(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    assert pair.role("qb")["role"] == "standby"
    for i in range(3):
        procs.forager(pair.both, "--name", f"f{i}", "--slots", "4")
    n = 1000
    with Client(pair.both, queen_wait=60) as c:
        futs = [c.submit("sleep", {"seconds": 0.01, "n": i}) for i in range(n)]
        wait_for(lambda: c.status()["counters"]["completed"] >= 150, what="work under way")
        a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        a.wait(10)
        done_at_kill = sum(f.done() for f in futs)
        assert done_at_kill < n - 200, done_at_kill  # queued, running and done tasks
        wait_for(lambda: pair.leads("qb"), timeout=LEASE + 10, what="qb to lead")
        took = time.monotonic() - killed
        results = [f.result(120) for f in futs]
    assert [r["n"] for r in results] == list(range(n))  # each task's own result, once
    assert took < LEASE + 2 + 1.5, took  # the lease, plus a couple of seconds (and polling)
    st = pair.role("qb")
    assert st["role"] == "leader" and st["term"] == 2
    _exactly_once(pg_url, n)


def test_paused_leader_is_deposed_and_steps_down_when_it_wakes(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    for i in range(2):
        procs.forager(pair.both, "--name", f"f{i}", "--slots", "8")
    n = 1500
    with Client(pair.both, queen_wait=60) as c:
        futs = [c.submit("sleep", {"seconds": 0.003, "n": i}) for i in range(n)]
        wait_for(lambda: c.status()["counters"]["completed"] >= 100, what="work under way")
        # Busy: frozen in the middle of a journal write (the lease row held FOR SHARE).
        a.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            wait_for(lambda: pair.leads("qb"), timeout=LEASE + 10, what="qb to lead")
            took = time.monotonic() - frozen
        finally:
            a.send_signal(signal.SIGCONT)
        assert took < 2 * LEASE + 3, took
        # The old leader wakes past its lease: it steps down and says so.
        # ... and then names the new leader and its term.
        # (Each look is a `meshant status` process, a few a second at most on a loaded
        # machine, and qa first ends the write it froze in.)
        want = {"role": "standby", "term": 2, "queen": "qa", "leader": pair.endpoint("qb")}
        seen: list[dict[str, Any]] = []

        def named_qb() -> bool:
            seen.append(pair.role("qa"))
            return seen[-1] == want
        try:
            wait_for(named_qb, timeout=LEASE + 20, what="qa to step down and name qb")
        except AssertionError as e:
            raise AssertionError(f"{e}: qa said {seen[-3:]}") from None
        results = [f.result(120) for f in futs]
    assert [r["n"] for r in results] == list(range(n))
    _exactly_once(pg_url, n)
    assert pair.role("qb")["role"] == "leader"
    a.send_signal(signal.SIGTERM)
    assert a.wait(10) == 0
    assert a.stderr is not None
    log = a.stderr.read()
    assert "steps down (term 1)" in log and "is a standby now" in log


def test_database_restarted_under_a_running_leader_loses_nothing(
        procs: Procs, tmp_path: Path, pg_server: Any, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    # A lease longer than the database's restart: the leader rides it out.
    p, _ = procs.start("queen", "--name", "qa", "--bind", pair.endpoint("qa"),
                          "--pub", f"ipc://{tmp_path}/qa-pub", "--json", "--journal", pg_url,
                          "--lease", "8", *HB)
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    procs.forager(pair.endpoint("qa"), "--name", "f0", "--slots", "4")
    n = 400
    with Client(pair.endpoint("qa"), queen_wait=60) as c:
        futs = [c.submit("sleep", {"seconds": 0.005, "n": i}) for i in range(n)]
        wait_for(lambda: c.status()["counters"]["completed"] >= 50, what="work under way")
        pg_server.restart()
        results = [f.result(120) for f in futs]
        assert c.status()["term"] == 1  # the same leader throughout
    assert [r["n"] for r in results] == list(range(n))
    assert p.poll() is None
    _exactly_once(pg_url, n)


def test_both_queens_killed_one_restarted_recovers_everything(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    a = pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    b = pair.start("qb")
    procs.forager(pair.both, "--name", "f0", "--slots", "4")
    n = 300
    with Client(pair.both, queen_wait=60) as c:
        c.memory.set("plan", {"step": 3})
        futs = [c.submit("sleep", {"seconds": 0.01, "n": i}) for i in range(n)]
        wait_for(lambda: c.status()["counters"]["completed"] >= 30, what="work under way")
        for q in (a, b):
            q.send_signal(signal.SIGKILL)
            q.wait(10)
        time.sleep(0.5)  # both down for a while: nothing answers
        pair.start("qb")
        wait_for(lambda: pair.leads("qb"), timeout=LEASE + 10, what="qb to lead")
        results = [f.result(120) for f in futs]
        # The colony memory came back with the journal.
        wait_for(lambda: c.memory.get("plan") == {"step": 3}, what="memory restored")
    assert [r["n"] for r in results] == list(range(n))
    _exactly_once(pg_url, n)


def test_a_standby_refuses_with_not_leader_naming_the_leader(
        procs: Procs, tmp_path: Path, pg_url: str) -> None:
    pair = Pair(procs, tmp_path, pg_url)
    pair.start("qa")
    wait_for(lambda: pair.leads("qa"), what="qa to lead")
    pair.start("qb")
    with pytest.raises(Refused) as info:
        Client(pair.endpoint("qb"), follow_leader=False, timeout=5)
    e = info.value
    assert e.code == "not-leader" and e.detail["leader"] == pair.endpoint("qa")
    assert e.detail["term"] == 1 and "standby" in str(e)
    # A peer given only the standby follows the hint to the leader.
    with Client(pair.endpoint("qb"), timeout=5) as c:
        assert c.status()["queen"]["name"] == "qa"
    r = meshant("status", "--queen", pair.endpoint("qb"))
    assert r.returncode == 0 and "standby" in r.stdout and pair.endpoint("qa") in r.stdout
    r = meshant("tasks", "--journal", pg_url, "--json")
    assert r.returncode == 0


@pytest.mark.slow
def test_a_deposed_leaders_write_is_fenced_and_changes_nothing(pg_url: str) -> None:
    from meshant.core.tasks.model import Task
    from meshant.storage import Deposed
    from meshant.storage.pg import PgJournal

    old, new = PgJournal(pg_url), PgJournal(pg_url)
    try:
        new.db.execute("UPDATE lease SET term = 7 WHERE id = 1")
        old.term, new.term = 6, 7
        t = Task(id="t1", capability="echo", payload=1, client_name="c")
        t.submitted = time.monotonic()
        t.history = [(t.submitted, "queued", "submitted")]
        with pytest.raises(Deposed, match="term 6 is over: queen term 7 leads now"):
            old.record([t], time.time() - time.monotonic())
        assert not old.has("t1") and old.verify() == []  # nothing of it was written
        t.logged = 0
        new.record([t], time.time() - time.monotonic())  # the leader's own write goes in
        assert new.has("t1")
    finally:
        old.close()
        new.close()


@pytest.mark.slow
def test_a_peer_given_only_the_standby_survives_a_second_failover(tmp_path: Path,
                                                                  pg_url: str) -> None:
    qa, qb = _leader_and_standby(tmp_path, pg_url)
    try:
        with Client(f"ipc://{tmp_path}/qb", queen_wait=60) as c:  # told of qb only
            assert c.status()["queen"]["name"] == "qa"  # followed qb's hint
            qa.stop()  # (hands the lease back)
            wait_for(lambda: qb.role == "leader", what="qb to lead")
            # qa is gone: back to the list it was given, where qb now leads.
            wait_for(lambda: _status_name(c) == "qb", timeout=20,
                     what="the client to come back to qb")
    finally:
        qa.stop()
        qb.stop()


def _leader_and_standby(tmp_path: Path, url: str) -> tuple[Any, Any]:
    """In-process queens qa (leading) and qb (standing by) on ipc endpoints."""
    from meshant import Queen

    def queen(name: str) -> Queen:
        return Queen(f"ipc://{tmp_path}/{name}", f"ipc://{tmp_path}/{name}-pub", name=name,
                     journal=url, lease=LEASE, hb_interval=0.2, hb_misses=5).start()

    qa = queen("qa")
    wait_for(lambda: qa.role == "leader", what="qa to lead")
    return qa, queen("qb")


def _status_name(c: Client) -> str:
    try:
        return str(c.status(timeout=1)["queen"]["name"])
    except MeshantError:
        return ""


@pytest.mark.slow
def test_a_hint_that_leads_nowhere_sends_the_peer_back_to_its_list(tmp_path: Path,
                                                                    pg_url: str) -> None:
    import psycopg

    qa, qb = _leader_and_standby(tmp_path, pg_url)
    try:
        # The lease names an endpoint nobody can reach (a bad --bind advertised, say).
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE meshant.lease SET endpoint = %s",
                         (f"ipc://{tmp_path}/nowhere",))
        wait_for(lambda: (qb.leadership.leader or object()).endpoint.endswith("nowhere"),
                 what="qb to read the bad hint")
        with Client(f"ipc://{tmp_path}/qb,ipc://{tmp_path}/qa", timeout=20) as c:
            assert c.status()["queen"]["name"] == "qa"  # qb -> nowhere -> qa, the leader
    finally:
        qa.stop()
        qb.stop()


@pytest.mark.slow
def test_a_leader_frozen_in_the_middle_of_a_write_does_not_hold_up_the_takeover(
        pg_url: str) -> None:
    import psycopg

    from meshant.storage.leadership import Leadership
    from meshant.storage.pg import PgJournal

    j = PgJournal(pg_url)  # (makes the schema)
    frozen = psycopg.connect(pg_url, autocommit=True)
    ld: Leadership | None = None
    try:
        frozen.execute("UPDATE meshant.lease SET term = 1, holder = 'qa', expires = "
                       "clock_timestamp() + interval '1 second'")
        # qa's journal write, frozen half-way: its pipeline sent, no Sync, never finished.
        # The server waits for the client with the lease row held FOR SHARE, and neither
        # statement_timeout nor idle_in_transaction_session_timeout ends that.
        pg = frozen.pgconn
        pg.enter_pipeline_mode()
        pg.send_query_params(b"BEGIN", None)
        pg.send_query_params(b"SELECT meshant.fence(1)", None)
        pg.flush()
        with psycopg.connect(pg_url, autocommit=True) as look:
            wait_for(lambda: look.execute(
                "SELECT count(*) FROM pg_locks WHERE relation = 'meshant.lease'::regclass "
                "AND pid = %s AND granted", (pg.backend_pid,)).fetchone()[0] > 0,
                what="the frozen write to hold the lease row")
        ld = Leadership(j, lease=1.0, holder="qb", name="qb")
        ld.start("ipc://qb", "ipc://qb-pub")
        wait_for(lambda: ld is not None and ld.role == "leader", timeout=2 * LEASE + 3,
                 what="qb to take the lapsed lease despite the frozen write")
        assert ld.term == 2
    finally:
        if ld is not None:
            ld.stop()
        try:
            frozen.close()
        except Exception:  # its session was ended under it
            pass
        j.close()


@pytest.mark.slow
def test_no_leader_at_all_is_said_plainly(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    from meshant import Queen
    from meshant.errors import QueenUnreachable

    qb = Queen(f"ipc://{tmp_path}/qb", f"ipc://{tmp_path}/qb-pub", name="qb", journal=pg_url,
               lease=LEASE)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # another queen's lease, live
        conn.execute("UPDATE meshant.lease SET term = 9, holder = 'x', name = 'qx', "
                      "endpoint = NULL, expires = clock_timestamp() + interval '1 hour'")
    qb.start()
    try:
        with pytest.raises(QueenUnreachable, match=r"no queen leads at .*qb.*journal database"):
            Client(f"ipc://{tmp_path}/qb", timeout=2)
    finally:
        qb.stop()


@pytest.mark.slow
def test_durability_power_asks_postgresql_to_flush_every_commit(pg_url: str) -> None:
    from meshant.storage.pg import PgJournal

    power, default = PgJournal(pg_url, durability="power"), PgJournal(pg_url)
    try:
        assert power.db.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        # 'process' leaves the server's own setting (the tests' server runs with it off).
        assert default.db.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    finally:
        power.close()
        default.close()
