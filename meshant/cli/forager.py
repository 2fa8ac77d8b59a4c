"""``meshant forager``: run a forager serving the demo capabilities or an --app's."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from meshant.actors.config import ForagerConfig
from meshant.actors.forager import Forager
from meshant.cli._options import JSON_OPT, Connection, echo_flush, jsonable, labels, peer_options
from meshant.errors import MeshantError


def load_app(spec: str) -> Any:
    """The ``--app``: ``MODULE[:ATTR]`` imported as Python imports it (the current
    directory first, then PYTHONPATH, then installed packages), or ``FILE.py[:ATTR]``
    loaded from that path (its directory first on sys.path, so its siblings import as
    when it is run). ATTR names a Forager, a dict of capability → handler, or a function;
    without it, the module's one Forager. An error says where it looked."""
    where, sep, attr = spec.rpartition(":")
    if not sep:
        where, attr = spec, ""
    if not where:
        raise click.BadParameter("expected MODULE:ATTR or path/to/file.py:ATTR",
                                 param_hint="--app")
    is_file = where.endswith(".py") or "/" in where or os.sep in where
    module = _import_file(where) if is_file else _import_module(where)
    shown = where
    found = [k for k, v in vars(module).items() if isinstance(v, Forager)]
    if not attr:
        if len(found) != 1:
            raise click.BadParameter(f"{shown!r} has {len(found)} Forager objects"
                                     + (f" ({', '.join(found)})" if found else "")
                                     + "; name one as MODULE:ATTR", param_hint="--app")
        return getattr(module, found[0])
    try:
        return getattr(module, attr)
    except AttributeError:
        has = f" (its Forager objects: {', '.join(found)})" if found else ""
        raise click.BadParameter(f"{shown!r} has no attribute {attr!r}{has}",
                                 param_hint="--app") from None


def _import_module(name: str) -> Any:
    cwd = os.getcwd()
    # The console script, unlike `python -m`, does not put the current directory first.
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise _broken(name, e) from None  # the module is there; an import in it fails
        path = os.environ.get("PYTHONPATH")
        top, dot, _ = name.partition(".")
        holds = f"the package {top}/" if dot else f"{top}.py"
        raise click.BadParameter(
            f"cannot import {name!r}: no module {e.name!r} in the current directory ({cwd}), "
            f"on PYTHONPATH ({path or 'not set'}) or in the installed packages; run this "
            f"from the directory that holds {holds}, add that directory to PYTHONPATH, or "
            f"give the file's path: --app path/to/{name.rpartition('.')[2]}.py:ATTR",
            param_hint="--app") from None
    except Exception as e:
        raise _broken(name, e) from None


def _import_file(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise click.BadParameter(f"cannot import {path!r}: no such file (from {os.getcwd()})",
                                 param_hint="--app")
    name = file.stem if file.stem.isidentifier() else "meshant_app"
    if name in sys.modules:  # (never shadow a module already imported: json.py, queue.py)
        name = f"meshant_app_{name}"
    sys.path.insert(0, str(file.resolve().parent))
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise click.BadParameter(f"cannot import {path!r}: not a Python file",
                                 param_hint="--app")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # (dataclasses and pickle look a module up by name)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise _broken(path, e) from None
    return module


def _broken(name: str, e: BaseException) -> click.BadParameter:
    """The module was found but importing it failed: what it raised, and where in it."""
    at = ""
    if isinstance(e, SyntaxError) and e.filename:
        at = f" ({e.filename}, line {e.lineno})"
    elif e.__traceback__ is not None:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        at = f" ({frame.filename}, line {frame.lineno})"
    what = e.msg if isinstance(e, SyntaxError) else str(e)
    return click.BadParameter(f"cannot import {name!r}: importing it raised "
                              f"{type(e).__name__}: {what}{at}", param_hint="--app")


def _serve(f: Forager, app: str, target: Any) -> None:
    """Give ``f`` the handlers that an ``--app`` dict or function names."""
    if isinstance(target, dict):
        for cap, fn in target.items():
            f.add_handler(str(cap), fn)
    elif callable(target):
        f.add_handler(target.__name__, target)
    else:
        raise click.BadParameter(f"{app!r} is not a Forager, dict or function",
                                 param_hint="--app")


def _overrides(conn: Connection, app: Forager, name: str | None, slots: int,
               label_values: tuple[str, ...]) -> tuple[str | None, dict[str, Any]]:
    """The app Forager's settings that this command line changes: only the options the
    user gave (on the line or in the environment), never a default. Labels are merged."""
    ctx = click.get_current_context()

    def given(param: str) -> bool:
        return ctx.get_parameter_source(param) in (ParameterSource.COMMANDLINE,
                                                    ParameterSource.ENVIRONMENT)

    settings: dict[str, Any] = {}
    queen = None
    if conn.discover:
        settings["discover"] = True
    elif given("queen") or (not app.queens and app.config.discover is None):
        # A Forager() that names no queen would discover one; here the command line's
        # --queen (its default included) says where it is, as without --app.
        queen, settings["discover"] = conn.queen, False
    for param, value in (("colony", conn.colony), ("curve_secret", conn.curve_secret),
                         ("queen_key", conn.queen_key), ("name", name), ("slots", slots)):
        if given(param):
            settings[param] = value
    if label_values:
        settings["labels"] = {**app.labels, **labels(label_values)}
    return queen, settings


@click.command()
@peer_options
@click.option("--app", "-a", "app", metavar="MODULE:ATTR",
              help="Handlers to serve: ATTR names a Forager object, a dict of capability "
                   "→ function, or a function (its name is the capability); without :ATTR, "
                   "the module's one Forager. MODULE is imported from the current "
                   "directory, then PYTHONPATH, then the installed packages; or give a "
                   "file, path/to/mod.py:ATTR. Default: the demo capabilities echo, sleep, "
                   "fail and stream.")
@click.option("--name", "-n", help="Forager name (default: the --app Forager's, else "
              "forager-<host>-<pid>-<rand>).")
@click.option("--slots", "-s", type=click.IntRange(1, 10_000), default=1, show_default=True,
              envvar="MESHANT_SLOTS", show_envvar=True,
              help="Tasks run at once (default: the --app Forager's, else 1).")
@click.option("--label", "-l", "label_values", multiple=True, metavar="KEY=VALUE",
              help="A label tasks can require (repeatable; added to the --app Forager's).")
@click.option("--builtins/--no-builtins", default=None,
              help="Also serve the demo capabilities (default: only without --app).")
@click.option("--subscribe", "subscriptions", multiple=True, metavar="PREFIX",
              help="Print broadcasts whose topic starts with PREFIX as JSON lines "
                   "(repeatable; '' for all).")
@click.option("--mcp", "mcp_command", metavar="'COMMAND ARGS'",
              help="Serve every tool of this MCP server (started as a subprocess, spoken "
                   "to over stdio) as a capability (needs the mcp extra).")
@click.option("--a2a", "a2a_url", metavar="URL",
              help="Serve every skill of the A2A agent at URL (its card at "
                   "URL/.well-known/agent-card.json) as a capability (needs the a2a extra).")
@click.option("--drain-timeout", type=float, default=600.0, show_default=True,
              help="On SIGTERM, seconds to finish running tasks before stopping anyway.")
@JSON_OPT
def forager(conn: Connection, app: str | None, name: str | None, slots: int,
            label_values: tuple[str, ...], builtins: bool | None,
            subscriptions: tuple[str, ...], mcp_command: str | None, a2a_url: str | None,
            drain_timeout: float, as_json: bool) -> None:
    """Run a forager that serves tasks for the queen.

    With --app naming a Forager object, that forager runs as the module built it: its
    queen, name, slots, labels, handlers, broadcast handlers (@forager.on) and message
    callbacks; an option given here (or its environment variable) changes just that
    setting.

    With --mcp or --a2a an existing MCP server or A2A agent joins the colony: its tools
    or skills become capabilities (with their descriptions and schemas), and the
    colony's leases, retries, dead letters, rights and dashboard hold for them.

    SIGTERM drains it (finish running tasks, take no new ones, leave); Ctrl-C stops it at
    once and hands its running tasks back to the queen.
    """
    from meshant.apps.builtin import add_builtins

    target = load_app(app) if app is not None else None
    try:
        if isinstance(target, Forager):
            queen, settings = _overrides(conn, target, name, slots, label_values)
            target.configure(queen, **settings)
            f = target
        else:
            f = Forager(conn.endpoint, config=ForagerConfig(
                name=name or conn.default_name("forager"), slots=slots,
                labels=labels(label_values), **conn.peer_kwargs()))
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    for prefix in subscriptions:
        try:
            f.subscribe(prefix, _print_broadcast)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--subscribe") from None
    if app is not None and not isinstance(target, Forager):
        _serve(f, app, target)
    wrapped = _wrap(f, mcp_command, a2a_url)
    if builtins or (builtins is None and app is None and wrapped is None):
        add_builtins(f)
    ready = threading.Thread(target=_announce, args=(f, as_json), daemon=True)
    ready.start()
    try:
        f.run(drain_timeout=drain_timeout)
    except MeshantError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if wrapped is not None:
            wrapped.close()
    if f.refusal is not None:
        raise click.ClickException(str(f.refusal))
    click.echo(f"meshant forager {f.name!r} stopped", err=True)


def _wrap(f: Forager, mcp_command: str | None, a2a_url: str | None) -> Any:
    """Start the MCP server or reach the A2A agent, and serve what it offers on ``f``."""
    if mcp_command is not None and a2a_url is not None:
        raise click.UsageError("give --mcp or --a2a, not both (run two foragers)")
    if mcp_command is None and a2a_url is None:
        return None
    import importlib.util

    extra, module = ("mcp", "mcp") if mcp_command is not None else ("a2a", "a2a")
    if importlib.util.find_spec(module) is None:
        from meshant._extras import needs

        raise click.ClickException(needs(f"--{extra}", extra))
    from meshant.gateways.wrap import A2AWrap, MCPWrap

    w: Any = MCPWrap(mcp_command) if mcp_command is not None else A2AWrap(str(a2a_url))
    what = f"the MCP server {mcp_command!r}" if mcp_command else f"the A2A agent {a2a_url}"
    try:
        w.start()
        w.serve_on(f)
    except Exception as e:
        w.close()
        raise click.ClickException(f"cannot serve {what}: {type(e).__name__}: {e}") from None
    return w


def _print_broadcast(topic: str, data: Any, msg: Any) -> None:
    echo_flush(json.dumps({"event": "broadcast", "topic": topic, "from": msg.frm,
                           "data": jsonable(data)}))


def _announce(f: Forager, as_json: bool) -> None:
    while not f.wait_welcomed(0.5):
        if f.stopping:
            return
    if f.refusal is not None or f.stopping:
        return
    if as_json:
        echo_flush(json.dumps({"event": "ready", "name": f.name, "queen": f.queen,
                               "slots": f.slots, "tools": f.tools, "epoch": f.epoch}))
    else:
        echo_flush(f"meshant forager {f.name!r} ready: queen={f.queen} slots={f.slots} "
                   f"tools={','.join(f.tools)}")


COMMANDS = [forager]
