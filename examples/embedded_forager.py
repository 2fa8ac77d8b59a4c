#!/usr/bin/env python3
"""Embedding a forager in an existing worker process: it runs in a background thread
while your program goes on doing its own work.

Run against a queen (``meshant queen`` in another terminal):

    python examples/embedded_forager.py tcp://127.0.0.1:5670
    meshant submit word_count '"the quick brown fox"'

Set SECONDS_TO_RUN to stop after that long (CI runs it that way); default: until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
import time

from meshant import Forager, TaskContext

forager = Forager(sys.argv[1] if len(sys.argv) > 1 else None, slots=2)


@forager.task("word_count")
def word_count(text: str, ctx: TaskContext) -> dict[str, int]:
    words = str(text).split()
    ctx.progress(1.0, note=f"{len(words)} words")
    return {"words": len(words)}


def main() -> None:
    forager.start(timeout=10)  # returns once the queen has welcomed us
    print(json.dumps({"event": "ready", "name": forager.name}), flush=True)
    deadline = time.monotonic() + float(os.environ.get("SECONDS_TO_RUN", "inf"))
    try:
        # The host program's own loop: here it only prints how busy the forager is.
        while time.monotonic() < deadline:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        forager.stop()


if __name__ == "__main__":
    main()
