"""Traces across hops: one task, three processes (client, queen, forager), one connected
trace, recorded by the OpenTelemetry SDK's in-memory exporter in each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from meshant import Client
from meshant.apps import _procs

from .conftest import Procs
from .otel_run import span_record

ROOT = Path(__file__).resolve().parent.parent


def _start(procs: Procs, out: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    p = subprocess.Popen([sys.executable, "-m", "tests.otel_run", str(out), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                              "PYTHONPATH": os.pathsep.join(
                                  [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    procs.all.append(p)
    return p, _procs.read_json_line(p, 20)


@pytest.mark.slow
def test_one_task_one_trace_across_three_processes(procs: Procs, tmp_path: Path) -> None:
    queen_out, forager_out = tmp_path / "queen.jsonl", tmp_path / "forager.jsonl"
    qp, info = _start(procs, queen_out, "queen", "--bind", "tcp://127.0.0.1:0", "--pub",
                      "tcp://127.0.0.1:0", "--json", "--hb-interval", "0.2")
    fp, _ = _start(procs, forager_out, "forager", "--queen", info["router"], "--json",
                   "--name", "traced-ant")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with Client(info["router"]) as c:
        with tracer.start_as_current_span("client.request"):
            assert c.run("echo", {"n": 1}, result_timeout=20) == {"n": 1}
        # A task submitted outside any span carries no traceparent and makes no span.
        assert c.run("echo", 2, result_timeout=20) == 2
    _procs.stop([fp, qp], timeout=10)
    assert qp.returncode == 0 and fp.returncode == 0
    (client,) = [span_record(s) for s in exporter.get_finished_spans()]
    queen = [json.loads(x) for x in queen_out.read_text().splitlines()]
    forager = [json.loads(x) for x in forager_out.read_text().splitlines()]
    assert [s["name"] for s in queen] == ["meshant.schedule"]
    assert [s["name"] for s in forager] == ["meshant.handle"]
    (qs,), (fs,) = queen, forager
    # One trace: client -> queen's scheduling span -> forager's handler span.
    assert qs["trace"] == fs["trace"] == client["trace"]
    assert qs["parent"] == client["span"]
    assert fs["parent"] == qs["span"]
    assert qs["attributes"]["meshant.forager"] == "traced-ant"
    assert fs["attributes"]["meshant.capability"] == "echo"
    assert qs["attributes"]["meshant.task"] == fs["attributes"]["meshant.task"]


def test_no_span_no_traceparent() -> None:
    from meshant.observe import tracing

    assert tracing.current() is None  # opentelemetry is installed here, but no span is open
    with tracing.span_from(None, "x", {}):
        pass


def test_without_opentelemetry_nothing_is_imported() -> None:
    # Fresh interpreters: one where opentelemetry cannot be imported, one where it is
    # installed but the program does not use it. Either way a submission carries no
    # traceparent and meshant loads nothing of opentelemetry.
    code = (
        "import sys\n"
        "if sys.argv[1] == 'blocked': sys.modules['opentelemetry'] = None\n"
        "from meshant import Client, Forager, Queen\n"
        "from meshant.observe import tracing\n"
        "q = Queen('tcp://127.0.0.1:0', 'tcp://127.0.0.1:0').start()\n"
        "f = Forager(q.endpoint, name='f'); f.add_handler('echo', lambda x: x); f.start()\n"
        "with Client(q.endpoint) as c: assert c.run('echo', 1, result_timeout=10) == 1\n"
        "f.stop(); q.stop()\n"
        "assert tracing.current() is None and not tracing.available()\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
        "print('ok')\n")
    for mode in ("blocked", "installed"):
        r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.stdout.strip() == "ok", (mode, r.stderr)
