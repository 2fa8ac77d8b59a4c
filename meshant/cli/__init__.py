"""The ``meshant`` command line, a module per command group.

``main`` is the click group (the console script and ``python -m meshant``); each module
adds its commands. Every command that connects to a queen as a client takes the same
connection options, from :func:`._options.client_options`.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from meshant._version import __version__
from meshant.cli import (
    bench,
    conformance,
    control,
    converse,
    demo,
    discover,
    dlq,
    forager,
    gateways,
    graph,
    journal,
    keys,
    queen,
    schedule,
    tasks,
    top,
)


class _Main(click.Group):
    """The command group; a file or socket that cannot be opened, or an unreadable key,
    is a one-line error (exit 1), whichever command met it, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # The reader went away (`meshant tasks | head`): stop quietly, as cat does.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as e:
            where = f": {e.filename}" if e.filename else ""
            raise click.ClickException(f"{e.strerror or e}{where}") from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
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


for _module in (queen, forager, tasks, converse, graph, control, dlq, schedule, journal, keys,
                discover, demo, bench, conformance, top, gateways):
    for _cmd in _module.COMMANDS:
        main.add_command(_cmd)

__all__ = ["main"]
