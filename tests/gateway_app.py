"""Capabilities the gateway tests serve with ``meshant forager --app tests.gateway_app``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from meshant import Forager
from meshant.actors.handlers import TaskContext

forager = Forager()


class Sum(TypedDict):
    a: int
    b: int


@forager.task("add")
def add(payload: Sum) -> int:
    """Add two integers."""
    return payload["a"] + payload["b"]


@forager.task("echo")
def echo(payload: Any) -> Any:
    """Return the payload as it came."""
    return payload


@forager.task("greet")
def greet(payload: Any, ctx: TaskContext) -> str:
    """Ask for a name, then greet it."""
    name = ctx.ask("What is your name?")
    return f"hello, {name}"


@forager.task("words")
def words(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    """Stream the words of payload.text, one every payload.delay seconds."""
    ws = str(payload.get("text", "")).split()
    for i, w in enumerate(ws):
        if ctx.cancelled.wait(float(payload.get("delay", 0.01))):
            raise RuntimeError("cancelled")
        ctx.partial(w)
        ctx.progress((i + 1) / len(ws), note=w)
    return {"words": len(ws)}


@forager.task("counted")
def counted(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    """Stream payload.n numbered partials slowly; every run is counted in payload.log
    (a file), so a test sees a task run twice. With payload.gate (a path), partial
    number payload.gate_at waits until that file exists: the test says when to go on."""
    with Path(payload["log"]).open("a") as f:
        f.write(f"{ctx.task_id} {ctx.attempt}\n")
    gate = payload.get("gate")
    for i in range(int(payload["n"])):
        if gate is not None and i == int(payload.get("gate_at", 0)):
            while not Path(gate).exists():
                if ctx.cancelled.wait(0.02):
                    raise RuntimeError("cancelled")
        if ctx.cancelled.wait(float(payload.get("delay", 0.05))):
            raise RuntimeError("cancelled")
        ctx.partial(i)
    return {"n": int(payload["n"])}




@forager.task("hold")
def hold(payload: Any, ctx: TaskContext) -> str:
    """Run until cancelled (at most payload seconds, default 60)."""
    seconds = float(payload) if isinstance(payload, int | float) else 60.0
    if ctx.cancelled.wait(seconds):
        raise RuntimeError("cancelled")
    return "held"


@forager.task("explode")
def explode(payload: Any) -> Any:
    """Fail with a ValueError carrying the payload."""
    raise ValueError(str(payload))
