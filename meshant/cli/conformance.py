"""``meshant conformance``: test a forager or a queen — any implementation, in any
language — against the IACP/2 spec (docs/protocol.md), like h2spec for HTTP/2."""

from __future__ import annotations

import sys

import click

from meshant.cli._options import JSON_OPT, echo_flush


@click.group()
def conformance() -> None:
    """Test a forager or a queen against the IACP/2 spec.

    Each check prints one line: PASS, FAIL or SKIP, the spec section it tests, its id and
    what it checks (the ids are listed in docs/protocol.md, appendix A). The exit code is
    1 when any check fails, 0 otherwise.
    """


@conformance.command("forager")
@click.argument("command", nargs=-1, required=True, metavar="-- COMMAND [ARGS]...")
@click.option("--startup", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Seconds to wait for the forager's first message.")
@JSON_OPT
def forager_cmd(command: tuple[str, ...], startup: float, as_json: bool) -> None:
    """Play the queen against a forager COMMAND.

    The kit binds a queen on 127.0.0.1 (ports chosen by the system), starts COMMAND with
    MESHANT_QUEEN set to that endpoint (and `{queen}` in its arguments replaced by it),
    and stops it at the end. The forager should serve `echo`; `sleep` and `stream` (as
    meshant's demo capabilities) enable the cancel, lease and progress checks.

    \b
      meshant conformance forager -- meshant forager --slots 3
      meshant conformance forager -- python examples/legacy_forager.py {queen}
    """
    from meshant.conformance import check_forager

    try:
        report = check_forager(list(command), startup=startup,
                               echo=None if as_json else echo_flush)
    except OSError as e:
        raise click.ClickException(f"cannot start {command[0]!r}: {e}") from None
    echo_flush(report.dumps() if as_json else report.summary())
    sys.exit(1 if report.failed else 0)


@conformance.command("queen")
@click.option("--queen", "-q", envvar="MESHANT_QUEEN", show_envvar=True,
              default="tcp://127.0.0.1:5670", show_default=True,
              help="The ROUTER endpoint of the queen to test.")
@click.option("--timeout", type=click.FloatRange(0.1), default=5.0, show_default=True,
              help="Seconds to wait for each answer.")
@JSON_OPT
def queen_cmd(queen: str, timeout: float, as_json: bool) -> None:
    """Play foragers and clients against the queen at --queen.

    Every peer takes a fresh name and every task a capability no one else serves
    (conformance.<run>.<n>), so a live colony's work is not disturbed; its dead-letter
    queue keeps the few tasks the failure checks fail on purpose.
    """
    from meshant.actors._endpoints import check_endpoint
    from meshant.conformance import check_queen
    from meshant.errors import ConfigError

    try:
        check_endpoint(queen)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--queen") from None
    report = check_queen(queen, timeout=timeout, echo=None if as_json else echo_flush)
    echo_flush(report.dumps() if as_json else report.summary())
    sys.exit(1 if report.failed else 0)


COMMANDS = [conformance]
