"""The forager app of benchmarks/rate_failover.py.

``rated``: appends one line ``TASK N PID START`` (START: the wall clock, time.time(), as
the handler starts) to its own file in MESHANT_RATE_LOG_DIR (one file a forager
process, so no two writers share one), and returns ``2 * N + 1``, which the benchmark
checks. It does nothing else: what is measured is when tasks are let through the
queen's rate limit, not how long they take.
"""

from __future__ import annotations

import os
import time

from meshant import Forager, TaskContext

forager = Forager(slots=int(os.environ.get("MESHANT_RATE_SLOTS", "4")))
_fd: int | None = None


def _log_fd() -> int:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["MESHANT_RATE_LOG_DIR"], f"starts-{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


@forager.task("rated")
def rated(n: int, ctx: TaskContext) -> int:
    # One write(2) with O_APPEND per start: a line is whole even if the forager dies.
    os.write(_log_fd(), f"{ctx.task_id} {n} {os.getpid()} {time.time():.6f}\n".encode())
    return 2 * n + 1
