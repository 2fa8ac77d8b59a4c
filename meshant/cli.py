"""The ``meshant`` command line: queen, forager, submit, status, demo."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import click

from ._version import __version__
from .errors import MeshantError, QueenUnreachable
from .forager import Forager

QUEEN_OPT = click.option(
    "--queen", "-q", envvar="MESHANT_QUEEN", show_envvar=True,
    default="tcp://127.0.0.1:5670", show_default=True,
    help="The queen's ROUTER endpoint.")
JSON_OPT = click.option("--json", "as_json", is_flag=True,
                        help="Machine-readable output: JSON (one object per line).")


def curve_opts(fn: Any) -> Any:
    fn = click.option("--queen-key", envvar="MESHANT_QUEEN_KEY", show_envvar=True,
                      metavar="FILE", help="The queen's CURVE public key (its .key file); "
                      "with --discover it may come from the advertisement instead.")(fn)
    return click.option("--curve-secret", envvar="MESHANT_CURVE_SECRET", show_envvar=True,
                        metavar="FILE", help="This peer's CURVE key pair (.key_secret file): "
                        "encrypts and authenticates everything with the queen.")(fn)


def discover_opts(fn: Any) -> Any:
    fn = click.option("--colony", envvar="MESHANT_COLONY", show_envvar=True,
                      help="With --discover: the colony to join (needed when several "
                           "colonies share the network).")(fn)
    return click.option("--discover", "-d", is_flag=True,
                        help="Find the queen by mDNS (zeroconf) instead of --queen.")(fn)


def _labels(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", param_hint="--label")
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="meshant")
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug) to stderr.")
def main(verbose: int) -> None:
    """meshant: a ZeroMQ agent mesh.

    A queen hands tasks to foragers (workers) and returns results to clients.
    Try `meshant demo` for a local colony doing real work, or start one yourself:

    \b
      meshant queen &
      meshant forager &            # serves echo, sleep, fail, stream
      meshant submit echo '{"hello": "world"}'
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _stop_on_signals(stop: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop())


@main.command()
@click.option("--bind", "-b", envvar="MESHANT_BIND", show_envvar=True,
              default="tcp://127.0.0.1:5670", show_default=True,
              help="ROUTER endpoint foragers and clients connect to (port 0 picks one).")
@click.option("--pub", envvar="MESHANT_PUB", show_envvar=True,
              default="tcp://127.0.0.1:5671", show_default=True,
              help="PUB endpoint for broadcasts and the queen's heartbeat.")
@click.option("--name", default="queen", show_default=True, help="This queen's name.")
@click.option("--assign-timeout", type=float, default=300.0, show_default=True,
              help="Seconds an assignment may go without a sign of life before the task "
                   "is reissued to another forager.")
@click.option("--hb-interval", type=float, default=1.0, show_default=True,
              help="Heartbeat interval in seconds, for the queen and its peers.")
@click.option("--hb-misses", type=int, default=5, show_default=True,
              help="Missed heartbeats before a peer is declared offline.")
@click.option("--max-queued", "--max-queue", "max_queue", type=click.IntRange(1),
              default=100_000, show_default=True,
              help="Queued tasks allowed before submissions get 'queue full' at once.")
@click.option("--no-forager-wait", type=float, default=30.0, show_default=True,
              help="Seconds a task waits for a forager offering its capability before failing.")
@click.option("--pub-hwm", type=click.IntRange(1), default=None,
              help="Messages queued per subscriber before PUB drops the newest for it. "
                   "Default: --pub-buffer / --max-broadcast.")
@click.option("--pub-buffer", type=click.IntRange(1024), default=64 * 1024 * 1024,
              show_default=True, help="Bytes the queen may hold for one slow subscriber.")
@click.option("--max-broadcast", type=click.IntRange(1024), default=128 * 1024,
              show_default=True, help="Largest broadcast, in bytes ('too-large').")
@click.option("--mem-max-keys", type=click.IntRange(1), default=10_000, show_default=True,
              help="Keys the colony memory may hold.")
@click.option("--mem-max-value", type=click.IntRange(1), default=65536, show_default=True,
              help="Largest colony memory value, in bytes (msgpack-encoded).")
@click.option("--colony", default="default", show_default=True, envvar="MESHANT_COLONY",
              help="Colony name advertised by mDNS, so colonies sharing a network stay apart.")
@click.option("--advertise/--no-advertise", default=None,
              help="Advertise this queen by mDNS (zeroconf). Default: on when bound to a "
                   "non-loopback address.")
@click.option("--mdns-interface", "mdns_interfaces", multiple=True, metavar="IP",
              help="Advertise on this interface address only (repeatable; default: the "
                   "bind address's).")
@click.option("--curve-secret", envvar="MESHANT_CURVE_SECRET", metavar="FILE",
              help="The queen's CURVE key pair (.key_secret): turns on encryption and "
                   "authentication on both sockets. Needs --authorized.")
@click.option("--authorized", metavar="DIR", envvar="MESHANT_AUTHORIZED",
              help="Folder of public keys (.key files) allowed to connect; re-read on "
                   "SIGHUP and when it changes.")
@click.option("--max-peers", type=click.IntRange(1), default=10_000, show_default=True,
              help="Registered peers at most ('too-many-peers' beyond).")
@click.option("--max-message", type=click.IntRange(1024), default=64 * 1024 * 1024,
              show_default=True, help="Largest frame accepted, in bytes ('too-large').")
@click.option("--peer-hwm", type=click.IntRange(1), default=100_000, show_default=True,
              help="Messages queued per peer, each way, before sends to it are dropped.")
@click.option("--submit-rate", type=click.FloatRange(0.1), default=10_000.0,
              show_default=True, help="Submissions per second per peer ('rate-limited').")
@click.option("--journal", metavar="PATH", envvar="MESHANT_JOURNAL",
              default="meshant-queen.db", show_default=True, show_envvar=True,
              help="Journal tasks to this SQLite file: restarted on it, the queen loses no "
                   "task. ':memory:' for a volatile queen.")
@click.option("--retention", type=float, default=86_400.0, show_default=True,
              help="Seconds finished tasks stay in the journal (dead letters stay).")
@click.option("--retry-base", type=float, default=0.5, show_default=True,
              help="First retry waits up to this many seconds (full jitter, doubling).")
@click.option("--retry-cap", type=float, default=30.0, show_default=True,
              help="Longest wait before a retry, in seconds.")
@click.option("--breaker-threshold", type=click.IntRange(1), default=5, show_default=True,
              help="Consecutive failing tasks that open a forager's or capability's circuit.")
@click.option("--breaker-cooldown", type=float, default=30.0, show_default=True,
              help="Seconds an open circuit waits before letting one trial through.")
@JSON_OPT
def queen(bind: str, pub: str, name: str, assign_timeout: float, hb_interval: float,
          hb_misses: int, max_queue: int, no_forager_wait: float, pub_hwm: int | None,
          pub_buffer: int, max_broadcast: int,
          mem_max_keys: int, mem_max_value: int, colony: str, advertise: bool | None,
          mdns_interfaces: tuple[str, ...], curve_secret: str | None, authorized: str | None,
          max_peers: int, max_message: int, peer_hwm: int, submit_rate: float,
          journal: str | None, retention: float, retry_base: float, retry_cap: float,
          breaker_threshold: int, breaker_cooldown: float, as_json: bool) -> None:
    """Run a queen: binds a ROUTER and a PUB and serves until Ctrl-C/SIGTERM."""
    from .discovery import is_loopback
    from .queen import Queen

    try:
        q = Queen(bind, pub, name=name, assign_timeout=assign_timeout,
                  hb_interval=hb_interval, hb_misses=hb_misses, max_queue=max_queue,
                  no_forager_wait=no_forager_wait, pub_hwm=pub_hwm,
                  pub_buffer=pub_buffer, max_broadcast=max_broadcast,
                  mem_max_keys=mem_max_keys, mem_max_value=mem_max_value, colony=colony,
                  advertise=advertise, mdns_interfaces=list(mdns_interfaces) or None,
                  curve_secret=curve_secret, authorized=authorized, max_peers=max_peers,
                  max_message=max_message, peer_hwm=peer_hwm, submit_rate=submit_rate,
                  journal=journal, retention=retention, retry_base=retry_base,
                  retry_cap=retry_cap, breaker_threshold=breaker_threshold,
                  breaker_cooldown=breaker_cooldown)
    except (MeshantError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if curve_secret is None and is_loopback(bind):
        click.echo("meshant queen: no CURVE keys, so listening on loopback only (other "
                   "machines cannot join); see --curve-secret and docs/security.md", err=True)
    elif curve_secret is None and not bind.startswith(("ipc:", "inproc:")):
        click.echo(f"warning: {bind} is reachable beyond this machine and CURVE is off: "
                   "anyone who can connect can join, read broadcasts and submit work. Use "
                   "--curve-secret/--authorized (see docs/security.md).", err=True)
    _stop_on_signals(q.stop)
    signal.signal(signal.SIGHUP, lambda *_: q.reload_keys())
    t = threading.Thread(target=_announce, args=(q, as_json), daemon=True)
    t.start()
    try:
        q.run()
    except MeshantError as e:
        raise click.ClickException(str(e)) from None
    if not as_json:
        click.echo(f"meshant queen {name!r} stopped", err=True)


def _announce(q: Any, as_json: bool) -> None:
    if not q.wait_ready(30):
        return
    if as_json:
        click.echo(json.dumps({"event": "ready", "name": q.name, "router": q.endpoint,
                               "pub": q.pub_endpoint, "epoch": q.epoch, "colony": q.colony,
                               "advertised": q.advertiser is not None}))
    else:
        click.echo(f"meshant queen {q.name!r} ready: router={q.endpoint} pub={q.pub_endpoint} "
                   f"epoch={q.epoch}")
    sys.stdout.flush()


def load_app(spec: str) -> Any:
    """Import ``module:attribute`` (a Forager, a dict of capability → handler, or a function)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.BadParameter("expected module:attribute", param_hint="--app")
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise click.BadParameter(f"cannot import {module_name!r}: {e}", param_hint="--app")
    if not attr:
        found = [v for v in vars(module).values() if isinstance(v, Forager)]
        if len(found) != 1:
            raise click.BadParameter(f"{module_name!r} has {len(found)} Forager objects; "
                                     "name one as module:attribute", param_hint="--app")
        return found[0]
    try:
        return getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"{module_name!r} has no attribute {attr!r}",
                                 param_hint="--app") from None


@main.command()
@QUEEN_OPT
@click.option("--app", "-a", "app", metavar="MODULE:ATTR",
              help="Handlers to serve: a Forager object, a dict of capability → function, "
                   "or a function (its name is the capability). Default: the demo "
                   "capabilities echo, sleep, fail and stream.")
@click.option("--name", "-n", help="Forager name (default forager-<host>-<pid>-<rand>).")
@click.option("--slots", "-s", type=click.IntRange(1, 10_000), default=1, show_default=True,
              envvar="MESHANT_SLOTS", show_envvar=True, help="Tasks run at once.")
@click.option("--label", "-l", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label tasks can require (repeatable).")
@click.option("--builtins/--no-builtins", default=None,
              help="Also serve the demo capabilities (default: only without --app).")
@click.option("--subscribe", "subscriptions", multiple=True, metavar="PREFIX",
              help="Print broadcasts whose topic starts with PREFIX as JSON lines "
                   "(repeatable; '' for all).")
@click.option("--drain-timeout", type=float, default=600.0, show_default=True,
              help="On SIGTERM, seconds to finish running tasks before stopping anyway.")
@discover_opts
@curve_opts
@JSON_OPT
def forager(queen: str, app: str | None, name: str | None, slots: int, labels: tuple[str, ...],
            builtins: bool | None, subscriptions: tuple[str, ...], drain_timeout: float,
            discover: bool, colony: str | None, curve_secret: str | None,
            queen_key: str | None, as_json: bool) -> None:
    """Run a forager that serves tasks for the queen.

    SIGTERM drains it (finish running tasks, take no new ones, leave); Ctrl-C stops it at
    once and hands its running tasks back to the queen.
    """
    from .builtin import add_builtins

    try:
        f = Forager(None if discover else queen, name=name, slots=slots,
                    labels=_labels(labels), colony=colony, discover=discover,
                    curve_secret=curve_secret, queen_key=queen_key)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    for prefix in subscriptions:
        try:
            f.subscribe(prefix, _print_broadcast)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--subscribe") from None
    if app is not None:
        target = load_app(app)
        if isinstance(target, Forager):
            for cap, h in target.handlers.items():
                f.add_handler(cap, h.fn, batch=h.batch, inline=h.inline)
            f._message_callbacks.extend(target._message_callbacks)
        elif isinstance(target, dict):
            for cap, fn in target.items():
                f.add_handler(str(cap), fn)
        elif callable(target):
            f.add_handler(target.__name__, target)
        else:
            raise click.BadParameter(f"{app!r} is not a Forager, dict or function",
                                     param_hint="--app")
    if builtins or (builtins is None and app is None):
        add_builtins(f)
    ready = threading.Thread(target=_announce_forager, args=(f, as_json), daemon=True)
    ready.start()
    try:
        f.run(drain_timeout=drain_timeout)
    except MeshantError as e:
        raise click.ClickException(str(e)) from None
    if f._refusal is not None:
        raise click.ClickException(str(f._refusal))


def _print_broadcast(topic: str, data: Any, msg: Any) -> None:
    click.echo(json.dumps({"event": "broadcast", "topic": topic, "from": msg.frm,
                           "data": _jsonable(data)}))
    sys.stdout.flush()


def _announce_forager(f: Forager, as_json: bool) -> None:
    while not f._welcomed.wait(0.5):
        if f._stopping.is_set():
            return
    if f._refusal is not None or f._stopping.is_set():
        return
    if as_json:
        click.echo(json.dumps({"event": "ready", "name": f.name, "queen": f.queen,
                               "slots": f.slots, "tools": f.tools, "epoch": f.epoch}))
    else:
        click.echo(f"meshant forager {f.name!r} ready: queen={f.queen} slots={f.slots} "
                   f"tools={','.join(f.tools)}")
    sys.stdout.flush()


def _connect(queen: str, timeout: float, discover: bool = False,
             colony: str | None = None, curve_secret: str | None = None,
             queen_key: str | None = None) -> Any:
    from .client import Client

    try:
        return Client(None if discover else queen, timeout=timeout, discover=discover,
                      colony=colony, curve_secret=curve_secret, queen_key=queen_key)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    except QueenUnreachable as e:
        raise click.ClickException(str(e)) from None
    except MeshantError as e:
        raise click.ClickException(str(e)) from None


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


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


@main.command()
@QUEEN_OPT
@click.argument("capability")
@click.argument("payload", required=False, metavar="[PAYLOAD_JSON|-]")
@click.option("--priority", "-p", type=click.IntRange(0, 99), default=50, show_default=True,
              help="0-99, lower runs first.")
@click.option("--timeout", "-t", type=float, help="Run-time limit per task, seconds.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempts before giving up.")
@click.option("--to", help="Run on this forager only.")
@click.option("--label", "-l", "labels", multiple=True, metavar="KEY=VALUE",
              help="Require a forager label (repeatable).")
@click.option("--wait", type=float, help="Seconds to wait for a forager with the capability.")
@click.option("--key", help="Idempotency key: the same key never runs the task twice.")
@click.option("--retry-base", type=float, help="This task's retry backoff base, seconds.")
@click.option("--count", "-n", type=click.IntRange(1), default=1, show_default=True,
              help="Submit the payload this many times.")
@click.option("--connect-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for the queen to answer.")
@click.option("--stream", is_flag=True, help="Print progress and partial results as they come.")
@discover_opts
@curve_opts
@JSON_OPT
def submit(queen: str, capability: str, payload: str | None, priority: int,
           timeout: float | None, max_attempts: int | None, to: str | None,
           labels: tuple[str, ...], wait: float | None, count: int, connect_timeout: float,
           stream: bool, discover: bool, colony: str | None, curve_secret: str | None,
           queen_key: str | None, key: str | None, retry_base: float | None,
           as_json: bool) -> None:
    """Submit tasks and print their results. PAYLOAD_JSON '-' reads JSON lines from stdin.

    Exits 1 if any task failed.
    """
    payloads = _payloads(payload, count)
    client = _connect(queen, connect_timeout, discover, colony, curve_secret, queen_key)
    failed = 0
    try:
        kw: dict[str, Any] = {"priority": priority, "timeout": timeout, "to": to,
                              "labels": _labels(labels), "max_attempts": max_attempts,
                              "wait": wait, "key": key, "retry_base": retry_base}
        started = time.monotonic()
        futures = []
        for pl in payloads:
            futures.append((client.submit(capability, pl, **kw), time.monotonic()))
        show_bar = len(futures) > 1 and not as_json and sys.stderr.isatty()
        with click.progressbar(length=len(futures), label="tasks", file=sys.stderr) if (
                show_bar) else _nullbar() as bar:
            for fut, t0 in futures:
                if stream:
                    for u in fut.updates():
                        if as_json:
                            click.echo(json.dumps({"id": fut.task_id, "update": u.kind,
                                                   "seq": u.seq, "fraction": u.fraction,
                                                   "note": u.note,
                                                   "value": _jsonable(u.value)}))
                        else:
                            click.echo(f"[{u.kind}] "
                                       + (json.dumps(_jsonable(u.value)) if u.kind == "partial"
                                          else f"{(u.fraction or 0) * 100:.0f}% {u.note or ''}"))
                try:
                    result = fut.result()
                    rec: dict[str, Any] = {"id": fut.task_id, "state": "completed",
                                           "result": _jsonable(result)}
                except MeshantError as e:
                    failed += 1
                    rec = {"id": fut.task_id, "state": "cancelled" if e.code == "cancelled"
                           else "failed",
                           "error": {"code": e.code, "type": getattr(e, "remote_type", ""),
                                     "message": e.message}}
                rec["seconds"] = round(time.monotonic() - t0, 6)
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
    finally:
        client.close()
    if failed:
        sys.exit(1)


class _nullbar:
    def __enter__(self) -> _nullbar:
        return self

    def __exit__(self, *a: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


@main.command()
@QUEEN_OPT
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
@discover_opts
@curve_opts
@JSON_OPT
def status(queen: str, connect_timeout: float, discover: bool, colony: str | None,
           curve_secret: str | None, queen_key: str | None, as_json: bool) -> None:
    """Show the queen's foragers, their slots and load, and the queue depths."""
    client = _connect(queen, connect_timeout, discover, colony, curve_secret, queen_key)
    try:
        st = client.status()
    finally:
        client.close()
    if as_json:
        click.echo(json.dumps(st))
        return
    qi = st["queen"]
    click.echo(f"queen {qi['name']!r} of colony {qi['colony']!r} at {qi['endpoint']} "
               f"(pub {qi['pub']}), up {qi['uptime']:.0f} s, epoch {qi['epoch']}"
               + (", advertised by mDNS" if qi.get("advertised") else ""))
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
    if st.get("dead_letters"):
        click.echo(f"dead letters: {st['dead_letters']} (meshant dlq list)")
    c = st["counters"]
    click.echo("counters: " + ", ".join(f"{k}={v}" for k, v in c.items()))


@main.command()
@QUEEN_OPT
@click.argument("topic")
@click.argument("data", required=False, metavar="[DATA_JSON]")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def broadcast(queen: str, topic: str, data: str | None, connect_timeout: float) -> None:
    """Publish DATA_JSON under TOPIC to every forager subscribed to a prefix of it."""
    from ._peer import valid_topic

    if not valid_topic(topic):
        raise click.BadParameter("use 1-200 characters of A-Z a-z 0-9 . _ : / -",
                                 param_hint="TOPIC")
    value = _parse_json(data, "DATA_JSON")
    client = _connect(queen, connect_timeout)
    try:
        client.broadcast(topic, value)
    finally:
        client.close()


def _parse_json(text: str | None, hint: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=hint) from None


@main.command()
@QUEEN_OPT
@click.argument("names", nargs=-1, required=True)
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def drain(queen: str, names: tuple[str, ...], connect_timeout: float) -> None:
    """Drain foragers: they finish their running tasks, take no new ones, then leave."""
    _control(queen, names, connect_timeout, "drain")


@main.command()
@QUEEN_OPT
@click.argument("names", nargs=-1, required=True)
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def halt(queen: str, names: tuple[str, ...], connect_timeout: float) -> None:
    """Halt foragers at once; the queen reissues their running tasks elsewhere."""
    _control(queen, names, connect_timeout, "halt")


def _control(queen: str, names: tuple[str, ...], connect_timeout: float, what: str) -> None:
    client = _connect(queen, connect_timeout)
    try:
        known = {f["name"] for f in client.status()["foragers"]}
        missing = [n for n in names if n not in known]
        if missing:
            raise click.ClickException(f"no live forager named {', '.join(missing)} "
                                       "(see `meshant status`)")
        getattr(client, what)(list(names))
        click.echo(f"{what} sent to {', '.join(names)}", err=True)
    finally:
        client.close()


@main.group()
def dlq() -> None:
    """The dead-letter queue: tasks that failed for good, with their last error."""


def _dlq(queen: str, op: str, task_id: str | None, all_: bool, connect_timeout: float,
         curve_secret: str | None = None, queen_key: str | None = None) -> dict[str, Any]:
    if op in ("show", "retry", "purge") and not task_id and not all_:
        raise click.UsageError("give a TASK_ID or --all")
    client = _connect(queen, connect_timeout, curve_secret=curve_secret, queen_key=queen_key)
    try:
        return client.dlq(op, task_id, all=all_)  # type: ignore[no-any-return]
    except MeshantError as e:
        raise click.ClickException(str(e)) from None
    finally:
        client.close()


@dlq.command("list")
@QUEEN_OPT
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
@JSON_OPT
def dlq_list(queen: str, connect_timeout: float, as_json: bool) -> None:
    """List dead letters."""
    items = _dlq(queen, "list", None, False, connect_timeout)["items"]
    for it in items:
        err = it.get("error") or {}
        if as_json:
            click.echo(json.dumps(it, default=_jsonable))
        else:
            click.echo(f"{it['task']:28} {it['capability']:14} {err.get('cause', '?'):18} "
                       f"{err.get('message', '')[:60]}")
    if not as_json:
        click.echo(f"{len(items)} dead letter(s)", err=True)


@dlq.command("show")
@QUEEN_OPT
@click.argument("task_id")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def dlq_show(queen: str, task_id: str, connect_timeout: float) -> None:
    """Show one dead letter: its payload and last error, as JSON."""
    (item,) = _dlq(queen, "show", task_id, False, connect_timeout)["items"]
    click.echo(json.dumps(item, indent=1, default=_jsonable))


@dlq.command("retry")
@QUEEN_OPT
@click.argument("task_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def dlq_retry(queen: str, task_id: str | None, all_: bool, connect_timeout: float) -> None:
    """Submit dead letters' work again, as new tasks (their ids are printed)."""
    for t in _dlq(queen, "retry", task_id, all_, connect_timeout)["tasks"]:
        click.echo(t)


@dlq.command("purge")
@QUEEN_OPT
@click.argument("task_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def dlq_purge(queen: str, task_id: str | None, all_: bool, connect_timeout: float) -> None:
    """Forget dead letters."""
    gone = _dlq(queen, "purge", task_id, all_, connect_timeout)["tasks"]
    click.echo(f"{len(gone)} dead letter(s) purged", err=True)


@main.group()
def memory() -> None:
    """Read and write the colony memory (a key-value map every agent sees)."""


@memory.command("get")
@QUEEN_OPT
@click.argument("key", required=False)
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def memory_get(queen: str, key: str | None, connect_timeout: float) -> None:
    """Print KEY's value as JSON (or the whole map without KEY)."""
    client = _connect(queen, connect_timeout)
    try:
        client.memory.wait_synced(connect_timeout)
        if key is None:
            click.echo(json.dumps(client.memory.items(), default=_jsonable))
        elif key not in client.memory:
            raise click.ClickException(f"no key {key!r} in the colony memory")
        else:
            click.echo(json.dumps(client.memory.get(key), default=_jsonable))
    finally:
        client.close()


@memory.command("set")
@QUEEN_OPT
@click.argument("key")
@click.argument("value", metavar="VALUE_JSON")
@click.option("--ttl", type=float, help="Delete the key after this many seconds.")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def memory_set(queen: str, key: str, value: str, ttl: float | None,
               connect_timeout: float) -> None:
    """Set KEY to VALUE_JSON."""
    parsed = _parse_json(value, "VALUE_JSON")
    client = _connect(queen, connect_timeout)
    try:
        client.memory.set(key, parsed, ttl=ttl)
    except (MeshantError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        client.close()


@memory.command("delete")
@QUEEN_OPT
@click.argument("key")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True)
def memory_delete(queen: str, key: str, connect_timeout: float) -> None:
    """Delete KEY."""
    client = _connect(queen, connect_timeout)
    try:
        client.memory.delete(key)
    except (MeshantError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        client.close()


@main.group()
def keys() -> None:
    """CURVE keys for queens, foragers and clients (zmq's certificate format)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", "-n", required=True, help="Key name: files NAME.key and "
              "NAME.key_secret; by default the key may register this name and NAME-*.")
@click.option("--role", "roles", multiple=True, type=click.Choice(["forager", "client"]),
              help="What the key may register as (repeatable; default client).")
@click.option("--allow-name", "names", multiple=True, metavar="PATTERN",
              help="Names the key may register (glob, repeatable) instead of NAME, NAME-*.")
def keys_generate(directory: str, name: str, roles: tuple[str, ...],
                  names: tuple[str, ...]) -> None:
    """Write a key pair into DIRECTORY. Copy NAME.key (public) into the queen's
    --authorized folder; keep NAME.key_secret private (mode 600)."""
    from .security import generate

    pub_file, sec_file = generate(directory, name, roles or ("client",), names)
    click.echo(f"public key: {pub_file}\nsecret key: {sec_file}")


JOURNAL_OPT = click.option("--journal", metavar="PATH", envvar="MESHANT_JOURNAL",
                           default="meshant-queen.db", show_default=True,
                           help="The queen's journal file (read-only here).")


def _open_journal(path: str) -> Any:
    from .journal import Journal, JournalError

    if not os.path.exists(path):
        raise click.ClickException(f"no journal at {path} (give --journal PATH)")
    try:
        return Journal(path, readonly=True)
    except JournalError as e:
        raise click.ClickException(str(e)) from None


@main.command()
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


@main.command()
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
        raise click.ClickException(f"no task {task_id!r} in {journal}")
    if as_json:
        click.echo(json.dumps({"id": t["id"], "state": t["state"], "events": t["events"],
                               "final": t["final"], "problems": problems},
                              default=_jsonable))
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


@main.group("journal")
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
    click.echo(f"{len(problems)} problem(s) in {journal}", err=True)
    sys.exit(1 if problems else 0)


@main.command("discover")
@click.option("--timeout", "-t", type=float, default=3.0, show_default=True,
              help="Seconds to listen for queens.")
@click.option("--colony", help="Only queens of this colony.")
@JSON_OPT
def discover_cmd(timeout: float, colony: str | None, as_json: bool) -> None:
    """List the queens advertised by mDNS on this network, with their endpoints."""
    from .discovery import discover, env_interfaces

    queens = discover(timeout, colony, env_interfaces())
    if as_json:
        click.echo(json.dumps([q.as_dict() for q in queens]))
        return
    if not queens:
        click.echo(f"no queens found within {timeout:g} s", err=True)
        return
    click.echo(f"{'COLONY':16} {'QUEEN':16} {'ROUTER':28} {'PUB':28} VERSIONS")
    for q in queens:
        click.echo(f"{q.colony:16} {q.name:16} {q.router:28} {q.pub:28} "
                   f"{','.join(map(str, q.versions))}")


@main.command()
@click.option("--foragers", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--tasks", type=click.IntRange(10), default=300, show_default=True,
              help="Echo tasks in the mixed workload.")
@JSON_OPT
def demo(foragers: int, tasks: int, as_json: bool) -> None:
    """Run a local colony doing real work: a queen and foragers as subprocesses.

    Runs a mixed workload (echo at mixed priorities, a streamed result, sleeps, a
    failure, and a forager killed mid-task whose work moves on), prints a summary with
    latency percentiles, stops everything it started and exits 0 on success.
    """
    from .demo import run_demo

    ok = run_demo(foragers=foragers, tasks=tasks, as_json=as_json)
    sys.exit(0 if ok else 1)


@main.command()
@click.option("--quick", is_flag=True, help="A few seconds instead of about a minute.")
@click.option("--scenario", "-s", "scenarios", multiple=True, metavar="NAME",
              help="Run only these scenarios (repeatable); see --list.")
@click.option("--list", "list_", is_flag=True, help="List the scenarios and exit.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the results as JSON to this file ('-' for stdout).")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the rows as CSV (to plot with any tool).")
def bench(quick: bool, scenarios: tuple[str, ...], list_: bool, json_file: str | None,
          csv_file: str | None) -> None:
    """Benchmark meshant against raw pyzmq on the same topology, in the same run.

    Every figure comes with the raw pyzmq figure measured alongside it and their ratio
    (meshant's cost over raw: 1.00x means as fast as raw pyzmq).
    """
    from .bench import SCENARIOS, Sizes, format_table, run_suite

    if list_:
        for name, (desc, _) in SCENARIOS.items():
            click.echo(f"{name:20} {desc}")
        return
    names = list(scenarios) or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise click.BadParameter(f"unknown scenario(s) {', '.join(unknown)}; see --list",
                                 param_hint="--scenario")
    sizes = Sizes.quick() if quick else Sizes()
    to_stdout = json_file == "-"
    show = sys.stderr.isatty() and not to_stdout
    with click.progressbar(length=len(names), label="bench", file=sys.stderr,
                           item_show_func=lambda n: n) if show else _nullbar() as bar:
        def progress(name: str) -> None:
            bar.update(1, name) if show else None

        report = run_suite(names, sizes, progress)
    rows = report.pop("_rows")
    m = report["machine"]
    if not to_stdout:
        click.echo(f"machine: {m['cpus']} CPUs, Python {m['python']}, pyzmq {m['pyzmq']}, "
                   f"libzmq {m['libzmq']}, msgpack {m['msgpack']}")
        click.echo(format_table(rows))
        click.echo(f"({report['seconds']} s)")
    if json_file:
        text = json.dumps(report, indent=1)
        if to_stdout:
            click.echo(text)
        else:
            with open(json_file, "w") as fh:
                fh.write(text + "\n")
    if csv_file:
        import csv

        with open(csv_file, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["scenario", "metric", "unit", "meshant", "raw",
                                               "ratio"], extrasaction="ignore")
            w.writeheader()
            w.writerows(report["rows"])


if __name__ == "__main__":  # pragma: no cover
    main()
