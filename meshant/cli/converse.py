"""Client commands on conversations: ``answer`` a task's question, ``watch`` a task's
stream from a cursor, look into (or purge) the ``inbox`` kept for a name."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

from meshant.cli._options import (
    JSON_OPT,
    Connection,
    client_options,
    echo_flush,
    error_text,
    jsonable,
    parse_json,
)
from meshant.errors import MeshantError


@click.command()
@client_options()
@click.argument("task_id")
@click.argument("value", metavar="JSON")
@click.option("--request", "-r", help="The question to answer (its request id); by default "
              "the task's oldest waiting one.")
@JSON_OPT
def answer(conn: Connection, task_id: str, value: str, request: str | None,
           as_json: bool) -> None:
    """Answer the question a task waits on (state input-required) with JSON: its
    handler's ctx.ask() returns the value. See `meshant watch TASK_ID` for the question."""
    parsed = parse_json(value, "JSON")
    with conn.client() as client:
        got = client.answer(task_id, parsed, request=request)
    if as_json:
        click.echo(json.dumps(got))
    else:
        click.echo(f"answered {got['request']} of task {got['task']}", err=True)


@click.command()
@client_options()
@click.argument("task_id")
@click.option("--after", type=click.IntRange(0), default=0, show_default=True,
              help="Print the updates after this sequence number (a cursor).")
@click.option("--timeout", "-t", type=click.FloatRange(0),
              help="Give up (exit 2) after this many seconds; the task goes on.")
@JSON_OPT
def watch(conn: Connection, task_id: str, after: int, timeout: float | None,
          as_json: bool) -> None:
    """Follow a task, running or finished, anyone's with the right: print its progress,
    partial results and questions after --after, as they come, then its result.
    Exits 1 if the task failed."""
    from meshant.actors.attach import Attachment

    deadline = None if timeout is None else time.monotonic() + timeout
    with conn.client() as client:
        att: Attachment = client.attach(task_id, after)
        for u in _until(att, deadline):
            rec = {"task": task_id, "seq": u.seq, "update": u.kind, "fraction": u.fraction,
                   "note": u.note, "value": jsonable(u.value), "request": u.request}
            if as_json:
                echo_flush(json.dumps(rec))
            else:
                echo_flush(update_text(u))
        try:
            # The stream's end comes a moment before the result is set.
            result = att.result(0.05 if deadline is not None and
                                time.monotonic() >= deadline else 5.0)
            out: dict[str, Any] = {"task": task_id, "state": "completed",
                                   "result": jsonable(result)}
        except TimeoutError:  # (before MeshantError: a meshant Timeout is both)
            click.echo(f"task {task_id} did not end within {timeout or 0:g} s (it goes on; "
                       f"meshant watch {task_id} --after {att.last_seq} resumes)", err=True)
            sys.exit(2)
        except MeshantError as e:
            out = {"task": task_id, "state": "failed", "error": {
                "code": e.code, "type": getattr(e, "remote_type", ""), "message": e.message,
                **({"traceback": e.detail["traceback"]} if e.detail.get("traceback") else {})}}
    if as_json:
        click.echo(json.dumps(out))
    elif out["state"] == "completed":
        click.echo(f"[completed] {json.dumps(out['result'])}")
    else:
        click.echo(f"[failed] {error_text(out['error'])}", err=True)
    if out["state"] != "completed":
        sys.exit(1)


def _until(att: Any, deadline: float | None) -> Iterator[Any]:
    """The attachment's updates until its task ends, or until ``deadline`` (then it stops
    quietly; the caller sees the task is not done)."""
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        try:
            yield next(att.updates(timeout=left))
        except (StopIteration, TimeoutError):
            return


def update_text(u: Any) -> str:
    """One update as `meshant watch` prints it."""
    if u.kind == "progress":
        frac = "" if u.fraction is None else f"{u.fraction * 100:.0f}% "
        return f"[progress] {frac}{u.note or ''}"
    if u.kind == "partial":
        return f"[partial] {json.dumps(jsonable(u.value))}"
    if u.kind == "input-required":
        return (f"[input-required] {u.request}: {json.dumps(jsonable(u.value['prompt']))}")
    return f"[{u.kind}] {u.request or ''}"


@click.command()
@client_options()
@click.argument("args", nargs=-1, required=True, metavar="NAME | purge NAME")
@JSON_OPT
def inbox(conn: Connection, args: tuple[str, ...], as_json: bool) -> None:
    """Show what the queen keeps for NAME (messages to it while it was not connected,
    delivered oldest first when it registers); `meshant inbox purge NAME` forgets them
    (an admin operation when CURVE is on)."""
    if len(args) == 2 and args[0] == "purge":
        purge, name = True, args[1]
    elif len(args) == 1:
        purge, name = False, args[0]
    else:
        raise click.UsageError("give NAME, or purge NAME")
    with conn.client() as client:
        got = client.inbox_of(name, purge=purge)
    if as_json:
        click.echo(json.dumps(jsonable(got) if purge else {
            **got, "items": [{**i, "body": jsonable(i["body"])} for i in got["items"]]}))
        return
    if purge:
        click.echo(f"purged {got['purged']} messages kept for {name}", err=True)
        return
    items = got["items"]
    click.echo(f"{len(items)} messages kept for {name}")
    now = time.time()
    for i in items:
        click.echo(f"  {i['id']:24} {i['kind']:12} from {i['from']:16} expires in "
                   f"{max(0.0, i['expires'] - now):8.0f}s  {json.dumps(jsonable(i['body']))}")


COMMANDS = [answer, watch, inbox]
