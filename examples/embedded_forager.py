#!/usr/bin/env python3
"""Embedding a forager in an existing worker process: it runs in a background thread
while your program goes on doing its own work.

Run against a queen (``meshant queen`` in another terminal):

    python examples/embedded_forager.py tcp://127.0.0.1:5670
    meshant submit word_count '"the quick brown fox"'

MESHANT_QUEEN may give the endpoint instead. Set SECONDS_TO_RUN to stop after that long
(CI runs it that way); default: until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
import time

from meshant import ConfigError, Forager, MeshantError, TaskContext

USAGE = ("usage: python examples/embedded_forager.py QUEEN_ENDPOINT  (the queen's, e.g. "
         "tcp://127.0.0.1:5670 for `meshant queen`; or set MESHANT_QUEEN)")

forager = Forager(slots=2)  # its queen is the command line's, given in main()


@forager.task("word_count")
def word_count(text: str, ctx: TaskContext) -> dict[str, int]:
    words = str(text).split()
    ctx.progress(1.0, note=f"{len(words)} words")
    return {"words": len(words)}


def main() -> int:
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0
    queen = args[0] if len(args) == 1 else None if args else os.environ.get("MESHANT_QUEEN")
    if not queen:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        forager.configure(queen, discover=False)
    except ConfigError as e:
        print(f"error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        forager.start(timeout=10)  # returns once the queen has welcomed us
    except MeshantError as e:  # no queen answered within the 10 s, or it refused us
        print(f"error: {e}", file=sys.stderr)
        return 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
