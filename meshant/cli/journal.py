"""Commands reading the queen's journal file directly (no queen needed): ``tasks``,
``task`` and ``journal verify``."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from meshant.cli._options import JSON_OPT, jsonable

JOURNAL_OPT = click.option("--journal", metavar="PATH|URL", envvar="MESHANT_JOURNAL",
                           default="meshant-queen.db", show_default=True, show_envvar=True,
                           help="The queen's journal: its SQLite file, or its PostgreSQL "
                                "database (postgresql://USER@HOST:PORT/DB). Read-only here.")


def _open_journal(path: str) -> Any:
    from meshant.storage import JournalError, is_postgres, open_journal

    if not is_postgres(path) and not os.path.exists(path):
        raise click.ClickException(f"no journal at {path} (give --journal PATH or a "
                                   "postgresql:// URL)")
    try:
        return open_journal(path, readonly=True)
    except JournalError as e:
        raise click.ClickException(str(e)) from None


@click.command()
@JOURNAL_OPT
@click.option("--state", help="Only tasks in this state (queued, assigned, completed, ...).")
@click.option("--capability", help="Only tasks of this capability.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@JSON_OPT
def tasks(journal: str, state: str | None, capability: str | None, limit: int,
          as_json: bool) -> None:
    """List journaled tasks, newest first."""
    j = _open_journal(journal)
    try:
        rows = j.tasks(state, capability, limit)
    finally:
        j.close()
    for r in rows:
        if as_json:
            click.echo(json.dumps({k: r[k] for k in ("id", "capability", "state", "attempt",
                                                     "forager", "client_name", "priority",
                                                     "created", "updated")}))
        else:
            click.echo(f"{r['id']:24} {r['state']:10} {r['capability']:16} attempt "
                       f"{r['attempt']}  {r['forager'] or '-'}")


@click.command()
@JOURNAL_OPT
@click.argument("task_id")
@click.option("--verify", is_flag=True, help="Check the task's history hash chain.")
@JSON_OPT
def task(journal: str, task_id: str, verify: bool, as_json: bool) -> None:
    """One task's whole history as a timeline."""
    j = _open_journal(journal)
    try:
        t = j.task(task_id)
        problems = j.verify(task_id) if verify else []
    finally:
        j.close()
    if t is None:
        raise click.ClickException(f"no task {task_id!r} in {j.path}")
    if as_json:
        click.echo(json.dumps({"id": t["id"], "state": t["state"], "events": t["events"],
                               "final": t["final"], "problems": problems},
                              default=jsonable))
    else:
        click.echo(f"task {t['id']} ({t['capability']}) from {t['client_name']}: {t['state']}")
        t0 = t["events"][0]["ts"] if t["events"] else 0.0
        for e in t["events"]:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"]))
            click.echo(f"  {stamp} +{e['ts'] - t0:8.3f}s  {e['state']:10} {e['why']}")
        if verify:
            click.echo("  history intact" if not problems else "\n".join(
                f"  TAMPERED: {x}" for x in problems))
    if problems:
        sys.exit(1)


@click.group("journal")
def journal_group() -> None:
    """Look after the queen's journal."""


@journal_group.command("verify")
@JOURNAL_OPT
def journal_verify(journal: str) -> None:
    """Check every task's history hash chain; exit 1 if anything was altered or removed."""
    j = _open_journal(journal)
    try:
        problems = j.verify()
    finally:
        j.close()
    for x in problems:
        click.echo(x)
    click.echo(f"{len(problems)} problem(s) in {j.path}", err=True)
    sys.exit(1 if problems else 0)


COMMANDS = [tasks, task, journal_group]
