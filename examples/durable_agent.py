#!/usr/bin/env python3
"""A durable agent: a handler whose model and tool calls are journaled steps, so a re-run
of its task (its forager killed, its queen restarted, the task woken from a wait) gets
their recorded results back instead of calling them again — all in one file, one process.

    python examples/durable_agent.py

The agent plans with a (simulated) model, searches with a (simulated) tool, sleeps
without holding its slot, hands the summary to a sub-task, and asks a person to approve
it: a durable question, so the task waits suspended, not running. Each wait ends a run;
the task runs again when the wait is over and replays what it recorded. The counts at
the end show that each model or tool call ran once although the handler ran four times.

It starts its own queen on a free loopback port, with a journal in a temporary
directory, so it needs nothing else running. See docs/durable.md.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from meshant import Client, Forager, Queen, TaskContext

CALLS: Counter[str] = Counter()  # what really ran: each model or tool call
RUNS: list[int] = []  # each run of the agent's handler (its attempt number)


def fake_model(prompt: str) -> dict[str, Any]:
    """Stands in for a language-model call (slow, costly, not deterministic)."""
    CALLS["model"] += 1
    return {"queries": [f"{prompt} pheromone", f"{prompt} shortest path"]}


def fake_search(query: str) -> str:
    """Stands in for a tool call (a web search)."""
    CALLS["search"] += 1
    return f"3 papers about {query.split()[-1]}"


def agent(question: str, ctx: TaskContext) -> dict[str, Any]:
    """A durable agent: every call that costs something goes through ``ctx.step``."""
    RUNS.append(ctx.attempt)
    plan = ctx.step("plan", fake_model, question)
    notes = [ctx.step("search", fake_search, q) for q in plan["queries"]]
    ctx.sleep(0.3)  # a rate limit, a back-off: the slot is free meanwhile
    summary = ctx.call("summarise", notes)  # a sub-task; this run waits suspended
    approved = ctx.ask(f"publish {summary!r}?", data={"notes": notes})  # durable
    return {"summary": summary, "approved": approved}


def summarise(notes: list[str]) -> str:
    CALLS["summarise"] += 1
    return "; ".join(notes)


def main() -> int:
    asked = sys.argv[1:] in (["-h"], ["--help"])
    if sys.argv[1:]:  # (an endpoint given here would be ignored: say so)
        print("usage: python examples/durable_agent.py  (no arguments: it starts its own queen "
              "on a free loopback port)", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    with tempfile.TemporaryDirectory() as tmp:
        journal = str(Path(tmp) / "queen.db")
        queen = Queen("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", journal=journal).start()
        # One slot: the agent's waits free it, so this forager also runs its sub-task.
        forager = Forager(queen.endpoint, name="agent-1", slots=1)
        forager.add_handler("research", agent, durable=True)
        forager.add_handler("summarise", summarise)
        forager.start()
        try:
            with Client(queen.endpoint) as client:
                fut = client.submit("research", "how do ants find food")
                for u in fut.updates(timeout=10):
                    if u.kind == "input-required":
                        print(f"the agent asks: {u.note}")
                        client.answer(fut.task_id, "yes", request=u.request)
                result = fut.result(10)
                print(f"result: {result}")
                status = client.task_status(fut.task_id)
            print(f"{len(RUNS)} runs of the handler; what really ran: {dict(CALLS)}")
            for s in status.get("steps", []):
                extra = f"  sub-task {s['child']}" if s.get("child") else ""
                print(f"  step {s['position']}: {s['kind']:5} {s['name']} "
                      f"#{s['occurrence']}{extra}")
        finally:
            forager.stop()
            queen.stop()
    ok = result["approved"] == "yes" and CALLS == {"model": 1, "search": 2, "summarise": 1}
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
