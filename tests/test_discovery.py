"""Zeroconf discovery with real mDNS, inside a network namespace made for the test.

The namespace holds only its own loopback interface, so no mDNS packet can leave this
machine (or even reach the host's other interfaces). Creating it needs root and iproute2,
as CI has; elsewhere these tests are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from meshant.apps import _procs

from .conftest import wait_for

HB = ("--hb-interval", "0.2", "--hb-misses", "5")


class Netns:
    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[str]] = []

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def start(self, *args: str, ready: bool = True) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        p = _procs.spawn(list(args), prefix=self.prefix)
        self.procs.append(p)
        return p, (_procs.read_json_line(p, 30) if ready else {})

    def queen(self, colony: str, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        return self.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                          "--advertise", "--colony", colony, "--name", f"q-{colony}",
                          "--json", *HB, *extra)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, sys.executable, "-m", "meshant", *args],
                              capture_output=True, text=True, timeout=timeout)

    def discover(self, *extra: str) -> list[dict[str, Any]]:
        r = self.run("discover", "--json", "--timeout", "1.5", *extra)
        assert r.returncode == 0, r.stderr
        return list(json.loads(r.stdout))

    def status(self, router: str) -> dict[str, Any]:
        r = self.run("status", "--queen", router, "--json")
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0:
        pytest.skip("discovery tests make a network namespace: they need root (CI has it)")
    name = f"meshant-{os.getpid()}-{secrets.token_hex(3)}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
    ns = Netns(name)
    try:
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "link", "set", "lo", "multicast", "on"]):
            subprocess.run([*ns.prefix, *cmd], check=True, timeout=10)
        yield ns
    finally:
        _procs.stop(ns.procs)
        subprocess.run(["ip", "netns", "del", name], timeout=10)



@pytest.mark.slow
def test_discovered_queen_is_listed_joined_and_used(netns: Netns) -> None:
    _, q = netns.queen("ants")
    assert q["advertised"] is True
    queens = wait_for(lambda: netns.discover(), what="the queen to be discovered")
    (rec,) = queens
    assert rec["colony"] == "ants" and rec["router"] == q["router"] and rec["pub"] == q["pub"]
    assert rec["versions"] == [2] and rec["epoch"] == q["epoch"]
    _, f = netns.start("forager", "--discover", "--name", "scout", "--json")
    assert f["queen"] == q["router"]
    r = netns.run("submit", "--discover", "echo", '{"found": true}')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"found": True}


@pytest.mark.slow
def test_two_colonies_stay_separate(netns: Netns) -> None:
    _, ants = netns.queen("ants")
    _, bees = netns.queen("bees")
    wait_for(lambda: len(netns.discover()) == 2, what="both queens")
    assert [q["colony"] for q in netns.discover("--colony", "bees")] == ["bees"]
    _, f = netns.start("forager", "--discover", "--colony", "bees", "--name", "worker",
                       "--json")
    assert f["queen"] == bees["router"]
    assert [x["name"] for x in netns.status(bees["router"])["foragers"]] == ["worker"]
    assert netns.status(ants["router"])["foragers"] == []
    p, _ = netns.start("forager", "--discover", "--json", ready=False)
    assert p.wait(30) == 1
    assert p.stderr is not None and "several colonies" in p.stderr.read()


@pytest.mark.slow
def test_forager_follows_a_queen_restarted_on_another_port(netns: Netns) -> None:
    first, q1 = netns.queen("ants")
    _, f = netns.start("forager", "--discover", "--colony", "ants", "--name", "loyal",
                       "--json")
    assert f["queen"] == q1["router"]
    first.send_signal(signal.SIGTERM)
    assert first.wait(15) == 0
    # A queen that stops unregisters: it is gone from discovery.
    wait_for(lambda: netns.discover() == [], what="the stopped queen to disappear")
    _, q2 = netns.queen("ants")
    assert q2["router"] != q1["router"]
    wait_for(lambda: [x["name"] for x in netns.status(q2["router"])["foragers"]] == ["loyal"],
             timeout=30, what="the forager to follow the queen to its new port")


@pytest.mark.slow
def test_pinned_queen_key_refuses_a_rogue_queen(netns: Netns, tmp_path: Any) -> None:
    import shutil

    from meshant.adapters.security import generate

    keys, auth = tmp_path / "keys", tmp_path / "auth"
    auth.mkdir()
    _, qsec = generate(keys, "queen")
    real_pub, _ = generate(keys, "real-queen")  # the key this forager trusts
    fpub, fsec = generate(keys, "f", ("forager",))
    shutil.copy(fpub, auth)
    netns.queen("ants", "--curve-secret", str(qsec), "--authorized", str(auth))
    p, _ = netns.start("forager", "--discover", "--colony", "ants", "--name", "f",
                       "--curve-secret", str(fsec), "--queen-key", str(real_pub), "--json",
                       ready=False)
    assert p.wait(30) == 1
    assert p.stderr is not None and "refusing the queen" in p.stderr.read()
    # With no pinned key, the advertised one is used, and the forager joins.
    _, info = netns.start("forager", "--discover", "--colony", "ants", "--name", "f",
                          "--curve-secret", str(fsec), "--json")
    assert info["name"] == "f"


def test_choose_takes_the_record_heard_last_and_compares_no_clocks() -> None:
    from meshant.adapters.discovery import QueenRecord, choose

    def rec(instance: str, heard: int, started: float) -> QueenRecord:
        return QueenRecord(instance=instance, colony="ants", name="q", router=f"tcp://h:{heard}",
                           pub="", versions=(2,), epoch=instance, host="", started=started,
                           heard=heard)

    # A restarted queen on a host whose clock is behind its crashed predecessor's:
    # the record heard later wins all the same.
    old, new = rec("ants-q-aaaa", 1, started=2000.0), rec("ants-q-bbbb", 2, started=1000.0)
    assert choose([old, new], "ants") is new
    assert choose([new, old], None) is new
    # Heard together (equal order): the instance name decides, the same for every joiner.
    a, b = rec("ants-q-aaaa", 0, 0.0), rec("ants-q-bbbb", 0, 0.0)
    assert choose([b, a], "ants") is b and choose([a, b], "ants") is b
    assert "heard" not in new.as_dict()


def test_choose_prefers_the_leader_of_the_highest_term() -> None:
    from meshant.adapters.discovery import QueenRecord, choose

    def rec(name: str, role: str, term: int, heard: int) -> QueenRecord:
        return QueenRecord(instance=f"ants-{name}", colony="ants", name=name,
                           router=f"tcp://h:{heard}", pub="", versions=(2,), epoch="e",
                           host="h", role=role, term=term, heard=heard)

    standby = rec("qb", "standby", 3, 9)  # heard last, but a standby
    deposed = rec("qa", "leader", 2, 5)   # not yet stepped down
    leader = rec("qc", "leader", 3, 1)
    assert choose([standby, deposed, leader], "ants") is leader
    assert choose([standby, deposed], "ants") is deposed
    assert choose([standby], "ants") is standby  # it will name the leader


def test_a_list_of_queen_endpoints_is_checked_one_by_one() -> None:
    from meshant.actors._endpoints import check_endpoints
    from meshant.errors import ConfigError

    assert check_endpoints("tcp://a:1, tcp://b:2") == ["tcp://a:1", "tcp://b:2"]
    assert check_endpoints("ipc:///tmp/q") == ["ipc:///tmp/q"]
    with pytest.raises(ConfigError, match="'tcp://b' is not a ZeroMQ endpoint"):
        check_endpoints("tcp://a:1,tcp://b")
    with pytest.raises(ConfigError, match="empty"):
        check_endpoints(" , ")


@pytest.mark.slow
def test_peers_follow_the_standby_that_takes_over_by_its_term(netns: Netns,
                                                                pg_server: Any) -> None:
    # The database through its unix socket: reachable from inside the namespace.
    url = pg_server.create_db(f"disc_{secrets.token_hex(3)}").replace(
        f"@127.0.0.1:{pg_server.port}/", "@/") + f"?host={pg_server.dir}&port={pg_server.port}"
    lease = ("--journal", url, "--lease", "1")
    a, qa = netns.queen("ants", "--name", "qa", *lease)
    wait_for(lambda: [(q["name"], q["role"], q["term"]) for q in netns.discover()] == [
        ("qa", "leader", 1)], timeout=20, what="qa advertised as the leader")
    _, qb = netns.queen("ants", "--name", "qb", *lease)
    wait_for(lambda: sorted((q["name"], q["role"]) for q in netns.discover()) == [
        ("qa", "leader"), ("qb", "standby")], timeout=20, what="qb advertised as standby")
    _, f = netns.start("forager", "--discover", "--colony", "ants", "--name", "loyal",
                       "--json")
    assert f["queen"] == qa["router"]  # the leader, not the standby
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    # qa's record lingers (a killed responder says no goodbye); qb's term is higher.
    wait_for(lambda: [x["name"] for x in netns.status(qb["router"]).get("foragers", [])]
             == ["loyal"], timeout=30, what="the forager to follow qb, the new leader")
    assert netns.status(qb["router"])["term"] == 2
