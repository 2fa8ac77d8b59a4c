"""Starting meshant subprocesses and reading their ready line, with bounded waits."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any


def spawn(args: list[str], env: dict[str, str] | None = None,
          prefix: list[str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m meshant ARGS`` with its stdout piped (for the ready line);
    ``prefix`` runs it under another command (``ip netns exec NS``)."""
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*(prefix or []), sys.executable, "-m", "meshant", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env)


def read_json_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The next JSON line on the process's stdout, or RuntimeError after ``timeout``."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"{proc.args!r} printed no ready line within {timeout} s")
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"{proc.args!r} exited ({proc.wait()}): {err.strip()}")
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)  # type: ignore[no-any-return]
    finally:
        sel.close()


def stop(procs: list[subprocess.Popen[str]], timeout: float = 5.0) -> None:
    """SIGTERM every process, then SIGKILL whatever is still alive after ``timeout``;
    every one is waited for and its pipes closed, whatever happens to the others."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    for p in procs:
        try:
            p.wait(30)  # (killed: it ends; no zombie, no "still running" warning)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: nothing more to do from here
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                stream.close()
