"""Client commands on the work itself: ``submit`` tasks, the colony's ``status``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

from meshant.cli._options import JSON_OPT, Connection, client_options, jsonable, labels
from meshant.errors import MeshantError


def _payloads(payload: str | None, count: int) -> Iterator[Any]:
    """The payloads to submit; a bad PAYLOAD_JSON fails here, before connecting."""
    if payload == "-":
        return _stdin_payloads()
    value: Any = None
    if payload is not None:
        try:
            value = json.loads(payload)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="PAYLOAD_JSON")
    return iter([value] * count)


def _stdin_payloads() -> Iterator[Any]:
    for n, line in enumerate(sys.stdin, 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as e:
                raise click.BadParameter(f"stdin line {n} is not JSON: {e}")


def _print_update(task_id: str, u: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"id": task_id, "update": u.kind, "seq": u.seq,
                               "fraction": u.fraction, "note": u.note,
                               "value": jsonable(u.value), "request": u.request}))
    elif u.kind in ("input-required", "withdrawn"):
        from meshant.cli.converse import update_text  # the same line `meshant watch` prints

        click.echo(update_text(u) + (f"  (meshant answer {task_id} JSON)"
                                     if u.kind == "input-required" else ""))
    else:
        click.echo(f"[{u.kind}] " + (json.dumps(jsonable(u.value)) if u.kind == "partial"
                                     else f"{(u.fraction or 0) * 100:.0f}% {u.note or ''}"))


def _outcome(fut: Any, t0: float) -> dict[str, Any]:
    """The task's end as the --json record prints it."""
    try:
        rec: dict[str, Any] = {"id": fut.task_id, "state": "completed",
                               "result": jsonable(fut.result())}
    except MeshantError as e:
        rec = {"id": fut.task_id, "state": "cancelled" if e.code == "cancelled" else "failed",
               "error": {"code": e.code, "type": getattr(e, "remote_type", ""),
                         "message": e.message}}
    rec["seconds"] = round(time.monotonic() - t0, 6)
    return rec


@click.command()
@client_options(connect_timeout=10.0)
@click.argument("capability")
@click.argument("payload", required=False, metavar="[PAYLOAD_JSON|-]")
@click.option("--priority", "-p", type=click.IntRange(0, 99), default=50, show_default=True,
              help="0-99, lower runs first.")
@click.option("--timeout", "-t", type=float, help="Run-time limit per task, seconds.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempts before giving up.")
@click.option("--to", help="Run on this forager only.")
@click.option("--label", "-l", "label_values", multiple=True, metavar="KEY=VALUE",
              help="Require a forager label (repeatable).")
@click.option("--wait", type=float, help="Seconds to wait for a forager with the capability.")
@click.option("--key", help="Idempotency key: the same key never runs the task twice.")
@click.option("--retry-base", type=float, help="This task's retry backoff base, seconds.")
@click.option("--count", "-n", type=click.IntRange(1), default=1, show_default=True,
              help="Submit the payload this many times.")
@click.option("--stream", is_flag=True, help="Print progress and partial results as they come.")
@JSON_OPT
def submit(conn: Connection, capability: str, payload: str | None, priority: int,
           timeout: float | None, max_attempts: int | None, to: str | None,
           label_values: tuple[str, ...], wait: float | None, key: str | None,
           retry_base: float | None, count: int, stream: bool, as_json: bool) -> None:
    """Submit tasks and print their results. PAYLOAD_JSON '-' reads JSON lines from stdin.

    Exits 1 if any task failed.
    """
    payloads = _payloads(payload, count)
    kw: dict[str, Any] = {"priority": priority, "timeout": timeout, "to": to,
                          "labels": labels(label_values), "max_attempts": max_attempts,
                          "wait": wait, "key": key, "retry_base": retry_base}
    failed = 0
    with conn.client() as client:
        started = time.monotonic()
        futures = [(client.submit(capability, pl, **kw), time.monotonic()) for pl in payloads]
        show_bar = len(futures) > 1 and not as_json and sys.stderr.isatty()
        with click.progressbar(length=len(futures), label="tasks", file=sys.stderr,
                               hidden=not show_bar) as bar:
            for fut, t0 in futures:
                if stream:
                    for u in fut.updates():
                        _print_update(fut.task_id, u, as_json)
                rec = _outcome(fut, t0)
                failed += rec["state"] != "completed"
                if as_json:
                    click.echo(json.dumps(rec))
                elif not show_bar:
                    if rec["state"] == "completed":
                        click.echo(json.dumps(rec["result"]))
                    else:
                        err = rec["error"]
                        click.echo(f"task {fut.task_id} {rec['state']}: [{err['code']}] "
                                   f"{err['type'] + ': ' if err['type'] else ''}"
                                   f"{err['message']}", err=True)
                bar.update(1)
        if show_bar:
            took = time.monotonic() - started
            click.echo(f"{len(futures) - failed} completed, {failed} failed in {took:.2f} s",
                       err=True)
    if failed:
        sys.exit(1)


@click.command()
@client_options()
@JSON_OPT
def status(conn: Connection, as_json: bool) -> None:
    """Show the queen's foragers, their slots and load, and the queue depths.

    A standby queen (another leads their shared journal) answers with its role, its term
    and the leader's endpoint."""
    from meshant.errors import Refused

    try:
        # One queen: its own answer, standby or not. Several: the leader's.
        with conn.client(follow_leader="," in (conn.endpoint or "")) as client:
            st = client.status()
    except Refused as e:
        if e.code != "not-leader":
            raise
        st = {"role": "standby", **{k: e.detail.get(k) for k in ("term", "leader", "queen")}}
        if as_json:
            click.echo(json.dumps(st))
        else:
            click.echo(f"queen {st['queen']!r} is a standby (term {st['term']}); "
                       + (f"the leader is at {st['leader']}" if st.get("leader")
                          else "no queen leads right now"))
        return
    if as_json:
        click.echo(json.dumps(st))
        return
    qi = st["queen"]
    click.echo(f"queen {qi['name']!r} of colony {qi['colony']!r} at {qi['endpoint']} "
               f"(pub {qi['pub']}), up {qi['uptime']:.0f} s, epoch {qi['epoch']}"
               + (", advertised by mDNS" if qi.get("advertised") else "")
               + (f", leader of term {st['term']}" if st.get("term") else ""))
    click.echo(f"{len(st['foragers'])} foragers, {st['clients']} clients, "
               f"{st['queued']} queued, {st['running']} running")
    if st["foragers"]:
        click.echo(f"  {'NAME':30} {'STATE':9} {'SLOTS':>5} {'BUSY':>5} {'SEEN':>6}  TOOLS")
        for f in st["foragers"]:
            click.echo(f"  {f['name']:30} {f['state']:9} {f['slots']:5} {f['in_flight']:5} "
                       f"{f['last_seen_age']:5.1f}s  {','.join(f['tools'])}")
    gone = st.get("recently_gone") or []
    if gone:
        click.echo("recently offline: " + ", ".join(g["name"] for g in gone[-5:]))
    if st["queues"]:
        click.echo("queues: " + ", ".join(f"{k}={v}" for k, v in sorted(st["queues"].items())))
    br = st.get("breakers") or {}
    open_ = [f"forager {k}: {v}" for k, v in br.get("foragers", {}).items()] + [
        f"capability {k}: {v}" for k, v in br.get("capabilities", {}).items()]
    if open_:
        click.echo("circuits: " + ", ".join(open_))
    for g in st.get("graphs") or []:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(g["counts"].items()))
        click.echo(f"graph {g['graph']} {g['state']}: {g['nodes']} nodes ({counts})")
    if st.get("dead_letters"):
        click.echo(f"dead letters: {st['dead_letters']} (meshant dlq list)")
    c = st["counters"]
    click.echo("counters: " + ", ".join(f"{k}={v}" for k, v in c.items()))


COMMANDS = [submit, status]
