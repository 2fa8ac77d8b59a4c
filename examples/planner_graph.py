#!/usr/bin/env python3
"""A plan that the agents grow while it runs: a planner node splits a document into
sections and spawns one summariser node per section; a final node, declared to wait for
everything the planner spawned, gathers their results — all in one file, one process.

    python examples/planner_graph.py

It starts its own queen on a free loopback port, so it needs nothing else running.
"""

from __future__ import annotations

import sys

from meshant import Client, Forager, Graph, Queen, TaskContext

DOCUMENT = """Ants forage by laying pheromone.
Shorter paths are walked more often, so their trail grows stronger.
The colony converges on the shortest path without any ant knowing it."""


def plan(text: str, ctx: TaskContext) -> int:
    sections = [s for s in text.splitlines() if s.strip()]
    ctx.spawn_many([{"name": f"summary-{i}", "capability": "summarise", "payload": s}
                    for i, s in enumerate(sections)]).result(10)
    return len(sections)


def summarise(section: str) -> str:
    return " ".join(section.split()[:4]) + "..."


def join(parts: list[str]) -> str:
    return "\n".join(f"- {p}" for p in parts)


def main() -> int:
    asked = sys.argv[1:] in (["-h"], ["--help"])
    if sys.argv[1:]:  # (an endpoint given here would be ignored: say so)
        print("usage: python examples/planner_graph.py  (no arguments: it starts its own queen "
              "on a free loopback port)", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0").start()
    agent = Forager(queen.endpoint, name="agent-1", slots=4)
    for cap, fn in (("plan", plan), ("summarise", summarise), ("join", join)):
        agent.add_handler(cap, fn)
    agent.start()
    try:
        g = Graph()
        g.node("fetch", "summarise", DOCUMENT.splitlines()[0])  # an independent branch
        g.node("planner", "plan", DOCUMENT)
        g.node("report", "join", g.spawned("planner"))
        with Client(queen.endpoint) as client:
            handle = client.submit_graph(g)
            for u in handle.updates(timeout=10):
                print(f"[{u.kind}] {u.node}")
            results = handle.result(10)
        print(results["report"])
        return 0 if results["planner"] == 3 else 1
    finally:
        agent.stop()
        queen.stop()


if __name__ == "__main__":
    sys.exit(main())
