"""One module imported by the forager and by its clients (issue #24, item 4): the
decorated handlers are the call sites, and mypy checks both sides against them."""

from __future__ import annotations

import os

from meshant import Forager, TaskContext

forager = Forager(os.environ.get("SHARED_QUEEN", "tcp://127.0.0.1:1"), name="shared")


@forager.task("summarise")
def summarise(text: str, ctx: TaskContext) -> dict[str, int]:
    ctx.partial(text[:3])
    return {"words": len(text.split())}


@forager.task("square")
async def square(n: int) -> int:
    return n * n


@forager.task("embed", batch=8)
def embed(texts: list[str]) -> list[list[float]]:
    return [[float(len(t))] for t in texts]
