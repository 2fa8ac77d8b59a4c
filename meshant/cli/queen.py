"""``meshant queen``: run a queen."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

import click

from meshant.cli._options import JSON_OPT
from meshant.errors import MeshantError


def _endpoint(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A ZeroMQ endpoint to bind (port 0: the system picks one), checked before anything
    else is said about it."""
    from meshant.actors._endpoints import check_endpoint
    from meshant.errors import ConfigError

    try:
        check_endpoint(value if not value.endswith(":0") else value[:-1] + "1", "endpoint")
    except ConfigError as e:
        raise click.BadParameter(str(e).replace(repr(value[:-1] + "1"), repr(value))) from None
    return value


def _journal_files(journal: str | None) -> list[str]:
    """The files a SQLite journal at ``journal`` is made of, that do not exist yet: a queen
    that cannot start removes them, so a failed start leaves nothing behind."""
    import os

    from meshant.storage import is_postgres

    if journal is None or journal == ":memory:" or is_postgres(journal):
        return []
    return [f for f in (journal, journal + "-wal", journal + "-shm") if not os.path.exists(f)]


def _limit_lines(path: str | None) -> list[str]:
    """The rules of a --limits-file, one a line (comments and blank lines dropped)."""
    if path is None:
        return []
    with open(path, encoding="utf-8") as f:
        return [line for raw in f if (line := raw.split("#", 1)[0].strip())]


def _remove(files: list[str]) -> None:
    import os

    for f in files:
        try:
            os.unlink(f)
        except OSError:
            pass


def _stop_on_signals(stop: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop())


@click.command()
@click.option("--bind", "-b", envvar="MESHANT_BIND", show_envvar=True,
              default="tcp://127.0.0.1:5670", show_default=True, callback=_endpoint,
              help="ROUTER endpoint foragers and clients connect to (port 0 picks one).")
@click.option("--pub", envvar="MESHANT_PUB", show_envvar=True,
              default="tcp://127.0.0.1:5671", show_default=True, callback=_endpoint,
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
@click.option("--max-graph-nodes", type=click.IntRange(1), default=10_000, show_default=True,
              help="Nodes a task graph may have, spawned ones included; a bigger graph is "
                   "refused whole.")
@click.option("--max-schedules", type=click.IntRange(1), default=100_000, show_default=True,
              help="Schedules the queen holds (meshant schedule add); more are refused.")
@click.option("--schedule-grace", type=click.FloatRange(0), default=10.0, show_default=True,
              help="Seconds a schedule's tick may be late and still fire; a later one was "
                   "missed (the queen was down) and the schedule's --catch-up decides.")
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
              show_envvar=True,
              help="Colony name advertised by mDNS, so colonies sharing a network stay apart.")
@click.option("--advertise/--no-advertise", default=None,
              help="Advertise this queen by mDNS (zeroconf). Default: on when bound to a "
                   "non-loopback address.")
@click.option("--mdns-interface", "mdns_interfaces", multiple=True, metavar="IP",
              help="Advertise on this interface address only (repeatable; default: the "
                   "bind address's).")
@click.option("--curve-secret", envvar="MESHANT_CURVE_SECRET", metavar="FILE", show_envvar=True,
              help="The queen's CURVE key pair (.key_secret): turns on encryption and "
                   "authentication on both sockets. Needs --authorized.")
@click.option("--authorized", metavar="DIR", envvar="MESHANT_AUTHORIZED", show_envvar=True,
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
              help="Journal tasks to this SQLite file (restarted on it, the queen loses no "
                   "task), or to a PostgreSQL database, postgresql://USER@HOST:PORT/DB, "
                   "shared with standby queens (docs/ha.md). ':memory:' for a volatile "
                   "queen.")
@click.option("--durability", type=click.Choice(["process", "power"]), default="process",
              show_default=True, envvar="MESHANT_DURABILITY", show_envvar=True,
              help="What an acknowledged task survives: 'process', a killed queen (the "
                   "journal is committed before anything that depends on it is sent); "
                   "'power', a power cut too (an fsync per commit; with PostgreSQL, "
                   "synchronous_commit=on).")
@click.option("--journal-defer", type=click.FloatRange(0.0, 10.0), default=0.1,
              show_default=True, metavar="SECONDS", envvar="MESHANT_JOURNAL_DEFER",
              show_envvar=True,
              help="How long a young task's first journal write may wait: a submission "
                   "without ack runs and is written once, when it ends (its client re-sends "
                   "it after a queen restart). 0 writes every task in the turn it arrives.")
@click.option("--lease", type=click.FloatRange(1.0, 60.0), default=5.0, show_default=True,
              help="With a PostgreSQL journal: seconds a leader's lease lasts; a standby "
                   "takes over this long after the leader stops renewing it.")
@click.option("--retention", type=float, default=86_400.0, show_default=True,
              help="Seconds finished tasks stay in the journal (dead letters stay).")
@click.option("--retention-count", type=click.IntRange(0), default=100_000, show_default=True,
              help="Finished tasks kept in the journal at most, newest first (dead letters "
                   "stay).")
@click.option("--retry-base", type=float, default=0.5, show_default=True,
              help="First retry waits up to this many seconds (full jitter, doubling).")
@click.option("--retry-cap", type=float, default=30.0, show_default=True,
              help="Longest wait before a retry, in seconds.")
@click.option("--breaker-threshold", type=click.IntRange(1), default=5, show_default=True,
              help="Consecutive failing tasks that open a forager's or capability's circuit.")
@click.option("--breaker-cooldown", type=float, default=30.0, show_default=True,
              help="Seconds an open circuit waits before letting one trial through.")
@click.option("--http", envvar="MESHANT_HTTP", show_envvar=True, metavar="[HOST:]PORT",
              help="Serve /metrics (Prometheus), /healthz and a live dashboard on this "
                   "address (a bare PORT is on loopback; 0 picks one). Needs the "
                   "dashboard extra (prometheus-client). Off by default.")
@click.option("--http-token", envvar="MESHANT_HTTP_TOKEN", show_envvar=True, metavar="TOKEN",
              help="Allow the dashboard's actions (drain, halt, cancel, dlq retry) to "
                   "requests bearing this token; without it the dashboard is read-only.")
@click.option("--http-read-token", envvar="MESHANT_HTTP_READ_TOKEN", show_envvar=True,
              metavar="TOKEN",
              help="Make reads need a token too (this one or --http-token): /metrics, "
                   "/api/* and the live feed; the page asks for it once per browser tab "
                   "and /healthz gives its status alone without it. For a dashboard "
                   "bound beyond loopback.")
@click.option("--http-allow-host", "http_allow_host", multiple=True, metavar="NAME",
              envvar="MESHANT_HTTP_ALLOW_HOST", show_envvar=True,
              help="Also serve requests whose Host header is NAME, a reverse proxy's name "
                   "(repeatable; space-separated in the variable; '*' for any). By default "
                   "only the bound address, localhost and loopback addresses: another Host "
                   "gets 403, so no web page can reach the port by DNS rebinding.")
@click.option("--limit", "limits", multiple=True, metavar="RULE",
              envvar="MESHANT_LIMITS", show_envvar=True,
              help="At most N tasks running at once, colony-wide, of a capability "
                   "(llm=10), or per value of a payload field or a label "
                   "(llm:payload.tenant=2, *:labels.region=5); or a rate, a token bucket "
                   "(llm=600/min, llm:payload.tenant=10/s,burst=20; ',cost' counts each "
                   "task's cost: llm=90000/min,cost). Held tasks wait queued, fairly "
                   "between keys (repeatable; space-separated in the variable; see "
                   "docs/limits.md).")
@click.option("--limits-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="More --limit rules, one a line ('#' comments).")
@JSON_OPT
def queen(bind: str, pub: str, name: str, assign_timeout: float, hb_interval: float,
          hb_misses: int, max_queue: int, max_graph_nodes: int, max_schedules: int,
          schedule_grace: float, no_forager_wait: float,
          pub_hwm: int | None,
          pub_buffer: int, max_broadcast: int,
          mem_max_keys: int, mem_max_value: int, colony: str, advertise: bool | None,
          mdns_interfaces: tuple[str, ...], curve_secret: str | None, authorized: str | None,
          max_peers: int, max_message: int, peer_hwm: int, submit_rate: float,
          journal: str | None, durability: str, journal_defer: float, lease: float,
          retention: float, retention_count: int,
          retry_base: float, retry_cap: float,
          breaker_threshold: int, breaker_cooldown: float, http: str | None,
          http_token: str | None, http_read_token: str | None,
          http_allow_host: tuple[str, ...], limits: tuple[str, ...],
          limits_file: str | None, as_json: bool) -> None:
    """Run a queen: binds a ROUTER and a PUB and serves until Ctrl-C/SIGTERM."""
    from meshant.actors.queen import Queen
    from meshant.adapters.discovery import is_loopback
    from meshant.core.queen.router import QueenConfig

    try:
        config = QueenConfig(
            name=name, colony=colony, assign_timeout=assign_timeout, hb_interval=hb_interval,
            hb_misses=hb_misses, max_queue=max_queue, max_message=max_message,
            max_peers=max_peers, no_forager_wait=no_forager_wait, pub_hwm=pub_hwm,
            pub_buffer=pub_buffer, max_broadcast=max_broadcast, mem_max_keys=mem_max_keys,
            mem_max_value=mem_max_value, peer_hwm=peer_hwm, submit_rate=submit_rate,
            journal=journal, durability=durability, journal_defer=journal_defer,
            lease=lease, retention=retention,
            retention_count=retention_count,
            retry_base=retry_base, retry_cap=retry_cap,
            breaker_threshold=breaker_threshold, breaker_cooldown=breaker_cooldown,
            max_graph_nodes=max_graph_nodes, max_schedules=max_schedules,
            schedule_grace=schedule_grace, advertise=advertise,
            mdns_interfaces=tuple(mdns_interfaces) or None,
            curve_secret=curve_secret, authorized=authorized, http=http,
            http_token=http_token, http_read_token=http_read_token,
            http_allow_host=tuple(http_allow_host),
            limits=(*limits, *_limit_lines(limits_file)))
        fresh = _journal_files(journal)
        q = Queen(bind, pub, config=config)
    except (MeshantError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # the journal's folder is missing or not writable, a key file...
        raise click.ClickException(f"{e.strerror}: {e.filename}" if e.filename
                                   else str(e)) from None
    if curve_secret is None and is_loopback(bind):
        click.echo("meshant queen: no CURVE keys, so listening on loopback only (other "
                   "machines cannot join); see --curve-secret and docs/security.md", err=True)
    elif curve_secret is None and not bind.startswith(("ipc:", "inproc:")):
        click.echo(f"warning: {bind} is reachable beyond this machine and CURVE is off: "
                   "anyone who can connect can join, read broadcasts and submit work. Use "
                   "--curve-secret/--authorized (see docs/security.md).", err=True)
    if http is not None and not _loopback_http(http):
        click.echo(f"warning: --http {http} serves the dashboard and metrics beyond this "
                   "machine: they name your foragers and tasks"
                   + (" (reads need --http-read-token)" if http_read_token else
                      "; anyone who reaches it reads them (see --http-read-token)")
                   + ("" if http_token else "; read-only: no --http-token"), err=True)
    _stop_on_signals(q.stop)
    signal.signal(signal.SIGHUP, lambda *_: q.reload_keys())
    t = threading.Thread(target=_announce, args=(q, as_json), daemon=True)
    t.start()
    try:
        q.run()
    except MeshantError as e:
        if not q.wait_ready(0):
            _remove(fresh)  # it never served: the journal it just made holds nothing
        raise click.ClickException(str(e)) from None
    if not as_json:
        click.echo(f"meshant queen {name!r} stopped", err=True)


def _loopback_http(http: str) -> bool:
    from meshant.adapters.web.policy import is_loopback_name
    from meshant.observe.server import parse_http

    return is_loopback_name(parse_http(http)[0].lower())


def _announce(q: Any, as_json: bool) -> None:
    if not q.wait_ready(30):
        return
    if as_json:
        click.echo(json.dumps({"event": "ready", "name": q.name, "router": q.endpoint,
                               "pub": q.pub_endpoint, "epoch": q.epoch, "colony": q.colony,
                               "advertised": q.advertiser is not None, "role": q.role,
                               "http": q.http_url}))
    else:
        click.echo(f"meshant queen {q.name!r} ready: router={q.endpoint} pub={q.pub_endpoint} "
                   f"epoch={q.epoch}" + ("" if q.leadership is None else f" role={q.role}"
                                         + (" (it holds the lease)" if q.role == "leader"
                                            else " (leads once it holds the lease)"))
                   + (f" http={q.http_url}" if q.http_url else ""))
    sys.stdout.flush()


COMMANDS = [queen]
