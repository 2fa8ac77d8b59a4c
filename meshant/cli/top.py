"""``meshant top``: a live terminal view of the colony."""

from __future__ import annotations

import json
import sys
import time

import click

from meshant.cli._options import JSON_OPT, Connection, client_options
from meshant.errors import MeshantError


@click.command()
@client_options()
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and tests).")
@click.option("--interval", type=click.FloatRange(0.2), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@JSON_OPT
def top(conn: Connection, once: bool, interval: float, as_json: bool) -> None:
    """A full-screen live view of foragers, queues and throughput, refreshed every
    second; q quits. Reads what `meshant status` reads, so it needs only the queen's
    ROUTER (no --http)."""
    from meshant.observe.top import frame, run

    with conn.client() as client:
        if once or as_json or not sys.stdin.isatty() or not sys.stdout.isatty():
            # One frame: throughput needs two looks, so take them `interval` apart.
            first = client.status()
            t0 = time.monotonic()
            time.sleep(interval if not as_json else 0)
            st = client.status()
            if as_json:
                click.echo(json.dumps(st, default=str))
                return
            click.echo("\n".join(frame(st, first, time.monotonic() - t0, 200, 10_000)))
            return

        def fetch() -> dict[str, object]:
            try:
                return client.status()
            except MeshantError as e:
                raise click.ClickException(f"{e} (is the queen still running?)") from None

        run(fetch, interval)


COMMANDS = [top]
