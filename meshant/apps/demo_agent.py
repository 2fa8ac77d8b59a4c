"""The forager ``meshant demo`` starts: the demo capabilities, and ``agent``, a durable
agent loop (a fake model's calls as ``ctx.step``s) that the demo kills mid-loop."""

from __future__ import annotations

import os
import time
from typing import Any

from meshant.actors.forager import Forager
from meshant.actors.handlers import TaskContext
from meshant.apps.builtin import add_builtins

forager = Forager()


def _think(log: str, task: str, i: int, seconds: float) -> str:
    """A model call: it takes a while, and leaves a line in ``log`` each time it runs."""
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{task} {i} {os.getpid()}\n")
    return f"thought {i}"


@forager.task("agent")
def agent(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    """{"steps": N, "seconds": S, "log": FILE}: N model calls of S seconds each, every
    one a durable step: a re-run (its forager killed) replays those it recorded."""
    p = payload if isinstance(payload, dict) else {}
    n, seconds, log = int(p.get("steps", 8)), float(p.get("seconds", 0.1)), str(p["log"])
    thoughts = [ctx.step("think", _think, log, ctx.task_id, i, seconds) for i in range(n)]
    return {"thoughts": len(thoughts), "attempt": ctx.attempt}


add_builtins(forager)

__all__ = ["forager"]
