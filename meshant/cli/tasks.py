"""Client commands on the work itself: ``submit`` tasks, the colony's ``status``."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import click

from meshant import protocol as p
from meshant.cli._options import (
    JSON_OPT,
    Connection,
    client_options,
    error_text,
    jsonable,
    labels,
)
from meshant.core.tasks import delays
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
            hint = ""
            if not payload.lstrip().startswith(("{", "[", '"')):
                # A bare word: the user meant a string, which JSON quotes.
                hint = (f"; a string is JSON in double quotes, quoted again for the shell: "
                        f"'{json.dumps(payload)}'")
            raise click.BadParameter(f"not JSON: {e}{hint}", param_hint="PAYLOAD_JSON")
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


def _say_question(task_id: str, u: Any) -> None:
    """Without --stream, a task's question (and its withdrawal) still reaches the person
    waiting, on stderr (stdout keeps the results): the task waits for an answer, and
    nothing else would say so. Called in the client's I/O thread."""
    if u.kind == "input-required":
        data = (u.value or {}).get("data")
        click.echo(f"task {task_id} asks: {json.dumps(jsonable((u.value or {}).get('prompt')))}"
                   + (f" {json.dumps(jsonable(data))}" if data is not None else "")
                   + f"\n  it waits for your answer: meshant answer {task_id} JSON "
                   "(e.g. '\"yes\"'), from another shell", err=True)
    elif u.kind == "withdrawn":
        click.echo(f"task {task_id} no longer waits for an answer to {u.request}", err=True)


def _outcome(fut: Any, t0: float) -> dict[str, Any]:
    """The task's end as the --json record prints it."""
    try:
        rec: dict[str, Any] = {"id": fut.task_id, "state": "completed",
                               "result": jsonable(fut.result())}
    except MeshantError as e:
        rec = {"id": fut.task_id, "state": "cancelled" if e.code == "cancelled" else "failed",
               "error": {"code": e.code, "type": getattr(e, "remote_type", ""),
                         "message": e.message}}
        rec["error"].update({k: e.detail[k] for k in ("forager", "attempts", "cause",
                                                        "traceback") if k in e.detail})
    rec["seconds"] = round(time.monotonic() - t0, 6)
    return rec


def _offered(client: Any, capability: str, to: str | None,
             want: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether a live forager could run the task now, and every capability offered."""
    foragers = client.status()["foragers"]
    offered = sorted({t for f in foragers for t in f["tools"]})
    fits = any(capability in f["tools"] and f["state"] == "active"
               and (to is None or f["name"] == to)
               and all(f.get("labels", {}).get(k) == v for k, v in want.items())
               for f in foragers)
    return fits, offered


def _offered_text(offered: list[str]) -> str:
    return ("offered now: " + ", ".join(offered)) if offered else "no forager is connected"


def _say_missing(capability: str, to: str | None, want: dict[str, Any],
                 offered: list[str], wait: float | None) -> None:
    who = f"forager {to!r}" if to else "forager"
    if want:
        who += " labelled " + ",".join(f"{k}={json.dumps(v)}" for k, v in want.items())
    how_long = (f"up to {wait:g} s" if wait is not None
                else "up to the queen's --no-forager-wait (30 s by default)")
    click.echo(f"no {who} offers {capability!r} yet ({_offered_text(offered)}); waiting "
               f"{how_long} for one to join (Ctrl-C cancels)", err=True)


def _interrupted(client: Any, futures: list[tuple[Any, float]], keep: bool) -> None:
    """Ctrl-C: cancel the tasks still unfinished (or, with --keep-running, say how to
    follow them), then exit 130."""
    left = [fut.task_id for fut, _ in futures if not fut.done()]
    if not left:
        sys.exit(130)
    ids = " ".join(left[:10]) + (f" ... ({len(left)} in all)" if len(left) > 10 else "")
    if keep:
        click.echo(f"interrupted; {len(left)} task(s) keep running: {ids} (meshant watch "
                   "ID, meshant cancel ID)", err=True)
        sys.exit(130)
    for task_id in left:
        client.cancel(task_id, wait=False)  # all at once; the status below confirms them
    try:
        client.status(timeout=5.0)  # answered after the cancels: they have arrived
        click.echo(f"interrupted; cancelled {len(left)} unfinished task(s): {ids} "
                   "(--keep-running leaves them running)", err=True)
    except MeshantError as e:
        click.echo(f"interrupted; cancelling {len(left)} task(s) is not confirmed "
                   f"({e.message}): {ids}", err=True)
    sys.exit(130)


def _duration(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return delays.parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _concurrency(_ctx: click.Context, _param: click.Parameter, value: str | None
                 ) -> tuple[str, int] | None:
    if value is None:
        return None
    key, sep, n = value.rpartition("=")
    if not sep or not key or not n.isdigit() or not 1 <= int(n) <= 1_000_000:
        raise click.BadParameter(f"{value!r}: write KEY=N, a key and 1 to 1,000,000 tasks "
                                 "(tenant-a=2)")
    return key, int(n)


def _time(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return delays.parse_time(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command()
@client_options(connect_timeout=10.0)
@click.argument("capability")
@click.argument("payload", required=False, metavar="[PAYLOAD_JSON|-]")
@click.option("--priority", "-p", type=click.IntRange(0, 99), default=50, show_default=True,
              help="0-99, lower runs first.")
@click.option("--timeout", "-t", type=click.FloatRange(0, min_open=True),
              help="Run-time limit per task, seconds.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempts before giving up.")
@click.option("--to", help="Run on this forager only.")
@click.option("--label", "-l", "label_values", multiple=True, metavar="KEY=VALUE",
              help="Require a forager label (repeatable).")
@click.option("--wait", type=click.FloatRange(0),
              help="Seconds to wait for a forager with the capability (default: the queen's "
                   "--no-forager-wait, 30 s).")
@click.option("--key", help="Idempotency key: the same key never runs the task twice.")
@click.option("--retry-base", type=click.FloatRange(0), help="This task's retry backoff base, "
              "seconds.")
@click.option("--retry-on", "retry_on", multiple=True, metavar="TYPE",
              help="Retry the task when its handler raises this exception type (repeatable; "
                   "'*': any). By default a handler's exception fails the task at once.")
@click.option("--in", "delay_in", metavar="DURATION", callback=_duration,
              help="Start no earlier than this from now: 90, 90s, 5m, 1h30m, 2d (the queen "
                   "journals the task as delayed; it can be cancelled until then).")
@click.option("--at", "delay_at", metavar="ISO-8601", callback=_time,
              help="Start no earlier than this time: 2026-12-24T18:00 (local time), "
                   "...T18:00+01:00, ...T17:00Z.")
@click.option("--concurrency", "concurrency", metavar="KEY=N", callback=_concurrency,
              help="At most N tasks submitted with KEY run at once, colony-wide (the "
                   "queen's --limit rules hold as well); the others wait queued.")
@click.option("--cost", type=click.FloatRange(0, 1e9, min_open=True),
              help="Tokens each task takes from the queen's rate limits (default 1).")
@click.option("--count", "-n", type=click.IntRange(1), default=1, show_default=True,
              help="Submit the payload this many times.")
@click.option("--stream", is_flag=True, help="Print progress and partial results as they come.")
@click.option("--no-wait", is_flag=True,
              help="Print each task's id (and state) once the queen has journaled it, and "
                   "exit; follow it with `meshant task ID`.")
@click.option("--keep-running", is_flag=True,
              help="On Ctrl-C, leave the submitted tasks running (default: cancel them).")
@JSON_OPT
def submit(conn: Connection, capability: str, payload: str | None, priority: int,
           timeout: float | None, max_attempts: int | None, to: str | None,
           label_values: tuple[str, ...], wait: float | None, key: str | None,
           retry_base: float | None, retry_on: tuple[str, ...], delay_in: float | None,
           delay_at: float | None, concurrency: tuple[str, int] | None,
           cost: float | None, count: int,
           stream: bool, no_wait: bool,
           keep_running: bool, as_json: bool) -> None:
    """Submit tasks and print their results. PAYLOAD_JSON '-' reads JSON lines from stdin;
    a string payload is JSON too: '"hello"'.

    It says at once, on stderr, when no forager offers CAPABILITY yet (and which are
    offered), and when a task asks a question (answer it with `meshant answer TASK_ID
    JSON`). Ctrl-C (or SIGTERM) cancels the tasks not finished yet (--keep-running leaves
    them running) and exits 130.
    With --in or --at the tasks are delayed: `meshant status` counts them apart from the
    queued ones, `meshant tasks --state delayed` lists them, `meshant cancel` cancels them.

    Exits 1 if any task failed.
    """
    if delay_in is not None and delay_at is not None:
        raise click.UsageError("give --in (a duration) or --at (a time), not both")
    payloads = _payloads(payload, count)
    want = labels(label_values)
    kw: dict[str, Any] = {"priority": priority, "timeout": timeout, "to": to,
                          "labels": want, "max_attempts": max_attempts,
                          "wait": wait, "key": key, "retry_base": retry_base,
                          "retry_on": list(retry_on) or None}
    if delay_in:
        kw["after"] = delay_in
    if delay_at is not None:
        kw["at"] = delay_at
    if no_wait:
        kw["ack"] = True
    if concurrency is not None:
        kw["concurrency"] = concurrency
    if cost is not None:
        kw["cost"] = cost
    if any(not t.strip() for t in retry_on):
        raise click.BadParameter("an exception type's name (or '*' for any)",
                                 param_hint="--retry-on")
    failed = 0
    # SIGTERM (a supervisor, `timeout`) cancels as Ctrl-C does.
    old_term = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    with conn.client(on_progress=None if stream else _say_question) as client:
        started = time.monotonic()
        futures: list[tuple[Any, float]] = []
        try:
            if wait != 0:  # (with --wait 0 the task's own error says it, at once)
                # Said on a terminal and from a script alike: stderr is for the person.
                fits, offered = _offered(client, capability, to, want)
                if not fits:
                    _say_missing(capability, to, want, offered, wait)
            for pl in payloads:
                futures.append((client.submit(capability, pl, **kw), time.monotonic()))
            if no_wait:
                failed = _acknowledged(client, [f for f, _ in futures], as_json,
                                       conn.timeout)
            else:
                failed = _collect(client, futures, capability, stream, as_json, started)
        except KeyboardInterrupt:
            _interrupted(client, futures, keep_running)
        finally:
            signal.signal(signal.SIGTERM, old_term)
    if failed:
        sys.exit(1)


def _acknowledged(client: Any, futures: list[Any], as_json: bool, timeout: float) -> int:
    """--no-wait: each task's id and state once the queen said it has it (journaled);
    returns how many it refused or did not confirm within ``timeout``."""
    failed = 0
    for fut in futures:
        until = time.monotonic() + timeout
        while not fut.acknowledged and not fut.done() and time.monotonic() < until:
            time.sleep(0.005)  # (the client's I/O thread sets it)
        if fut.done() and fut.exception(0) is not None:
            failed += 1
            e = fut.exception(0)
            click.echo(f"task {fut.task_id} refused: {getattr(e, 'message', e)}", err=True)
            continue
        if not fut.acknowledged and not fut.done():
            failed += 1
            click.echo(f"task {fut.task_id}: not confirmed by the queen within {timeout:g} s",
                       err=True)
            continue
        st = client.task_status(fut.task_id)
        rec = {"task": fut.task_id, "state": st["state"]}
        if st.get("not_before") is not None:
            rec["not_before"] = st["not_before"]
        if as_json:
            click.echo(json.dumps(rec))
        else:
            when = (" until " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                rec["not_before"]))) if "not_before" in rec else ""
            click.echo(f"{fut.task_id} {rec['state']}{when}")
    return failed


def _sigterm_as_interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _collect(client: Any, futures: list[tuple[Any, float]], capability: str, stream: bool,
             as_json: bool, started: float) -> int:
    """Wait for each task and print its outcome; returns how many did not complete."""
    failed = 0
    show_bar = len(futures) > 1 and not as_json and sys.stderr.isatty()
    held: list[str] = []  # behind a progress bar, results are printed when it ends
    offered: list[str] | None = None
    with click.progressbar(length=len(futures), label="tasks", file=sys.stderr,
                           hidden=not show_bar) as bar:
        for fut, t0 in futures:
            if stream:
                for u in fut.updates():
                    _print_update(fut.task_id, u, as_json)
            rec = _outcome(fut, t0)
            failed += rec["state"] != "completed"
            if rec.get("error", {}).get("code") == "no-forager":
                if offered is None:
                    offered = _offered(client, capability, None, {})[1]
                rec["error"]["offered"] = offered
                rec["error"]["message"] += f" ({_offered_text(offered)})"
            if as_json:
                click.echo(json.dumps(rec))
            elif rec["state"] == "completed":
                line = json.dumps(rec["result"])
                if show_bar:
                    held.append(line)
                else:
                    click.echo(line)
            else:
                err = rec["error"]
                click.echo(f"task {fut.task_id} {rec['state']}: {error_text(err)}", err=True)
            bar.update(1)
    for line in held:
        click.echo(line)
    if show_bar:
        took = time.monotonic() - started
        click.echo(f"{len(futures) - failed} completed, {failed} failed in {took:.2f} s",
                   err=True)
    return failed


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
    # This command's own client is one of the queen's clients: not counted or listed.
    others = max(0, st["clients"] - 1)
    click.echo(f"{len(st['foragers'])} foragers, {others} client{'s' * (others != 1)}, "
               f"{st['queued']} queued, "
               + (f"{st['delayed']} delayed, " if st.get("delayed") else "")
               + f"{st['running']} running"
               + (f", {st['suspended']} suspended" if st.get("suspended") else ""))
    if st["foragers"]:
        click.echo(f"  {'NAME':30} {'STATE':9} {'SLOTS':>5} {'BUSY':>5} {'SEEN':>6}  TOOLS")
        for f in st["foragers"]:
            click.echo(f"  {f['name']:30} {f['state']:9} {f['slots']:5} {f['in_flight']:5} "
                       f"{f['last_seen_age']:5.1f}s  {','.join(f['tools'])}")
        described = {t: d.get("description", "") for f in st["foragers"]
                     for t, d in (f.get("describe") or {}).items()}
        if described:
            click.echo("capabilities:")
            for t, text in sorted(described.items()):
                click.echo(f"  {t:20} {text}")
    gone = [g for g in st.get("recently_gone") or [] if g.get("role") != "client"]
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
    waits = [f"{x['limit']}" + (f" {x['key']}" if x["key"] else "")
             + f" {x['waiting']} waiting" for x in st.get("rates") or []]
    if waits:
        click.echo("rates: " + ", ".join(waits[:10]))
    held = [x for x in st.get("limits") or [] if x["waiting"] or x["running"]]
    if held:
        click.echo("limits: " + ", ".join(
            f"{x['limit']}" + (f" {x['key']}" if x["key"] else "")
            + f" {x['running']}/{x['max']} running" + (f", {x['waiting']} waiting"
                                                       if x["waiting"] else "")
            for x in held[:10]))
    if st.get("schedules"):
        soon = [x for x in st.get("next_schedules") or [] if x.get("next")]
        click.echo(f"schedules: {st['schedules']}" + (
            " (next: " + ", ".join(
                f"{x['name']} at {datetime.fromtimestamp(x['next']).astimezone():%H:%M:%S}"
                for x in soon[:3]) + "; meshant schedule list)" if soon else ""))
    if st.get("dead_letters"):
        click.echo(f"dead letters: {st['dead_letters']} (meshant dlq list)")
    c = st["counters"]
    shown = [f"{k}={v}" for k, v in c.items() if v]
    click.echo("counters: " + (", ".join(shown) or "all zero")
               + (f" (the other {len(c) - len(shown)} are 0; --json lists all)"
                  if shown and len(shown) < len(c) else ""))


FINAL_STATES = ("completed", "failed", "cancelled")


def _cancel_one(client: Any, ident: str) -> dict[str, Any]:
    """Cancel a task or a graph by id; what became of it, as `meshant cancel --json`
    prints it (``ok`` False: it was not found, or may not be cancelled; a task or graph
    that had already ended is left as it ended, and said so)."""
    try:
        st = client.task_status(ident)
    except MeshantError as e:
        if e.code != "unknown-task":
            raise
    else:
        if st["state"] in FINAL_STATES:
            return {"id": ident, "kind": "task", "state": st["state"],
                    "ok": True, "note": "already ended"}
        try:
            state = client.cancel(ident)
        except MeshantError as e:  # forbidden, or it ended and was forgotten meanwhile
            return {"id": ident, "kind": "task", "state": st["state"], "ok": False,
                    "note": f"[{e.code}] {e.message}"}
        return {"id": ident, "kind": "task", "state": state, "ok": True,
                **({} if state == "cancelled" else {"note": "already ended"})}
    try:
        g = client.graph_status(ident)
    except MeshantError as e:
        if e.code != "unknown-graph":
            raise
        return {"id": ident, "kind": None, "state": None, "ok": False,
                "note": "no such task or graph (meshant tasks, meshant status list them)"}
    if g["state"] in FINAL_STATES:
        return {"id": ident, "kind": "graph", "state": g["state"],
                "ok": True, "note": "already ended"}
    return sent_cancel(client, "graph", ident, p.Message("graph.cancel", {"graph": ident},
                                                           to="queen"))


class _Quiet(logging.Filter):
    """Keeps the client's log quiet about the queen's refusals (the command says them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "queen says" not in str(record.msg)


def sent_cancel(client: Any, kind: str, ident: str, msg: Any) -> dict[str, Any]:
    """Send a cancel; what became of the task or graph (the status query is answered after
    the cancel was taken, or refused: a refusal names the cancel by its id)."""
    quiet = _Quiet()
    logging.getLogger("meshant").addFilter(quiet)  # said once, below, not also as a log
    try:
        client.send_message(msg)
        st = client.task_status(ident) if kind == "task" else client.graph_status(ident)
    finally:
        logging.getLogger("meshant").removeFilter(quiet)
    refused = [r.b for r in client.refusals if r.ref == msg.id]
    if refused:
        return {"id": ident, "kind": kind, "state": st["state"], "ok": False,
                "note": f"[{refused[0]['code']}] {refused[0]['message']}"}
    return {"id": ident, "kind": kind, "state": st["state"],
            "ok": st["state"] == "cancelled"}


@click.command()
@client_options()
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@JSON_OPT
def cancel(conn: Connection, ids: tuple[str, ...], as_json: bool) -> None:
    """Cancel tasks and task graphs by id: a queued task (or a graph's pending nodes) at
    once, a running one best effort (its handler sees ctx.is_cancelled).

    With CURVE on, only a task's submitter or an admin key may cancel it. One that had
    already ended is left as it ended, and said so. Exits 1 if an ID is unknown or may
    not be cancelled.
    """
    ok = True
    with conn.client() as client:
        for ident in ids:
            rec = _cancel_one(client, ident)
            ok = ok and rec["ok"]
            if as_json:
                click.echo(json.dumps(rec))
            elif rec["kind"] is None:
                click.echo(f"Error: {ident}: {rec['note']}", err=True)
            elif rec["ok"]:
                note = f" ({rec['note']})" if rec.get("note") else ""
                click.echo(f"{rec['kind']} {ident}: {rec['state']}{note}")
            else:
                click.echo(f"Error: {rec['kind']} {ident} is {rec['state']}"
                           + (f": {rec['note']}" if rec.get("note") else ""), err=True)
    if not ok:
        sys.exit(1)


COMMANDS = [submit, status, cancel]
