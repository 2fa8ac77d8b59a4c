#!/usr/bin/env python3
"""A handler that streams partial results, the way a language-model agent streams tokens,
and a client that prints them as they arrive — all in one file, one process.

    python examples/streaming_agent.py

It starts its own queen on a free loopback port, so it needs nothing else running.
"""

from __future__ import annotations

import sys
import time

from meshant import Client, Forager, Queen, TaskContext

PROMPT_REPLY = "Ants find the shortest path by laying pheromone and following the strongest."


def fake_llm(prompt: str, ctx: TaskContext) -> str:
    out = []
    for token in PROMPT_REPLY.split():
        if ctx.is_cancelled:
            break
        time.sleep(0.02)  # the model "thinking"
        ctx.partial(token + " ")
        out.append(token)
    return " ".join(out)


def main() -> int:
    asked = sys.argv[1:] in (["-h"], ["--help"])
    if sys.argv[1:]:  # (an endpoint given here would be ignored: say so)
        print("usage: python examples/streaming_agent.py  (no arguments: it starts its own queen "
              "on a free loopback port)", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0").start()
    agent = Forager(queen.endpoint, name="llm-1")
    agent.add_handler("generate", fake_llm)
    agent.start()
    try:
        with Client(queen.endpoint) as client:
            fut = client.submit("generate", "how do ants find food?")
            for update in fut.updates(timeout=10):
                if update.kind == "partial":
                    sys.stdout.write(update.value)
                    sys.stdout.flush()
            print()
            final = fut.result(10)
            assert final == PROMPT_REPLY.strip(), final
    finally:
        agent.stop()
        queen.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
