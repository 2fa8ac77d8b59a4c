#!/usr/bin/env python3
"""Codec micro-benchmark: IACP/2 encode+decode of a typical task.assign and task.result,
against plain ``msgpack.packb``/``unpackb`` of the same dict, in the same run.

    python benchmarks/codec_bench.py [--seconds 1.0] [--json]

The ratio (codec time / msgpack time) is the codec's overhead over the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgpack

from meshant.protocol import Message, binary

ASSIGN = Message("task.assign", {"task": "c5d1e2f3a4b5-42", "attempt": 1,
                                 "capability": "crawl",
                                 "payload": {"url": "https://example.invalid/a/b", "depth": 2,
                                             "tags": ["x", "y"]}},
                 id="c5d1e2f3a4b5-42.1", frm="queen", to="forager-07", ts=1764500000.25)
RESULT = Message("task.result", {"status": "ok", "result": {"pages": 12, "bytes": 48213,
                                                             "links": ["a", "b", "c"]}},
                 id="9a8b7c6d5e4f-17", frm="forager-07", to="queen", ts=1764500000.5,
                 ref="c5d1e2f3a4b5-42.1")


def as_dict(m: Message) -> dict[str, Any]:
    d = {"v": m.v, "id": m.id, "from": m.frm, "to": m.to, "kind": m.kind, "ts": m.ts,
         "body": m.body}
    if m.ref:
        d["ref"] = m.ref
    return d


def rate(fn: Callable[[], Any], seconds: float) -> float:
    n = 0
    batch = 500
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(batch):
            fn()
        n += batch
        now = time.perf_counter()
        if now >= end:
            return n / (now - t0)


def run(seconds: float = 1.0, rounds: int = 10) -> list[dict[str, Any]]:
    """Codec and floor take turns in ``rounds`` slices; each figure is the median slice,
    so drifts in machine load fall on both alike."""
    rows = []
    packb, unpackb = msgpack.packb, msgpack.unpackb
    for name, msg in (("task.assign", ASSIGN), ("task.result", RESULT)):
        d = as_dict(msg)
        floor_fn = lambda d=d: unpackb(packb(d))  # noqa: E731
        ours_fn = lambda msg=msg: binary.decode(binary.encode(msg))  # noqa: E731
        rate(floor_fn, seconds / 10)  # warm-up
        rate(ours_fn, seconds / 10)
        floors, ours = [], []
        for _ in range(rounds):
            floors.append(rate(floor_fn, seconds / rounds))
            ours.append(rate(ours_fn, seconds / rounds))
        ratios = sorted(f / o for f, o in zip(floors, ours, strict=True))
        rows.append({"message": name, "codec_ops_per_s": round(statistics.median(ours)),
                     "msgpack_ops_per_s": round(statistics.median(floors)),
                     "ratio": round(ratios[len(ratios) // 2], 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    rows = run(args.seconds)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'message':12} {'IACP/2 ops/s':>14} {'msgpack ops/s':>14} {'cost ratio':>11}")
    for r in rows:
        print(f"{r['message']:12} {r['codec_ops_per_s']:>14,} {r['msgpack_ops_per_s']:>14,} "
              f"{r['ratio']:>10.2f}x")


if __name__ == "__main__":
    main()
