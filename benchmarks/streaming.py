#!/usr/bin/env python3
"""Token streams from many tasks through one queen to many clients, against a raw pyzmq
relay of the same messages in the same run (#26's streaming target).

    python -m benchmarks.streaming [--tasks 10] [--partials 2000] [--rounds 3]
                                   [--progress] [--journal :memory:|file] [--json]

See ``meshant/apps/bench_streaming.py`` for what each side runs (``meshant bench -s
streaming`` is one round of the same). Rounds alternate meshant and raw; medians are
printed. The target: meshant's partials per second at least 2x the raw relay's messages
per second (raw sends one message per token; meshant may batch a turn's partials per
client). ``--progress``: a progress report after each partial, as the built-in
``stream`` does by default (they are not counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meshant.apps.bench_streaming import round_once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--partials", type=int, default=2000, help="partials per task")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--progress", action="store_true", help="a progress report after "
                    "each partial (not counted: the rate is of partials)")
    ap.add_argument("--journal", default=":memory:", help="':memory:' or 'file' (a fresh one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rates: dict[str, list[float]] = {"meshant": [], "raw": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            journal = args.journal if args.journal == ":memory:" else f"{d}/j{r}.db"
            m, raw = round_once(args.tasks, args.partials, args.progress, journal)
            rates["meshant"].append(m)
            rates["raw"].append(raw)
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {"tasks": args.tasks, "partials_per_task": args.partials, "journal": args.journal,
           "progress": args.progress, "rounds": args.rounds,
           "meshant_partials_per_s": round(med["meshant"]),
           "raw_msgs_per_s": round(med["raw"]), "ratio": round(med["meshant"] / med["raw"], 2),
           "target": 2.0}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.tasks} streams x {args.partials} partials"
          f"{' (+ a progress report each)' if args.progress else ''}, {args.rounds} rounds "
          f"(medians), journal {args.journal}")
    print(f"  meshant  {out['meshant_partials_per_s']:>9,} partials/s")
    print(f"  raw      {out['raw_msgs_per_s']:>9,} messages/s")
    print(f"  ratio    {out['ratio']:.2f}x raw (target >= 2x)")


if __name__ == "__main__":
    main()
