"""A forager app for the durable-agent tests: each step appends a line to the file
named by MESHANT_TEST_LOG (what ran, and how often), and a step named ``hold`` waits
until the file MESHANT_TEST_GO exists (so a test kills its forager mid-run)."""

from __future__ import annotations

import os
import time
from typing import Any

from meshant import Forager, TaskContext

forager = Forager(slots=2)


def _did(what: str) -> None:
    with open(os.environ["MESHANT_TEST_LOG"], "a") as f:
        f.write(what + "\n")


def _model(i: int) -> str:
    _did(f"model {i}")
    return f"answer {i}"


def _hold() -> str:
    _did("hold")
    go = os.environ["MESHANT_TEST_GO"]
    while not os.path.exists(go):
        time.sleep(0.02)
    return "held"


@forager.task("agent")
def agent(n: int, ctx: TaskContext) -> list[Any]:
    """n model calls, a held step after the third, then a sub-task."""
    out: list[Any] = []
    # (MESHANT_TEST_DIVERGE: the handler as changed since, for `meshant replay`)
    model = "llm" if os.environ.get("MESHANT_TEST_DIVERGE") else "model"
    for i in range(n):
        out.append(ctx.step(model if i == 1 else "model", _model, i))
        if i == 2:
            out.append(ctx.step("hold", _hold))
    out.append(ctx.call("shout", out[0]))
    return out


@forager.task("shout")
def shout(text: str) -> str:
    _did(f"shout {text}")
    return text.upper()
