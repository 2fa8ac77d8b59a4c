"""``meshant schedule``: tasks submitted at the ticks of a cron expression, kept by the
queen in its journal (docs/limits.md, "Schedules")."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import click

from meshant.cli._options import JSON_OPT, Connection, client_options, jsonable, labels, parse_json
from meshant.core.schedules.model import CATCH_UP, OVERLAP, cron_problem


def _when(wall: float | None, now: float) -> str:
    if wall is None:
        return "-"
    local = datetime.fromtimestamp(wall).astimezone()
    ahead = wall - now
    if abs(ahead) < 90:
        rel = f"{ahead:+.0f}s"
    elif abs(ahead) < 5400:
        rel = f"{ahead / 60:+.0f}m"
    elif abs(ahead) < 172800:
        rel = f"{ahead / 3600:+.1f}h"
    else:
        rel = f"{ahead / 86400:+.1f}d"
    return f"{local:%Y-%m-%d %H:%M:%S%z} ({rel})"


def _line(s: dict[str, Any], now: float) -> str:
    state = "paused" if s["paused"] else "active"
    return (f"{s['name']:20} {s['cron']:16} {s['tz']:14} {s['capability']:14} {state:7} "
            f"next {_when(s.get('next'), now)}  fired {s['fired']} skipped {s['skipped']}"
            + (f" queued {s['queued']}" if s.get("queued") else "")
            + (f" refused {s['refused']} (last: {s['last_refusal']})" if s.get("refused")
               else ""))


def _show(s: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(s, default=jsonable))
    else:
        click.echo(_line(s, time.time()))


@click.group()
def schedule() -> None:
    """Schedules: a task submitted at every tick of a cron expression.

    The queen keeps them in its journal and fires each tick once, across its restarts
    and a failover to a standby. Ticks missed while no queen led follow --catch-up;
    a tick that comes while the last one's task still runs follows --overlap.

    \b
      meshant schedule add nightly '0 3 * * *' report '{"kind": "daily"}' --tz Europe/Paris
      meshant schedule list
      meshant schedule trigger nightly      # one task now
      meshant schedule pause nightly
    """


@schedule.command("add")
@client_options()
@click.argument("name")
@click.argument("cron")
@click.argument("capability")
@click.argument("payload", required=False, metavar="[PAYLOAD_JSON]")
@click.option("--tz", default="UTC", show_default=True,
              help="The time zone the cron expression reads in (an IANA name: Europe/Paris).")
@click.option("--overlap", type=click.Choice(OVERLAP), default="skip", show_default=True,
              help="A tick while the last tick's task runs: skip it, queue it (fired when "
                   "that task ends), or allow it (both run).")
@click.option("--catch-up", "catch_up", type=click.Choice(CATCH_UP), default="latest",
              show_default=True,
              help="Ticks missed while no queen led: none of them, the latest once, or "
                   "all (at most 100).")
@click.option("--paused", is_flag=True, help="Add it paused (resume starts it).")
@click.option("--replace", is_flag=True, help="Replace a schedule of the same name.")
@click.option("--priority", "-p", type=click.IntRange(0, 99), help="The tasks' priority.")
@click.option("--timeout", "-t", type=click.FloatRange(0, min_open=True),
              help="Each task's run-time limit, seconds.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempts before giving up.")
@click.option("--label", "-l", "label_values", multiple=True, metavar="KEY=VALUE",
              help="Run only on foragers with this label (repeatable).")
@click.option("--cost", type=click.FloatRange(0, 1e9, min_open=True),
              help="Each task's weight for the rate limits.")
@JSON_OPT
def schedule_add(conn: Connection, name: str, cron: str, capability: str,
                 payload: str | None, tz: str, overlap: str, catch_up: str, paused: bool,
                 replace: bool, priority: int | None, timeout: float | None,
                 max_attempts: int | None, label_values: tuple[str, ...], cost: float | None,
                 as_json: bool) -> None:
    """Add schedule NAME: a task of CAPABILITY with PAYLOAD_JSON at every tick of CRON
    (5 fields, minute hour day-of-month month day-of-week; or 6, seconds first:
    '*/15 * * * * *'; quote it).
    Prints the schedule and its next tick."""
    problem = cron_problem(cron, tz, time.time())  # (the queen checks it too: said here)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="CRON" if "time zone" not in problem
                                 else "--tz")
    options: dict[str, Any] = {k: v for k, v in (
        ("priority", priority), ("timeout", timeout), ("max_attempts", max_attempts),
        ("cost", cost)) if v is not None}
    if label_values:
        options["labels"] = labels(label_values)
    with conn.client() as client:
        s = client.add_schedule(name, cron, capability, parse_json(payload, "PAYLOAD_JSON"),
                                tz=tz, overlap=overlap, catch_up=catch_up, paused=paused,
                                replace=replace, **options)
    _show(s, as_json)


@schedule.command("list")
@client_options()
@JSON_OPT
def schedule_list(conn: Connection, as_json: bool) -> None:
    """List the schedules, with their next ticks (local time) and counts."""
    with conn.client() as client:
        items = client.schedules()
    now = time.time()
    for s in items:
        click.echo(json.dumps(s, default=jsonable) if as_json else _line(s, now))
    if not as_json:
        click.echo(f"{len(items)} schedule(s)", err=True)


def _op(op: str, doc: str) -> click.Command:
    @client_options()
    @click.argument("name")
    @JSON_OPT
    def command(conn: Connection, name: str, as_json: bool) -> None:
        with conn.client() as client:
            r = client.schedule(op, name)
        if as_json:
            # show, pause, resume print the schedule as add and list do (one shape for
            # scripts); trigger and remove the queen's answer (the task, what went).
            out = r["schedule"] if op in ("show", "pause", "resume") else r
            click.echo(json.dumps(out, default=jsonable))
            return
        if op == "trigger":
            click.echo(r["task"])
            click.echo(f"schedule {name}: task {r['task']} submitted", err=True)
        elif op == "remove":
            click.echo(f"schedule {name} removed", err=True)
        else:
            _show(r["schedule"], False)
    command.__doc__ = doc
    return click.command(op)(command)


for _op_name, _doc in (
        ("show", "Show schedule NAME: its next tick, last task and counts."),
        ("pause", "Pause schedule NAME: no tick fires until it is resumed."),
        ("resume", "Resume schedule NAME from now (ticks it was paused through do not "
                   "fire)."),
        ("remove", "Remove schedule NAME (tasks it submitted run on)."),
        ("trigger", "Submit schedule NAME's task now, whatever its cron says (while its "
                    "last task runs, only with --overlap allow); prints the task's id.")):
    schedule.add_command(_op(_op_name, _doc))

COMMANDS = [schedule]
