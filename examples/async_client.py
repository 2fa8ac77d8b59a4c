#!/usr/bin/env python3
"""An asyncio client: submit many tasks concurrently and await their results.

    meshant queen &  meshant forager --slots 4 &
    python examples/async_client.py tcp://127.0.0.1:5670

With no argument it starts its own queen and forager in-process on a free port.
"""

from __future__ import annotations

import asyncio
import sys

from meshant import AsyncClient, Forager, Queen
from meshant.apps.builtin import add_builtins


async def run(endpoint: str) -> list[object]:
    async with AsyncClient(endpoint) as client:
        results = await asyncio.gather(*(client.submit("echo", {"n": n}) for n in range(50)))
        status = await client.status()
        print(f"{len(results)} results; queen has {len(status['foragers'])} forager(s)")
        return list(results)


def main() -> int:
    if len(sys.argv) > 1:
        asyncio.run(run(sys.argv[1]))
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
