"""``meshant keys``: CURVE key pairs."""

from __future__ import annotations

import click


@click.group()
def keys() -> None:
    """CURVE keys for queens, foragers and clients (zmq's certificate format)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", "-n", required=True, help="Key name: files NAME.key and "
              "NAME.key_secret; by default the key may register this name and NAME-*.")
@click.option("--role", "roles", multiple=True, type=click.Choice(["forager", "client", "admin"]),
              help="What the key may register as (repeatable; default client). admin: a "
              "client that may also drain, halt, dlq retry/purge, purge inboxes, write "
              "reserved memory keys, and answer or watch anyone's task.")
@click.option("--allow-name", "names", multiple=True, metavar="PATTERN",
              help="Names the key may register (glob, repeatable) instead of NAME, NAME-*.")
def keys_generate(directory: str, name: str, roles: tuple[str, ...],
                  names: tuple[str, ...]) -> None:
    """Write a key pair into DIRECTORY. Copy NAME.key (public) into the queen's
    --authorized folder; keep NAME.key_secret private (mode 600)."""
    from meshant.adapters.security import generate
    from meshant.protocol.negotiation import NAME_RE

    if not NAME_RE.match(name):  # a queen's key may be named "queen": no reserved names
        raise click.BadParameter(f"{name!r} cannot be a peer's name: use letters, digits and "
                                 "'._:@-'", param_hint="--name")
    try:
        pub_file, sec_file = generate(directory, name, roles or ("client",), names)
    except OSError as e:
        raise click.ClickException(f"cannot write the keys into {directory}: "
                                   f"{e.strerror or e}") from None
    click.echo(f"public key: {pub_file}\nsecret key: {sec_file}")


COMMANDS = [keys]
