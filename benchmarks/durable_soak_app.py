"""The forager app of benchmarks/durable_soak.py (and benchmarks/peers/compare_steps.py).

``soak``: STEPS durable steps (``ctx.step``), each appending one line ``TASK STEP PID
START`` to the file named by MESHANT_SOAK_LOG as it starts, then sleeping a random
0-MESHANT_SOAK_STEP_MS ms (so a SIGKILL lands inside a step as often as between two), with
a random 0-MESHANT_SOAK_GAP_MS ms pause between steps. Its result is the list of the
steps' values (``n * 100 + i``), which the soak checks.

``steps10`` / ``plain``: the cost benchmark's 10 trivial steps and a plain task.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from meshant import Forager, TaskContext

STEPS = 10
forager = Forager(slots=int(os.environ.get("MESHANT_SOAK_SLOTS", "4")))
_STEP_S = float(os.environ.get("MESHANT_SOAK_STEP_MS", "20")) / 1000
_GAP_S = float(os.environ.get("MESHANT_SOAK_GAP_MS", "10")) / 1000
_fd: int | None = None


def _log_fd() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["MESHANT_SOAK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                      0o644)
    return _fd


def _step(task_id: str, n: int, i: int, pause: float) -> int:
    # One write(2) with O_APPEND: lines of concurrent foragers never interleave.
    os.write(_log_fd(), f"{task_id} {i} {os.getpid()} {time.time():.6f}\n".encode())
    if pause:
        time.sleep(pause)
    return n * 100 + i


@forager.task("soak")
def soak(n: int, ctx: TaskContext) -> list[Any]:
    out = []
    for i in range(STEPS):
        out.append(ctx.step(f"s{i}", _step, ctx.task_id, n, i, random.uniform(0, _STEP_S)))
        time.sleep(random.uniform(0, _GAP_S))
    return out


@forager.task("soak_plain")
def soak_plain(n: int, ctx: TaskContext) -> list[Any]:
    """``soak`` without durable steps (the control: ``durable_soak.py --no-steps``)."""
    out = []
    for i in range(STEPS):
        out.append(_step(ctx.task_id, n, i, random.uniform(0, _STEP_S)))
        time.sleep(random.uniform(0, _GAP_S))
    return out


def _trivial(i: int) -> int:
    return i


@forager.task("steps10")
def steps10(n: int, ctx: TaskContext) -> int:
    total = 0
    for i in range(10):
        total += ctx.step("trivial", _trivial, i)
    return n + total


@forager.task("plain")
def plain(n: int) -> int:
    return n + 45
