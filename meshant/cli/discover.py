"""``meshant discover``: the queens advertised by mDNS."""

from __future__ import annotations

import json

import click

from meshant.cli._options import JSON_OPT


@click.command("discover")
@click.option("--timeout", "-t", type=click.FloatRange(0), default=3.0, show_default=True,
              help="Seconds to listen for queens.")
@click.option("--colony", help="Only queens of this colony.")
@JSON_OPT
def discover_cmd(timeout: float, colony: str | None, as_json: bool) -> None:
    """List the queens advertised by mDNS on this network, with their endpoints."""
    from meshant.adapters.discovery import discover, env_interfaces

    queens = discover(timeout, colony, env_interfaces())
    if as_json:
        click.echo(json.dumps([q.as_dict() for q in queens]))
        return
    if not queens:
        click.echo(f"no queens found within {timeout:g} s", err=True)
        return
    click.echo(f"{'COLONY':16} {'QUEEN':16} {'ROUTER':28} {'PUB':28} {'ROLE':14} VERSIONS")
    for q in queens:
        role = f"{q.role} t{q.term}" if q.term else q.role
        click.echo(f"{q.colony:16} {q.name:16} {q.router:28} {q.pub:28} {role:14} "
                   f"{','.join(map(str, q.versions))}")


COMMANDS = [discover_cmd]
