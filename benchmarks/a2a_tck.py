#!/usr/bin/env python3
"""The A2A TCK against ``meshant a2a``, and against the SDK's own server parts in the same
run: passed, failed and skipped for each, and the tests that fail on meshant only.

    git clone https://github.com/a2aproject/a2a-tck && cd a2a-tck && git checkout 1.0-dev
    # the TCK's dependencies (its pyproject.toml's list) in a venv of their own, e.g. at
    # /tmp/tck-venv, as the TCK's README says
    python -m benchmarks.a2a_tck --tck PATH --tck-python /tmp/tck-venv/bin/python
                                 [--capability echo] [--push] [--no-anchor] [--json]
                                 [--transport jsonrpc,http_json] [-- PYTEST_ARGS]

Opt-in: it needs a TCK checkout you already have (``--tck``; nothing here fetches or
builds one) and the TCK's dependencies in the interpreter ``--tck-python`` names. It
starts, on free loopback ports, a CLI queen, a CLI forager (its built-in capabilities:
echo, sleep, fail, stream), ``meshant a2a`` in front of them, and the anchor (the SDK's
echo agent, ``tests/sdk_a2a_agent.py --echo``); runs the TCK's suite
(``tests/compatibility``, every category, the transports the cards declare) against
``/agents/CAPABILITY`` of each; stops everything by PID.

``--push`` offers push notifications (``--push-host localhost 127.0.0.1 example.com
--push-network 127.0.0.0/8 ::1/128``): the TCK's webhook receiver listens on this
machine; its configuration tests register ``https://example.com/...`` on tasks that have
already ended, to which nothing is ever sent.

Only 127.0.0.1 is used; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshant.apps import _procs  # noqa: E402

PUSH = ("--push-host", "localhost", "--push-host", "127.0.0.1", "--push-host", "example.com",
        "--push-network", "127.0.0.0/8", "--push-network", "::1/128")


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (passed|failed|skipped, the first line of why) from a JUnit report."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, why = "failed", (child.get("message") or "").splitlines()[0][:200]
            elif child.tag == "skipped":
                state, why = "skipped", (child.get("message") or "")[:200]
        out[name] = (state, why)
    return out


def counts(results: dict[str, tuple[str, str]]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for state, _ in results.values():
        c[state] += 1
    return c


def run_tck(tck: Path, python: str, sut: str, report: Path, transport: str | None,
            extra: list[str], timeout: float) -> dict[str, tuple[str, str]]:
    """The TCK's suite against ``sut``; its outcomes (its own reports go to ``report``)."""
    cmd = [python, "-m", "pytest", "tests/compatibility/", f"--sut-host={sut}",
           "--webhook-host=127.0.0.1", "-q", "--tb=line", "-p", "no:cacheprovider",
           f"--junitxml={report}", *extra]
    if transport:
        cmd.append(f"--transport={transport}")
    p = subprocess.Popen(cmd, cwd=tck, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
        raise SystemExit(f"the TCK did not finish within {timeout:g} s against {sut}") \
            from None
    if not report.exists():
        raise SystemExit(f"the TCK wrote no report against {sut}:\n{out[-3000:]}")
    return outcomes(report)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tck", required=True, type=Path,
                    help="a checkout of github.com/a2aproject/a2a-tck (branch 1.0-dev)")
    ap.add_argument("--tck-python", default=sys.executable,
                    help="the interpreter with the TCK's dependencies (default: this one)")
    ap.add_argument("--capability", default="echo",
                    help="the capability whose own agent (/agents/CAPABILITY) is tested")
    ap.add_argument("--push", action="store_true",
                    help="offer push notifications (to this machine's loopback only)")
    ap.add_argument("--no-anchor", action="store_true", help="run against meshant only")
    ap.add_argument("--transport", help="the TCK's --transport (default: all the card has)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per TCK run")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to the TCK's pytest")
    args = ap.parse_args()
    tck = args.tck.resolve()
    if not (tck / "tests" / "compatibility").is_dir() or not (tck / "tck").is_dir():
        raise SystemExit(f"{tck} is not an A2A TCK checkout (no tests/compatibility or tck/): "
                         "git clone https://github.com/a2aproject/a2a-tck, then git "
                         "checkout 1.0-dev")
    check = subprocess.run([args.tck_python, "-c", "import httpx, pytest, jsonschema, grpc"],
                           capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        raise SystemExit(f"{args.tck_python} lacks the TCK's dependencies ("
                         f"{check.stderr.strip().splitlines()[-1]}): install them into a "
                         f"venv of their own (the list in {tck / 'pyproject.toml'}) and "
                         "pass its python as --tck-python")

    procs: list[subprocess.Popen[str]] = []
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def start(*a: str) -> dict[str, Any]:
        p = _procs.spawn(list(a), env=env)
        procs.append(p)
        return _procs.read_json_line(p, 30)

    results: dict[str, dict[str, tuple[str, str]]] = {}
    urls: dict[str, str] = {}
    try:
        queen = start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                      "--json", "--journal", ":memory:")["router"]
        start("forager", "--queen", queen, "--slots", "4", "--json")
        a2a = start("a2a", "--queen", queen, "--listen", "127.0.0.1:0", "--json",
                    *(PUSH if args.push else ()))
        if args.capability not in a2a["skills"]:
            raise SystemExit(f"the colony has no capability {args.capability!r}: "
                             f"{', '.join(a2a['skills'])}")
        urls["meshant"] = str(a2a["a2a"]).rstrip("/") + f"/agents/{args.capability}"
        if not args.no_anchor:
            anchor = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "sdk_a2a_agent.py"), "--echo"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(anchor)
            urls["anchor"] = str(_procs.read_json_line(anchor, 30)["url"])
        with tempfile.TemporaryDirectory(prefix="meshant-tck-") as tmp:
            for who, url in urls.items():
                results[who] = run_tck(tck, args.tck_python, url, Path(tmp) / f"{who}.xml",
                                       args.transport, args.pytest_args, args.timeout)
    finally:
        _procs.stop(procs)

    mine = results["meshant"]
    anchor_results = results.get("anchor", {})
    only_meshant = sorted(t for t, (s, _) in mine.items()
                          if s == "failed" and anchor_results.get(t, ("",))[0] == "passed")
    only_skipped = sorted(t for t, (s, _) in mine.items()
                          if s == "skipped" and anchor_results.get(t, ("",))[0] == "passed")
    summary = {who: counts(r) for who, r in results.items()}
    if args.json:
        print(json.dumps({"urls": urls, "counts": summary,
                          "failed_on_meshant_passed_on_anchor": only_meshant,
                          "skipped_on_meshant_passed_on_anchor": only_skipped,
                          "failed": {who: sorted(t for t, (s, _) in r.items() if s == "failed")
                                     for who, r in results.items()}}))
        return
    for who, c in summary.items():
        print(f"{who:8} {c['passed']:4} passed {c['failed']:4} failed {c['skipped']:4} "
              f"skipped   ({urls[who]})")
    for who, r in results.items():
        for t, (s, why) in sorted(r.items()):
            if s == "failed":
                print(f"  {who} failed: {t}\n      {why}")
    if anchor_results:
        print(f"failed on meshant, passed on the anchor: {len(only_meshant)}")
        for t in only_meshant:
            print(f"  {t}")
        print(f"skipped on meshant (not applicable to how it was started), passed on the "
              f"anchor: {len(only_skipped)}")
        for t in only_skipped:
            print(f"  {t}")


if __name__ == "__main__":
    main()
