"""``meshant a2a`` and ``meshant mcp``: the colony behind the agent ecosystem's protocols.

Each runs a client of the colony (the usual connection options) and serves it: A2A over
HTTP, MCP over stdio or streamable HTTP. The SDKs are imported only when the command
runs (the a2a and mcp extras; a missing one is named with the command that installs it:
:func:`meshant._extras.install_hint`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from meshant.cli._options import Connection, client_options

F = TypeVar("F", bound=Callable[..., Any])


def _need(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        from meshant._extras import needs

        raise click.ClickException(needs("this command", extra))


def http_options(default_port: int) -> Callable[[F], F]:
    """The options of a gateway served over HTTP: where, who may call, how much."""
    opts = (
        click.option("--allow-host", "allow_host", multiple=True, metavar="NAME",
                     help="Another Host name to answer to (a reverse proxy's); the bound "
                          "address, localhost and loopback addresses always pass."),
        click.option("--token", envvar="MESHANT_GATEWAY_TOKEN", show_envvar=True,
                     metavar="TOKEN", help="Callers sending 'Authorization: Bearer TOKEN' "
                     "act as this gateway's own identity (its --curve-secret)."),
        click.option("--token-file", metavar="FILE", type=click.Path(dir_okay=False),
                     help="Tokens mapped to colony identities, a line each: 'TOKEN NAME "
                          "[KEYFILE] [read|operator]' (an operator sees every caller's "
                          "tasks in A2A's ListTasks). The queen's rights table applies to each "
                          "caller's key as to any CURVE key (docs/security.md)."),
        click.option("--anonymous", type=click.Choice(["act", "read", "refuse"]),
                     help="What a request without a token may do. Default: act on "
                          "loopback without tokens, read beyond loopback without tokens, "
                          "refuse once tokens are given."),
        click.option("--public-url", metavar="URL",
                     help="The URL clients reach this gateway at (for the agent card); "
                          "default the bound address."),
        click.option("--max-body", type=int, default=1024 * 1024, show_default=True,
                     help="The largest request body, in bytes (larger: the protocol's "
                          "own error)."),
    )

    def deco(fn: F) -> F:
        for o in reversed(opts):
            fn = o(fn)
        return fn
    return deco


def callers_of(host: str, token: str | None, token_file: str | None,
               anonymous: str | None) -> Any:
    """Who may call, from the options; warns when the choice is risky."""
    from meshant.adapters.web.policy import is_loopback_name
    from meshant.errors import ConfigError
    from meshant.gateways.colony import ACT, READ, Caller, Callers, read_token_file

    tokens: dict[str, Caller] = {}
    if token:
        if len(token) < 16:
            raise click.BadParameter("use a token of at least 16 characters",
                                     param_hint="--token")
        tokens[token] = Caller()
    if token_file:
        try:
            tokens.update(read_token_file(token_file))
        except ConfigError as e:
            raise click.BadParameter(str(e), param_hint="--token-file") from None
    loopback = is_loopback_name(host.lower())
    if anonymous is None:
        anonymous = "refuse" if tokens else ("act" if loopback else "read")
    anon = None if anonymous == "refuse" else Caller(rights=ACT if anonymous == "act"
                                                     else READ)
    if not loopback:
        click.echo(f"warning: listening on {host}, reachable beyond this machine: "
                   + ("callers without a token may " + anonymous if anon else
                      "every caller needs a token") + " (docs/security.md)", err=True)
    return Callers(tokens, anon)


def _address(listen: str) -> tuple[str, int]:
    """--listen's [HOST:]PORT (a bare PORT is on loopback)."""
    from meshant.observe.server import parse_http

    try:
        return parse_http(listen)
    except ValueError as e:
        raise click.BadParameter(str(e).replace("--http", "--listen"),
                                 param_hint="--listen") from None


def _link(conn: Connection, name: str | None, refresh: float) -> Any:
    from meshant.gateways.colony import ColonyLink

    return ColonyLink(conn.endpoint, refresh=refresh, timeout=conn.timeout,
                      name=name or conn.default_name("client"), **conn.peer_kwargs())


@click.command("a2a")
@client_options(connect_timeout=10.0)
@click.option("--listen", "-l", default="127.0.0.1:8470", show_default=True,
              metavar="[HOST:]PORT", help="Where to serve A2A (a bare PORT is on "
              "loopback; 0 picks a free port).")
@http_options(8470)
@click.option("--name", help="This gateway's client name at the queen (default "
              "client-HOST-PID-…).")
@click.option("--wait", type=float, default=None,
              help="Seconds a task waits for a forager of its skill (default: the "
                   "queen's).")
@click.option("--refresh", type=float, default=1.0, show_default=True,
              help="Seconds between reads of the colony's capabilities (the card's "
                   "skills follow foragers as they come and go).")
@click.option("--push-host", "push_host", multiple=True, metavar="NAME",
              help="Offer push notifications, to webhooks on this host: a name, an IP "
                   "address, '*.DOMAIN' (its subdomains) or '*' (any public host). Never to "
                   "a private, loopback or link-local address unless --push-network allows "
                   "it. Without it, push notifications are not offered.")
@click.option("--push-network", "push_network", multiple=True, metavar="CIDR",
              help="A non-public network webhooks may be in too (e.g. 127.0.0.0/8 for a "
                   "receiver on this machine, 10.0.0.0/8 inside a private network).")
@click.option("--json", "as_json", is_flag=True, help="Print the ready line as JSON.")
def a2a_cmd(conn: Connection, listen: str, allow_host: tuple[str, ...], token: str | None,
            token_file: str | None, anonymous: str | None, public_url: str | None,
            max_body: int, name: str | None, wait: float | None, refresh: float,
            push_host: tuple[str, ...], push_network: tuple[str, ...],
            as_json: bool) -> None:
    """Serve the colony to A2A clients (A2A 1.0: JSON-RPC with SSE streaming, and
    HTTP+JSON).

    The agent card at /.well-known/agent-card.json lists each capability as a skill; a
    message names its skill in metadata.skill (a data part is the payload as JSON, a
    text part a string payload). Each capability is also an agent of its own at
    /agents/CAPABILITY. An A2A task id is the meshant task id: any gateway serves it.

    \b
      meshant queen &
      meshant forager &
      meshant a2a --listen 127.0.0.1:8470
    """
    _need("a2a", "a2a")
    from meshant.errors import ConfigError

    host, port = _address(listen)
    callers = callers_of(host, token, token_file, anonymous)
    try:
        from meshant.gateways.a2a_push import PushPolicy

        push = PushPolicy.of(push_host, push_network)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    link = _link(conn, name, refresh)
    try:
        asyncio.run(_serve_a2a(link, host, port, callers, allow_host, public_url,
                               max_body, wait, push, as_json))
    except OSError as e:
        raise click.ClickException(f"cannot listen on {listen}: {e.strerror or e}") from None
    finally:
        link.close()


async def _serve_a2a(link: Any, host: str, port: int, callers: Any,
                     allow_host: tuple[str, ...], public_url: str | None, max_body: int,
                     wait: float | None, push: Any, as_json: bool) -> None:
    from meshant.gateways import a2a
    from meshant.gateways.http import bind, gateway_limits, guarded, serve, url_of

    await _start_link(link)
    sock = bind(host, port)
    url = public_url or url_of(sock, host)
    limits = gateway_limits(max_body)
    app = guarded(a2a.app(link, url, wait=wait, push=push), host, callers, limits,
                  allow_host)

    def ready() -> None:
        info = {"a2a": url + "/", "card": url + "/.well-known/agent-card.json",
                "spec": a2a.SPEC, "bindings": list(a2a.BINDINGS),
                "colony": link.colony, "skills": list(link.catalog),
                "push": list(push.hosts)}
        if as_json:
            click.echo(json.dumps(info))
        else:
            click.echo(f"meshant a2a: serving {a2a.SPEC} ({', '.join(a2a.BINDINGS)}) for "
                       f"colony {link.colony!r} at {url}/ — card {info['card']}; skills: "
                       f"{', '.join(link.catalog) or 'none yet'}"
                       + (f"; push notifications to {', '.join(push.hosts)}"
                          if push.enabled else ""))
        sys.stdout.flush()

    await serve(app, sock, limits, ready)


@click.command("mcp")
@client_options(connect_timeout=10.0)
@click.option("--listen", "-l", default=None, metavar="[HOST:]PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (a bare "
                   "PORT is on loopback; 0 picks a free port).")
@http_options(8471)
@click.option("--name", help="This gateway's client name at the queen.")
@click.option("--wait", type=float, default=None,
              help="Seconds a call waits for a forager of its tool (default: the queen's).")
@click.option("--refresh", type=float, default=1.0, show_default=True,
              help="Seconds between reads of the colony's capabilities (the tool list "
                   "follows foragers as they come and go, with list-changed notices).")
@click.option("--json", "as_json", is_flag=True, help="With --listen: the ready line as JSON.")
def mcp_cmd(conn: Connection, listen: str | None, allow_host: tuple[str, ...],
            token: str | None, token_file: str | None, anonymous: str | None,
            public_url: str | None, max_body: int, name: str | None, wait: float | None,
            refresh: float, as_json: bool) -> None:
    """Serve the colony to MCP hosts: each capability is a tool.

    Without --listen it speaks MCP on stdin/stdout, for a host that starts it (its
    config's command: meshant mcp --queen tcp://HOST:5670). With --listen, streamable
    HTTP at /mcp (its streams resumable). Arguments are the task's payload; progress and
    partial results are progress notifications; a question (ctx.ask) is an elicitation
    (or a sampling request to the host's model); cancelling the call cancels the task.
    Resources: meshant://colony/status, meshant://memory/KEY, meshant://tasks/ID.

    \b
      meshant queen &
      meshant forager &
      meshant mcp --listen 127.0.0.1:8471
    """
    _need("mcp", "mcp")

    link = _link(conn, name, refresh)
    try:
        if listen is None:
            if token or token_file:
                raise click.BadParameter("tokens are for --listen: a stdio server's caller "
                                         "is the host that started it", param_hint="--token")
            asyncio.run(_serve_mcp_stdio(link, wait))
            return
        host, port = _address(listen)
        callers = callers_of(host, token, token_file, anonymous)
        asyncio.run(_serve_mcp_http(link, host, port, callers, allow_host, max_body, wait,
                                    as_json))
    except OSError as e:
        raise click.ClickException(f"cannot serve: {e.strerror or e}") from None
    finally:
        link.close()


async def _start_link(link: Any) -> None:
    from meshant.errors import MeshantError

    try:
        await asyncio.to_thread(link.client)
        await link.refresh_now()
    except MeshantError as e:
        raise click.ClickException(str(e)) from None
    link.start()


async def _serve_mcp_stdio(link: Any, wait: float | None) -> None:
    from meshant.gateways import mcp

    await _start_link(link)
    await mcp.serve_stdio(mcp.ColonyTools(link, wait=wait))


async def _serve_mcp_http(link: Any, host: str, port: int, callers: Any,
                          allow_host: tuple[str, ...], max_body: int, wait: float | None,
                          as_json: bool) -> None:
    from meshant.gateways import mcp
    from meshant.gateways.http import bind, gateway_limits, guarded, serve, url_of

    await _start_link(link)
    sock = bind(host, port)
    url = url_of(sock, host) + "/mcp"
    limits = gateway_limits(max_body)
    app = guarded(mcp.http_app(mcp.ColonyTools(link, wait=wait), host, max_body), host,
                  callers, limits, allow_host)

    def ready() -> None:
        info = {"mcp": url, "spec": mcp.SPEC, "transport": "streamable-http",
                "tools": list(link.catalog)}
        click.echo(json.dumps(info) if as_json else
                   f"meshant mcp: serving {mcp.SPEC} over streamable HTTP at {url}; tools: "
                   f"{', '.join(link.catalog) or 'none yet'}")
        sys.stdout.flush()

    await serve(app, sock, limits, ready)


COMMANDS = [a2a_cmd, mcp_cmd]

__all__ = ["COMMANDS", "callers_of", "http_options"]

