"""The conformance kit, run as a user runs it (``meshant conformance ...`` subprocesses)
against meshant's own forager and queen, which must pass, and against peers broken on
purpose (tests/peers/), which must fail: a kit that cannot fail is a defect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshant.apps import _procs
from meshant.conformance import CHECKS, checks_of
from meshant.conformance.catalog import BY_ID
from tests.conftest import Procs
from tests.test_cli import meshant
from tests.vectors import spec_table

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).parent / "peers"


def _report(*args: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    r = meshant("conformance", *args, timeout=timeout)
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def _status(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def test_spec_and_kit_name_each_other() -> None:
    """Appendix A is the catalog, and each section lists the checks that test it."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    regenerated = spec_table.cross_reference(spec_table._replace(
        text, spec_table.CHECKS_HEAD,
        [f"| `{c.id}` | {kit} | {c.section} | {c.title} |" for kit, c in CHECKS]))
    assert regenerated == text, "run: python tests/vectors/spec_table.py"
    body = text.split("## Appendix A")[0]
    for _, c in CHECKS:
        assert f"`{c.id}`" in body, c.id  # named in its section, not only in the appendix
    assert len(BY_ID) == len(CHECKS)  # ids are unique


def test_cli_explains_itself() -> None:
    from click.testing import CliRunner

    from meshant.cli import main

    run = CliRunner().invoke
    r = run(main, ["conformance", "forager", "--help"])
    assert r.exit_code == 0 and "MESHANT_QUEEN" in r.output and "{queen}" in r.output
    r = run(main, ["conformance", "forager"])
    assert r.exit_code == 2 and "COMMAND" in r.output
    r = run(main, ["conformance", "forager", "--", str(ROOT / "no-such-forager")])
    assert r.exit_code == 1 and "cannot start" in r.output


@pytest.mark.slow
def test_meshant_forager_passes() -> None:
    code, report = _report("forager", "--json", "--", sys.executable, "-m", "meshant",
                           "forager", "--slots", "3")
    status = _status(report)
    assert code == 0 and report["fail"] == 0, report
    assert set(status) == {c.id for c in checks_of("forager")}
    assert [k for k, v in status.items() if v == "SKIP"] == ["f.legacy"], status


@pytest.mark.slow
def test_iacp11_example_forager_passes() -> None:
    code, report = _report("forager", "--json", "--", sys.executable,
                           str(ROOT / "examples" / "legacy_forager.py"), "{queen}")
    status = _status(report)
    assert code == 0 and status["f.legacy"] == "PASS" and status["f.bad-input"] == "PASS"


@pytest.mark.slow
def test_kit_fails_a_broken_forager() -> None:
    code, report = _report("forager", "--json", "--", sys.executable,
                           str(PEERS / "broken_forager.py"))
    status = _status(report)
    assert code == 1
    for check in ("f.assign", "f.heartbeat", "f.from", "f.bad-input", "f.progress"):
        assert status[check] == "FAIL", (check, report)
    assert status["f.hello"] == "PASS"


@pytest.mark.slow
def test_meshant_queen_passes(procs: Procs) -> None:
    _, endpoint = procs.queen()
    r = meshant("conformance", "queen", "--queen", endpoint, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == len(checks_of("queen")) + 1
    assert all(ln.startswith("PASS ") for ln in lines[:-1]), r.stdout
    assert "0 failed" in lines[-1]


@pytest.mark.slow
def test_kit_fails_a_broken_queen() -> None:
    p = subprocess.Popen([sys.executable, str(PEERS / "broken_queen.py")],
                         stdout=subprocess.PIPE, text=True)
    try:
        endpoint = _procs.read_json_line(p, 20)["router"]
        code, report = _report("queen", "--json", "--queen", endpoint, "--timeout", "2")
        status = _status(report)
        assert code == 1 and status["q.welcome"] == "FAIL", report
        assert set(status.values()) == {"FAIL", "SKIP"}  # nothing passes after that
    finally:
        _procs.stop([p])
