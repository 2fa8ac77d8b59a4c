"""Run a meshant command with the OpenTelemetry SDK recording spans in memory, written as
JSON lines to OUT when the process exits (for tests/test_tracing.py).

    python -m tests.otel_run OUT queen --bind ...
"""

from __future__ import annotations

import atexit
import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def span_record(s: object) -> dict[str, object]:
    ctx = s.context  # type: ignore[attr-defined]
    parent = s.parent  # type: ignore[attr-defined]
    return {"name": s.name, "trace": f"{ctx.trace_id:032x}",  # type: ignore[attr-defined]
            "span": f"{ctx.span_id:016x}",
            "parent": f"{parent.span_id:016x}" if parent is not None else None,
            "attributes": dict(s.attributes or {})}  # type: ignore[attr-defined]


def main() -> None:
    out = sys.argv[1]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def dump() -> None:
        with open(out, "w") as f:
            for s in exporter.get_finished_spans():
                f.write(json.dumps(span_record(s)) + "\n")

    atexit.register(dump)
    from meshant.cli import main as cli

    cli(sys.argv[2:], prog_name="meshant")


if __name__ == "__main__":
    main()
