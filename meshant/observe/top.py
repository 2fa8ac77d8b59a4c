"""``meshant top``: the colony on a terminal, like ``htop`` or ``celery events``.

:func:`frame` is pure — a status (what ``meshant status`` gets from the queen), the one
before it and the seconds between them in, the lines to show out — so it is tested
without a terminal. :func:`run` is the thin full-screen driver: the alternate screen,
a redraw every ``interval``, ``q`` (or Ctrl-C) to quit, the terminal restored on the way out.
"""

from __future__ import annotations

import os
import select
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def _ago(s: float) -> str:
    return f"{s * 1000:.0f}ms" if s < 1 else f"{s:.1f}s" if s < 120 else f"{s / 60:.0f}m"


def _done(st: dict[str, Any]) -> int:
    c = st.get("counters", {})
    return int(c.get("completed", 0)) + int(c.get("failed", 0)) + int(c.get("cancelled", 0))


def frame(st: dict[str, Any], prev: dict[str, Any] | None = None, dt: float = 0.0,
          width: int = 100, height: int = 40) -> list[str]:
    """The lines of one screen: the queen, the totals and throughput, the queues, then
    one line per forager (as many as fit)."""
    q = st.get("queen", {})
    c = st.get("counters", {})
    rate = "-"
    if prev is not None and dt > 0:
        rate = f"{max(0, _done(st) - _done(prev)) / dt:.1f}/s"
    foragers = st.get("foragers", [])
    slots = sum(f["slots"] for f in foragers if f["state"] == "active")
    busy = sum(f["in_flight"] for f in foragers)
    lines = [
        f"meshant top — queen {q.get('name', '?')} ({st.get('role', 'leader')}) colony "
        f"{q.get('colony', '?')}  up {_ago(float(q.get('uptime', 0)))}  {q.get('endpoint', '')}",
        f"throughput {rate}  tasks: submitted {c.get('submitted', 0)}  completed "
        f"{c.get('completed', 0)}  failed {c.get('failed', 0)}  cancelled "
        f"{c.get('cancelled', 0)}  reissued {c.get('reissued', 0)}",
        f"now:   queued {st.get('queued', 0)}  running {st.get('running', 0)}  "
        f"slots {busy}/{slots} busy  foragers {len(foragers)}  clients {st.get('clients', 0)}"
        f"  dead letters {st.get('dead_letters', 0)}",
    ]
    queues = st.get("queues", {})
    lines.append("queues: " + ("  ".join(f"{k}={v}" for k, v in sorted(queues.items()))
                               if queues else "empty"))
    br = st.get("breakers", {})
    open_ = [f"forager {k} {v}" for k, v in br.get("foragers", {}).items()] + [
        f"capability {k} {v}" for k, v in br.get("capabilities", {}).items()]
    if open_:
        lines.append("breakers: " + ", ".join(open_))
    lines.append("")
    lines.append(f"{'FORAGER':<24} {'STATE':<9} {'SLOTS':>5} {'BUSY':>4} {'SEEN':>7}  TOOLS")
    room = max(1, height - len(lines) - 1)
    for f in sorted(foragers, key=lambda f: f["name"])[:room]:
        bar = "#" * f["in_flight"] + "." * max(0, f["slots"] - f["in_flight"])
        lines.append(f"{f['name'][:24]:<24} {f['state']:<9} {f['slots']:>5} "
                     f"{f['in_flight']:>4} {_ago(f['last_seen_age']):>7}  "
                     f"{' '.join(f['tools'])}  [{bar[:20]}]")
    if len(foragers) > room:
        lines.append(f"... and {len(foragers) - room} more")
    return [ln[:width] for ln in lines]


def run(fetch: Callable[[], dict[str, Any]], interval: float = 1.0,
        out: TextIO = sys.stdout) -> None:
    """Redraw every ``interval`` seconds until ``q`` is pressed (or Ctrl-C)."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    out.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, no cursor
    prev: dict[str, Any] | None = None
    t_prev = 0.0
    try:
        tty.setcbreak(fd)
        while True:
            st = fetch()
            now = time.monotonic()
            size = shutil.get_terminal_size()
            lines = frame(st, prev, now - t_prev if prev else 0.0, size.columns,
                          size.lines - 1)
            lines.append("q quits")
            out.write("\x1b[H\x1b[2J" + "\n".join(lines))
            out.flush()
            prev, t_prev = st, now
            deadline = now + interval
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([fd], [], [], left)
                if ready and os.read(fd, 1) in (b"q", b"Q"):
                    return
    except KeyboardInterrupt:
        return
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()


__all__ = ["frame", "run"]
