"""``meshant replay``: a durable task's handler run again on this machine against the
steps its colony recorded — each step recorded vs replayed, stopping at the first
divergence (the handler no longer makes the steps it made) or where the record ends
(nothing past it runs: those steps would be real model and tool calls)."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any

from meshant import protocol as p
from meshant.actors.durable import Diverged, Suspend
from meshant.actors.handlers import Handler, TaskContext
from meshant.core.tasks.steps import Divergence, describe


class EndOfRecord(BaseException):
    """The run reached a step past the record: it stops before running it."""


@dataclass(slots=True)
class Line:
    """One step as the replay met it."""

    position: int
    recorded: str | None  # "kind 'name' #n" of the record there, None past the record
    replayed: str  # what this run asked for
    same: bool
    outcome: str = ""  # the recorded value or error, shortly


@dataclass(slots=True)
class Replayed:
    """What a replay found: each step, and how it ended (``end``: ``completed`` the
    handler returned, ``diverged``, ``end-of-record``, ``suspended``, ``failed``)."""

    lines: list[Line] = field(default_factory=list)
    end: str = ""
    detail: str = ""
    result: Any = None


class _Link:
    """The forager a replayed handler sees: it records, sends nothing."""

    features = frozenset({"progress", "steps"})

    def send_message(self, msg: p.Message) -> None:
        pass


def _short(v: Any, most: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= most else s[:most - 1] + "…"


def replay(handler: Handler, payload: Any, task_id: str, steps: list[dict[str, Any]],
           capability: str = "") -> Replayed:
    """Run ``handler`` on ``payload`` with the recorded ``steps``; never past them."""
    out = Replayed()
    ctx = TaskContext(_Link(), f"{task_id}.replay", task_id, 0, capability, None)
    ctx._durable = handler.durable
    ctx.recorded(steps)
    assert ctx._steps is not None

    def watch(pos: int, kind: str, name: str, occ: int,
              rec: dict[str, Any] | Divergence | None) -> None:
        asked = describe(kind, name, occ)
        if rec is None:
            out.lines.append(Line(pos, None, asked, False))
            raise EndOfRecord()
        if isinstance(rec, Divergence):
            out.lines.append(Line(pos, rec.recorded, asked, False))
            return
        what = (f"raised {rec['error'].get('type')}: {rec['error'].get('message')}"
                if isinstance(rec.get("error"), dict) else _short(rec.get("value")))
        out.lines.append(Line(pos, asked, asked, True, what))
    ctx._steps.watch = watch
    try:
        r = handler.fn(payload, ctx) if handler.takes_ctx else handler.fn(payload)
        if inspect.isawaitable(r):
            r = asyncio.run(_awaited(r))
        out.end, out.result = "completed", r
    except EndOfRecord:
        out.end = "end-of-record"
    except Diverged as d:
        out.end, out.detail = "diverged", d.message
    except Suspend as s:
        out.end, out.detail = "suspended", str(s.wait)
    except Exception as e:
        out.end, out.detail = "failed", f"{type(e).__name__}: {e}"
    return out


async def _awaited(r: Any) -> Any:
    return await r


__all__ = ["EndOfRecord", "Line", "Replayed", "replay"]
