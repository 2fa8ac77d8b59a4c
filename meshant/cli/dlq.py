"""``meshant dlq``: the dead-letter queue, through the queen."""

from __future__ import annotations

import json
from typing import Any

import click

from meshant.cli._options import JSON_OPT, Connection, client_options, jsonable


@click.group()
def dlq() -> None:
    """The dead-letter queue: tasks that failed for good, with their last error."""


def _dlq(conn: Connection, op: str, task_id: str | None, all_: bool = False) -> dict[str, Any]:
    if op in ("show", "retry", "purge") and not task_id and not all_:
        raise click.UsageError("give a TASK_ID or --all")
    with conn.client() as client:
        return client.dlq(op, task_id, all=all_)


@dlq.command("list")
@client_options()
@JSON_OPT
def dlq_list(conn: Connection, as_json: bool) -> None:
    """List dead letters."""
    items = _dlq(conn, "list", None)["items"]
    for it in items:
        err = it.get("error") or {}
        if as_json:
            click.echo(json.dumps(it, default=jsonable))
        else:
            # The exception's type first, as `meshant task ID` shows it: often the gist.
            kind = f"{err['type']}: " if err.get("type") else ""
            click.echo(f"{it['task']:28} {it['capability']:14} {err.get('cause', '?'):18} "
                       f"{(kind + str(err.get('message', '')))[:80]}")
    if not as_json:
        click.echo(f"{len(items)} dead letter(s)", err=True)


@dlq.command("show")
@client_options()
@click.argument("task_id")
def dlq_show(conn: Connection, task_id: str) -> None:
    """Show one dead letter: its payload and last error, as JSON."""
    (item,) = _dlq(conn, "show", task_id)["items"]
    click.echo(json.dumps(item, indent=1, default=jsonable))


@dlq.command("retry")
@client_options()
@click.argument("task_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
def dlq_retry(conn: Connection, task_id: str | None, all_: bool) -> None:
    """Submit dead letters' work again, as new tasks (their ids are printed)."""
    for t in _dlq(conn, "retry", task_id, all_)["tasks"]:
        click.echo(t)


@dlq.command("purge")
@client_options()
@click.argument("task_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
def dlq_purge(conn: Connection, task_id: str | None, all_: bool) -> None:
    """Forget dead letters."""
    gone = _dlq(conn, "purge", task_id, all_)["tasks"]
    click.echo(f"{len(gone)} dead letter(s) purged", err=True)


COMMANDS = [dlq]
