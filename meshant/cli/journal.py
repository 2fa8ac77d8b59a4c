"""Commands reading the queen's journal: ``tasks``, ``task`` and ``journal verify``.

They ask the running queen (--queen, MESHANT_QUEEN, --discover) where its journal is and
read it there, read-only; a journal path is read directly only when --journal gives one,
or when no queen answers."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from meshant.cli._options import JSON_OPT, Connection, client_options, error_text, jsonable
from meshant.errors import MeshantError

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_JOURNAL = "meshant-queen.db"
STATES = ("delayed", "queued", "assigned", "accepted", "input-required", "suspended",
          "completed", "failed", "cancelled")
# What `meshant status` and the dashboard count as running: on a forager, its slot held.
RUNNING = ("assigned", "accepted", "input-required")

JOURNAL_OPT = click.option("--journal", metavar="PATH|URL", envvar="MESHANT_JOURNAL",
                           help="Read this journal (its SQLite file, or its PostgreSQL "
                                "database, postgresql://USER@HOST:PORT/DB) instead of "
                                "asking the running queen where its journal is. When no "
                                "queen answers: MESHANT_JOURNAL (the queen's own setting), "
                                f"else ./{DEFAULT_JOURNAL}. Read-only.")


def journal_options(fn: F) -> F:
    """--journal, and the connection options locating the queen to ask (a short
    --connect-timeout: with no queen running, the journal file is read instead)."""
    return JOURNAL_OPT(client_options(connect_timeout=1.5)(fn))


def _locate(conn: Connection, journal: str | None) -> str:
    """The journal to read: --journal's, else the running queen's, else (no queen
    answered) MESHANT_JOURNAL's or ./meshant-queen.db."""
    source = click.get_current_context().get_parameter_source("journal")
    if journal and source == ParameterSource.COMMANDLINE:
        return journal
    where = conn.queen if not conn.discover else f"colony {conn.colony or 'default'}"
    try:
        with conn.client() as client:
            st = client.status()
    except click.ClickException:
        path = journal if journal and journal != ":memory:" else DEFAULT_JOURNAL
        if not _exists(path):
            raise click.ClickException(
                f"no queen answered at {where} within {conn.timeout:g} s, and there is no "
                f"journal at {path}: give --queen ENDPOINT (or MESHANT_QUEEN) for a running "
                "queen, or --journal PATH") from None
        click.echo(f"(no queen answered at {where}: reading {path})", err=True)
        return path
    if "journal" not in st:
        raise click.ClickException(f"the queen at {where} does not say where its journal is "
                                   "(an older meshant): give --journal PATH")
    if st["journal"] is None:
        raise click.ClickException(f"the queen at {where} keeps no journal (it runs with "
                                   "--journal :memory:): nothing to read")
    path = str(st["journal"])
    if not _exists(path):
        host = st.get("queen", {}).get("host", "its host")
        raise click.ClickException(f"the queen at {where} journals to {path} on {host}, not "
                                   "readable here: run this there, or give --journal")
    return path


def _exists(path: str) -> bool:
    from meshant.storage import is_postgres

    return is_postgres(path) or os.path.exists(path)


def _open_journal(path: str) -> Any:
    from meshant.storage import JournalError, open_journal

    if not _exists(path):
        raise click.ClickException(f"no journal at {path} (give --journal PATH or a "
                                   "postgresql:// URL)")
    try:
        return open_journal(path, readonly=True)
    except JournalError as e:
        raise click.ClickException(str(e)) from None


def _held(conn: Connection, task_id: str) -> str | None:
    """Which limit holds a queued task, as the running queen says (None: none, or no
    queen answered)."""
    try:
        with conn.client() as client:
            held = client.task_status(task_id).get("held")
    except (click.ClickException, MeshantError):
        return None
    return str(held) if held else None


def _why(state: str, why: str) -> str:
    """A timeline entry's text; a progress report's fraction as a percentage."""
    m = re.match(r"(\d+(?:\.\d+)?)(?:\s|$)", why) if state == "progress" else None
    if m is None:
        return why
    return f"{float(m.group(1)) * 100:.0f}%{why[m.end(1):]}"


@click.command()
@journal_options
@click.option("--state", type=click.Choice((*STATES, "running"), case_sensitive=False),
              help="Only tasks in this state; running: assigned, accepted or input-required "
                   "(as meshant status counts them).")
@click.option("--capability", help="Only tasks of this capability.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@JSON_OPT
def tasks(conn: Connection, journal: str | None, state: str | None, capability: str | None,
          limit: int, as_json: bool) -> None:
    """List the running queen's journaled tasks, newest first."""
    j = _open_journal(_locate(conn, journal))
    states = RUNNING if state == "running" else (state,)
    try:
        rows = [r for s in states for r in j.tasks(s, capability, limit)]
    finally:
        j.close()
    if len(states) > 1:
        rows = sorted(rows, key=lambda r: r["created"], reverse=True)[:limit]
    for r in rows:
        if as_json:
            click.echo(json.dumps({k: r.get(k) for k in (
                "id", "capability", "state", "attempt", "forager", "client_name", "priority",
                "created", "updated", "not_before")}))
        else:
            click.echo(f"{r['id']:24} {r['state']:10} {r['capability']:16} attempt "
                       f"{r['attempt']}  {r['forager'] or '-'}")


@click.command()
@journal_options
@click.argument("task_id")
@click.option("--verify", is_flag=True, help="Check the task's history hash chain.")
@JSON_OPT
def task(conn: Connection, journal: str | None, task_id: str, verify: bool,
         as_json: bool) -> None:
    """One task's whole history as a timeline, from the running queen's journal."""
    j = _open_journal(_locate(conn, journal))
    try:
        t = j.task(task_id)
        problems = j.verify(task_id) if verify else []
        steps = j.conversation.steps(task_id) if t is not None else []
    finally:
        j.close()
    if t is None:
        raise click.ClickException(f"no task {task_id!r} in {j.path}")
    if t["state"] == "queued":  # why it waits (a limit) is the running queen's to say
        t["held"] = _held(conn, task_id)
    if as_json:
        click.echo(json.dumps({"id": t["id"], "state": t["state"], "held": t.get("held"),
                               "not_before": t.get("not_before"), "events": t["events"],
                               "final": t["final"], "problems": problems, "steps": steps,
                               "parent": t.get("parent"), "waiting": t.get("wake")},
                              default=jsonable))
    else:
        click.echo(f"task {t['id']} ({t['capability']}) from {t['client_name']}: {t['state']}"
                   + (" until " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                       t["not_before"])) if t["state"] == "delayed" and t.get("not_before")
                      else ""))
        t0 = t["events"][0]["ts"] if t["events"] else 0.0
        for e in t["events"]:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"]))
            click.echo(f"  {stamp} +{e['ts'] - t0:8.3f}s  {e['state']:10} "
                       f"{_why(e['state'], e['why'] or '')}")
        if t.get("held"):
            click.echo(f"  {t['held']}")
        if t.get("parent"):
            click.echo(f"  sub-task of {t['parent']}")
        if steps:
            click.echo(f"  {len(steps)} durable steps recorded:")
            for r in steps:
                what = (f"raised {r['error'].get('type')}" if isinstance(r.get("error"), dict)
                        else f"sub-task {r['child']}" if r.get("child") else
                        f"until {time.strftime('%H:%M:%S', time.localtime(r['until']))}"
                        if r.get("until") else "ok")
                click.echo(f"    {r['position']:4}  {r['kind']:5} {r['name']} "
                           f"#{r['occurrence']}  {what}")
        if t.get("wake"):
            click.echo(f"  suspended, waiting for {t['wake']}")
        err = (t["final"] or {}).get("error") if isinstance(t["final"], dict) else None
        if t["state"] in ("failed", "cancelled") and isinstance(err, dict):
            click.echo(error_text(err))
        if verify:
            click.echo("  history intact" if not problems else "\n".join(
                f"  TAMPERED: {x}" for x in problems))
    if problems:
        sys.exit(1)


@click.group("journal")
def journal_group() -> None:
    """Look after the queen's journal."""


@journal_group.command("verify")
@journal_options
@JSON_OPT
def journal_verify(conn: Connection, journal: str | None, as_json: bool) -> None:
    """Check every task's history hash chain in the running queen's journal; exit 1 if
    anything was altered or removed."""
    path = _locate(conn, journal)
    j = _open_journal(path)
    try:
        problems = j.verify()
    finally:
        j.close()
    if as_json:
        click.echo(json.dumps({"journal": path, "ok": not problems, "problems": problems}))
    else:
        for x in problems:
            click.echo(x)
        click.echo(f"{len(problems)} problem(s) in {path}", err=True)
    sys.exit(1 if problems else 0)


@click.command()
@journal_options
@click.argument("task_id")
@click.option("--app", required=True, metavar="MODULE:FORAGER",
              help="The forager whose handler to replay (as `meshant forager --app`).")
@JSON_OPT
def replay(conn: Connection, journal: str | None, task_id: str, app: str,
           as_json: bool) -> None:
    """Run a durable task's handler here against the steps its colony recorded.

    Each step is shown recorded vs replayed; the replay stops at the first divergence
    (the handler now makes another step there: exit 1) or where the record ends (what
    comes after would be real calls, and is not run). The record is read from the
    running queen's journal (or --journal FILE).

    \b
      meshant replay 3f2a...-7 --app agents:forager
    """
    from meshant.actors.forager import Forager
    from meshant.apps.replay import replay as run_replay
    from meshant.cli.forager import load_app

    target = load_app(app)
    if not isinstance(target, Forager):
        raise click.BadParameter(f"{app!r} is not a Forager", param_hint="--app")
    j = _open_journal(_locate(conn, journal))
    try:
        t = j.task(task_id)
        steps = j.conversation.steps(task_id) if t is not None else []
    finally:
        j.close()
    if t is None:
        raise click.ClickException(f"no task {task_id!r} in {j.path}")
    h = target.handlers.get(t["capability"])
    if h is None:
        raise click.ClickException(f"{app} has no handler for {t['capability']!r} (it serves "
                                   f"{', '.join(sorted(target.handlers)) or 'nothing'})")
    from meshant import protocol as p
    r = run_replay(h, p.unwrap_blob(t.get("payload")), task_id, steps, t["capability"])
    if as_json:
        click.echo(json.dumps({"task": task_id, "recorded": len(steps), "end": r.end,
                               "detail": r.detail,
                               "steps": [{"position": ln.position, "recorded": ln.recorded,
                                          "replayed": ln.replayed, "same": ln.same,
                                          "outcome": ln.outcome} for ln in r.lines]},
                              default=jsonable))
    else:
        click.echo(f"task {task_id} ({t['capability']}): {len(steps)} steps recorded")
        for ln in r.lines:
            if ln.recorded is None:
                click.echo(f"  {ln.position:4}  past the record: {ln.replayed} (not run)")
            elif ln.same:
                click.echo(f"  {ln.position:4}  {ln.replayed:32}  same  -> {ln.outcome}")
            else:
                click.echo(f"  {ln.position:4}  recorded {ln.recorded}, replayed "
                           f"{ln.replayed}  DIVERGED")
        click.echo({"completed": f"the handler returned {r.result!r}",
                    "end-of-record": "the record ends here: the replay stops (nothing new "
                                     "was run)",
                    "diverged": f"diverged: {r.detail}",
                    "suspended": f"the handler waits: {r.detail}",
                    "failed": f"the handler raised {r.detail}"}[r.end])
    if r.end == "diverged":
        sys.exit(1)


COMMANDS = [tasks, task, journal_group, replay]
