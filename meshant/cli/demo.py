"""``meshant demo``: a local colony doing real work."""

from __future__ import annotations

import sys

import click

from meshant.cli._options import JSON_OPT


@click.command()
@click.option("--foragers", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--tasks", type=click.IntRange(10), default=300, show_default=True,
              help="Echo tasks in the mixed workload.")
@JSON_OPT
def demo(foragers: int, tasks: int, as_json: bool) -> None:
    """Run a local colony doing real work: a queen and foragers as subprocesses.

    Runs a mixed workload (echo at mixed priorities, a streamed result, sleeps, a
    failure, a durable agent whose forager is killed mid-loop and whose re-run makes
    none of its journaled steps again, and a forager killed mid-task whose work moves
    on), prints a summary with
    latency percentiles, stops everything it started and exits 0 on success.
    """
    from meshant.apps.demo import run_demo

    ok = run_demo(foragers=foragers, tasks=tasks, as_json=as_json)
    sys.exit(0 if ok else 1)


COMMANDS = [demo]
