"""Client commands steering the colony: ``broadcast``, ``drain``, ``halt`` and the colony
``memory``."""

from __future__ import annotations

import json
import sys

import click

from meshant.cli._options import JSON_OPT, Connection, client_options, jsonable, parse_json


@click.command()
@client_options()
@click.argument("topic")
@click.argument("data", required=False, metavar="[DATA_JSON]")
def broadcast(conn: Connection, topic: str, data: str | None) -> None:
    """Publish DATA_JSON under TOPIC to every forager subscribed to a prefix of it."""
    from meshant.protocol.topics import valid_topic

    if not valid_topic(topic):
        raise click.BadParameter("use 1-200 characters of A-Z a-z 0-9 . _ : / -",
                                 param_hint="TOPIC")
    value = parse_json(data, "DATA_JSON")
    with conn.client() as client:
        client.broadcast(topic, value)


def _control(conn: Connection, names: tuple[str, ...], what: str) -> None:
    with conn.client() as client:
        known = {f["name"] for f in client.status()["foragers"]}
        missing = [n for n in names if n not in known]
        if missing:
            raise click.ClickException(f"no live forager named {', '.join(missing)} "
                                       "(see `meshant status`)")
        getattr(client, what)(list(names))
        client.status()  # answered in order: a refusal of the drain/halt is here by now
        for r in client.refusals:
            raise click.ClickException(f"[{r.b['code']}] {r.b['message']}")
        click.echo(f"{what} sent to {', '.join(names)}", err=True)


@click.command()
@client_options()
@click.argument("names", nargs=-1, required=True)
def drain(conn: Connection, names: tuple[str, ...]) -> None:
    """Drain foragers: they finish their running tasks, take no new ones, then leave."""
    _control(conn, names, "drain")


@click.command()
@client_options()
@click.argument("names", nargs=-1, required=True)
def halt(conn: Connection, names: tuple[str, ...]) -> None:
    """Halt foragers at once; the queen reissues their running tasks elsewhere."""
    _control(conn, names, "halt")


@click.group()
def memory() -> None:
    """Read and write the colony memory (a key-value map every agent sees)."""


@memory.command("get")
@client_options()
@click.argument("key", required=False)
@JSON_OPT
def memory_get(conn: Connection, key: str | None, as_json: bool) -> None:
    """Print KEY's value as JSON (or the whole map without KEY). With --json, one object:
    {"key", "found", "value"}, or {"items"} without KEY. Exits 1 if KEY is not set."""
    with conn.client() as client:
        client.memory.wait_synced(conn.timeout)
        if key is None:
            items = client.memory.items()
            click.echo(json.dumps({"items": items} if as_json else items, default=jsonable))
            return
        found = key in client.memory
        value = client.memory.get(key)
    if as_json:
        click.echo(json.dumps({"key": key, "found": found, "value": value}, default=jsonable))
    elif found:
        click.echo(json.dumps(value, default=jsonable))
    if not found:
        if not as_json:
            click.echo(f"Error: no key {key!r} in the colony memory", err=True)
        sys.exit(1)


@memory.command("set")
@client_options()
@click.argument("key")
@click.argument("value", metavar="VALUE_JSON")
@click.option("--ttl", type=float, help="Delete the key after this many seconds.")
def memory_set(conn: Connection, key: str, value: str, ttl: float | None) -> None:
    """Set KEY to VALUE_JSON."""
    parsed = parse_json(value, "VALUE_JSON")
    with conn.client() as client:
        client.memory.set(key, parsed, ttl=ttl)


@memory.command("delete")
@client_options()
@click.argument("key")
def memory_delete(conn: Connection, key: str) -> None:
    """Delete KEY."""
    with conn.client() as client:
        client.memory.delete(key)


COMMANDS = [broadcast, drain, halt, memory]
