"""A newcomer's first day on the command line (issue #34): what a person sees when a name
is taken, a task asks a question, a capability is mistyped from a script, an --app is
not found, a task is cancelled while it asks, an extra is missing, and what the listing
commands accept and show. Every test drives `meshant` (or an example) as a subprocess,
as a user types it, against a real queen and foragers on free loopback ports."""

from __future__ import annotations

import select
import signal
import time
from typing import Any

import pytest

from .conftest import Procs

pytestmark = pytest.mark.slow


def _lines_until(stream: Any, until: str, timeout: float = 30) -> list[str]:
    """Lines read from a process's pipe until one contains ``until`` (or the pipe ends, or
    ``timeout`` passes: the caller's assertion then says what was missing)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(until in x for x in seen):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            break
        line = stream.readline()
        if not line:
            break
        seen.append(line)
    return seen


def _slow_liveness_queen(procs: Procs) -> str:
    """A queen that holds a silent peer's name 10 s (1 s heartbeats, 10 missed): longer
    than the 2 s after which a missing queen would be said, and than a forager takes to
    start on a busy machine."""
    return procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                       "--json", "--hb-interval", "1", "--hb-misses", "10")[1]["router"]


# -- 1: a name in use -----------------------------------------------------------------------

def test_a_name_in_use_is_said_at_once_not_as_a_missing_queen(procs: Procs) -> None:
    ep = _slow_liveness_queen(procs)
    first, _ = procs.forager(ep, "--name", "taken")
    p, _ = procs.start("forager", "--queen", ep, "--name", "taken", ready=False)
    assert p.wait(60) == 1
    assert p.stderr is not None
    lines = p.stderr.read().splitlines()
    held = [i for i, x in enumerate(lines) if "'taken' is held by a live peer" in x
            and "Asking once more" in x and "earlier life" in x]
    final = [i for i, x in enumerate(lines) if x.startswith("Error:")]
    # The name is named first, while it waits; then the refusal; never "is it running?".
    assert held and final and held[0] < final[0], lines
    assert "held by a live peer" in lines[final[0]]
    assert not any("is it running" in x or "still waiting" in x for x in lines), lines
    # A dead earlier life: the same words, then it joins once the name is free.
    first.send_signal(signal.SIGKILL)
    first.wait(20)
    again, info = procs.forager(ep, "--name", "taken")
    assert info["name"] == "taken"
    again.send_signal(signal.SIGINT)
    assert again.wait(20) == 0
    assert again.stderr is not None
    err = again.stderr.read()
    assert "Asking once more" in err and "is it running" not in err, err
