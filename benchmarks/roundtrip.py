#!/usr/bin/env python3
"""End-to-end task round trip: meshant against raw pyzmq on the same topology.

    python benchmarks/roundtrip.py [--quick]

Sequential round-trip percentiles (one forager, trivial echo handler, direct and threaded
client) and pipelined throughput, each beside raw pyzmq measured in the same run
(client DEALER → broker ROUTER → worker DEALER and back, msgpack at each end).
The full suite, with payload sizes and transports, is `meshant bench`.
"""

from __future__ import annotations

import argparse
import json

from meshant.apps.bench import Sizes, format_table, run_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few seconds")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    report = run_suite(["roundtrip", "roundtrip-threaded", "pipelined"],
                       Sizes.quick() if args.quick else Sizes())
    rows = report.pop("_rows")
    print(json.dumps(report) if args.json else format_table(rows))


if __name__ == "__main__":
    main()
