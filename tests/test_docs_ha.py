"""docs/ha.md's recipes run as a reader pastes them (issue #24, item 15): the one-machine
recipe whole (its own throwaway PostgreSQL, two queens, a takeover in the middle of a
task), and the two-host recipe's meshant commands on loopback addresses. Changed only
where a test must: free ports instead of 5670/5680, no `pip install` into the test's
environment, and the database host's service set-up (sudo, systemd) left out."""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _blocks(title: str) -> list[str]:
    doc = (ROOT / "docs" / "ha.md").read_text()
    section = doc.split(f"### {title}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")])}
    env.pop("MESHANT_JOURNAL", None)  # conftest's volatile default: the recipe sets its own
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env=env)


@pytest.fixture
def postgres() -> None:
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb") and not shutil.which("initdb"):
        if os.environ.get("CI"):
            raise RuntimeError("PostgreSQL is not installed (.ci/run should have done it)")
        pytest.skip("PostgreSQL is not installed here")


def _throwaway_pg() -> tuple[str, str]:
    """The one-machine recipe's set-up (its PostgreSQL) and clean-up, from the doc."""
    (recipe,) = _blocks("Two queens on one machine, with a throwaway PostgreSQL")
    setup = recipe.split("# Two queens on that database")[0]
    setup = "\n".join(x for x in setup.splitlines() if "pip install" not in x
                      and "activate" not in x)
    cleanup = recipe.split("# Clean up")[1].split("\n", 1)[1]
    return setup, cleanup


def test_one_machine_recipe(postgres: None, tmp_path: Path) -> None:
    (recipe,) = _blocks("Two queens on one machine, with a throwaway PostgreSQL")
    a, a_pub, b, b_pub = _ports(4)
    script = "\n".join(x for x in recipe.splitlines() if "pip install" not in x
                       and "activate" not in x)
    for old, new in ((":5670", f":{a}"), (":5671", f":{a_pub}"), (":5680", f":{b}"),
                     (":5681", f":{b_pub}")):
        script = script.replace(old, new)
    r = _run(script, tmp_path)
    out, err = r.stdout, r.stderr
    assert r.returncode == 0, err
    assert "queen 'qa' of colony 'default'" in out and "leader of term 1" in out, out
    assert "is a standby (term 1)" in out
    # Issue #24 (13): each queen's ready line says what it is, and the leader's no longer
    # that it "leads once it holds the lease".
    assert "role=leader (it holds the lease)" in out
    assert "role=standby (leads once it holds the lease)" in out
    assert '{"seconds": 6}' in out  # the task that outlived its leader, once
    assert "queen 'qb' of colony" in out and "leader of term 2" in out
    assert "0 problem(s) in postgresql://" in err
    assert "Traceback" not in err and "server stopped" in out


def test_two_host_recipe_on_loopback(postgres: None, tmp_path: Path) -> None:
    addresses, _database_host, keys, queens, peers = _blocks("Two hosts, with keys")
    setup, cleanup = _throwaway_pg()
    a, a_pub = _ports(2)
    queens = queens.replace("\\\n    ", "").replace("5432", "$PGPORT")
    queen_a, queen_b = (q.strip().splitlines()[-1] for q in queens.split("# on $B:"))
    forager, operator = peers.split("# on an operator's:")
    forager = forager.replace(" --app myagents:forager", "")
    script = "\n".join([
        setup, addresses, keys,
        f"{queen_a} &", "QA=$!", "sleep 3", f"{queen_b} &", "QB=$!", "sleep 3",
        f"({forager}) &", "F=$!", "sleep 3",
        f"({operator}", "kill $QA; sleep 4; meshant status)",
        "kill $F $QB; wait $F $QB",
        cleanup,
    ]).replace(":5670", f":{a}").replace(":5671", f":{a_pub}")
    r = _run(script, tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"role": "leader", "term": 1' in r.stdout
    assert "meshant forager 'worker' ready" in r.stdout
    assert "queen 'qb' of colony" in r.stdout and "leader of term 2" in r.stdout
    assert "worker" in r.stdout.split("leader of term 2")[1]  # the forager followed
    assert "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr
