"""The forager ``meshant bench -s steps`` starts: echo, and ``steps``, a durable handler
making ``{"steps": N}`` trivial steps (each a record journaled with its task)."""

from __future__ import annotations

from typing import Any

from meshant.actors.forager import Forager
from meshant.actors.handlers import TaskContext
from meshant.apps.builtin import add_builtins

forager = Forager()
add_builtins(forager, ["echo"])


def _step(i: int) -> int:
    return i + 1


@forager.task("steps")
def steps(payload: Any, ctx: TaskContext) -> int:
    """Make {"steps": N} (default 10) trivial durable steps; returns N."""
    n = int(payload.get("steps", 10)) if isinstance(payload, dict) else 10
    i = 0
    for _ in range(n):
        i = ctx.step("s", _step, i)
    return i


__all__ = ["forager"]
