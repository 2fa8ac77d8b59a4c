#!/usr/bin/env python3
"""An asyncio client: submit many tasks concurrently and await their results.

    meshant queen &  meshant forager --slots 4 &
    python examples/async_client.py tcp://127.0.0.1:5670

With no argument it starts its own queen and forager in-process on a free port.
"""

from __future__ import annotations

import asyncio
import sys

from meshant import AsyncClient, ConfigError, Forager, MeshantError, Queen
from meshant.apps.builtin import add_builtins

USAGE = "usage: python examples/async_client.py [QUEEN_ENDPOINT]  (none: its own queen)"


async def run(endpoint: str) -> list[object]:
    async with AsyncClient(endpoint) as client:
        results = await asyncio.gather(*(client.submit("echo", {"n": n}) for n in range(50)))
        status = await client.status()
        print(f"{len(results)} results; queen has {len(status['foragers'])} forager(s)")
        return list(results)


def main() -> int:
    args = sys.argv[1:]
    if len(args) > 1 or args[:1] in (["-h"], ["--help"]):
        print(USAGE, file=sys.stderr if len(args) > 1 else sys.stdout)
        return 2 if len(args) > 1 else 0
    if args:
        try:
            asyncio.run(run(args[0]))
        except ConfigError as e:  # not an endpoint
            print(f"error: {e}\n{USAGE}", file=sys.stderr)
            return 2
        except MeshantError as e:  # no queen answered, or the work failed
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0").start()
    forager = Forager(queen.endpoint, slots=4)
    add_builtins(forager, ["echo"])
    forager.start()
    try:
        results = asyncio.run(run(queen.endpoint))
        assert results == [{"n": n} for n in range(50)]
    finally:
        forager.stop()
        queen.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
