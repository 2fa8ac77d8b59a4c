"""The forager of ``benchmarks/streaming.py``: ``tokens`` streams payload.n partial results
as fast as the handler can make them, as a model streaming tokens would at its best."""

from __future__ import annotations

from typing import Any

from meshant import Forager
from meshant.actors.handlers import TaskContext

forager = Forager()


@forager.task("tokens")
def tokens(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Stream payload.n partial results (the token's index), each followed by a
    progress report when payload.progress, then return n."""
    n = int(payload["n"])
    progress = bool(payload.get("progress"))
    for i in range(n):
        ctx.partial(i)
        if progress:
            ctx.progress((i + 1) / n)
    return n
