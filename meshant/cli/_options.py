"""What the commands share: the connection options, one way to open a Client from them
(with one translation of its errors into click errors), and small parsing helpers."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from meshant.errors import MeshantError, format_frames

if TYPE_CHECKING:
    from meshant.actors.client import Client

F = TypeVar("F", bound=Callable[..., Any])

JSON_OPT = click.option("--json", "as_json", is_flag=True,
                        help="Machine-readable output: JSON (one object per line).")

# The options naming and securing the queen, in the order --help lists them; every
# client command takes all of them (plus --connect-timeout), the forager all but that.
_PEER_OPTS = (
    click.option("--queen", "-q", envvar="MESHANT_QUEEN", show_envvar=True,
                 default="tcp://127.0.0.1:5670", show_default=True,
                 help="The queen's ROUTER endpoint; several, comma-separated, for a "
                      "leader and its standbys (tried in turn, docs/ha.md)."),
    click.option("--discover", "-d", is_flag=True,
                 help="Find the queen by mDNS (zeroconf) instead of --queen."),
    click.option("--colony", envvar="MESHANT_COLONY", show_envvar=True,
                 help="With --discover: the colony to join (needed when several "
                      "colonies share the network)."),
    click.option("--curve-secret", envvar="MESHANT_CURVE_SECRET", show_envvar=True,
                 metavar="FILE", help="This peer's CURVE key pair (.key_secret file): "
                 "encrypts and authenticates everything with the queen."),
    click.option("--queen-key", envvar="MESHANT_QUEEN_KEY", show_envvar=True,
                 metavar="FILE", help="The queen's CURVE public key (its .key file); "
                 "with --discover it may come from the advertisement instead."),
)
_NAMES = ("queen", "discover", "colony", "curve_secret", "queen_key", "connect_timeout")


@dataclass(frozen=True)
class Connection:
    """Where the queen is and how to reach it, as the connection options gave it."""

    queen: str
    discover: bool = False
    colony: str | None = None
    curve_secret: str | None = None
    queen_key: str | None = None
    timeout: float = 5.0

    def peer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments locating and securing the queen, for a Client or Forager."""
        return {"discover": self.discover, "colony": self.colony,
                "curve_secret": self.curve_secret, "queen_key": self.queen_key}

    def default_name(self, role: str) -> str | None:
        """A name for a peer given none: with a CURVE key NAME.key_secret, NAME-HOST-PID-…,
        which that key may register (by default its grants are NAME and NAME-*); else
        None, the peer's own default (ROLE-HOST-PID-…)."""
        if not self.curve_secret:
            return None
        from meshant.actors._endpoints import default_name

        return default_name(Path(self.curve_secret).name.split(".")[0] or role)

    @property
    def endpoint(self) -> str | None:
        return None if self.discover else self.queen

    @contextmanager
    def client(self, follow_leader: bool = True,
               on_progress: Callable[[str, Any], Any] | None = None) -> Iterator[Client]:
        """A connected Client, closed on the way out. Failing to connect, and any
        MeshantError or ValueError while it is used, become a one-line click error
        (exit 1); but a standby's ``not-leader`` is raised as the ``Refused`` it is when
        ``follow_leader`` is False (``meshant status`` reports it). ``on_progress``: the
        Client's, called in its I/O thread with each update of a task it submitted."""
        from meshant.actors.client import Client
        from meshant.actors.config import ClientConfig

        try:
            c = Client(self.endpoint, on_progress=on_progress,
                       config=ClientConfig(timeout=self.timeout, follow_leader=follow_leader,
                                           name=self.default_name("client"),
                                           **self.peer_kwargs()))
        except (MeshantError, ValueError) as e:  # QueenUnreachable, Refused, bad keys...
            if not follow_leader and getattr(e, "code", "") == "not-leader":
                raise
            raise click.ClickException(str(e)) from None
        try:
            yield c
        except (MeshantError, ValueError) as e:
            raise click.ClickException(str(e)) from None
        finally:
            c.close()


def _collapse(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking one ``conn`` argument instead of the connection options' values."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        given = {n: kw.pop(n) for n in _NAMES if n in kw}
        given["timeout"] = given.pop("connect_timeout", 0.0)
        return fn(*args, conn=Connection(**given), **kw)
    return wrapper


def client_options(connect_timeout: float = 5.0) -> Callable[[F], F]:
    """The connection options of every client command, handed to it as ``conn``
    (a :class:`Connection`): --queen, --discover, --colony, --curve-secret, --queen-key
    and --connect-timeout."""
    def deco(fn: F) -> F:
        wrapper = _collapse(fn)
        wrapper = click.option(
            "--connect-timeout", type=float, default=connect_timeout, show_default=True,
            envvar="MESHANT_CONNECT_TIMEOUT", show_envvar=True,
            help="Seconds to wait for the queen to answer.")(wrapper)
        for opt in reversed(_PEER_OPTS):
            wrapper = opt(wrapper)
        return wrapper  # type: ignore[return-value]
    return deco


def peer_options(fn: F) -> F:
    """The forager's connection options: the client ones but --connect-timeout (it waits
    for its queen as long as it takes). Handed to it as ``conn``."""
    wrapper = _collapse(fn)
    for opt in reversed(_PEER_OPTS):
        wrapper = opt(wrapper)
    return wrapper  # type: ignore[return-value]


def labels(values: tuple[str, ...]) -> dict[str, Any]:
    """--label KEY=VALUE pairs; a VALUE that parses as JSON is taken as JSON."""
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


def parse_json(text: str | None, hint: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=hint) from None


def jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


def echo_flush(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()


def error_text(err: dict[str, Any]) -> str:
    """A failed task's ``error`` map as a person reads it: ``[code] Type: message``, then
    the handler's traceback (where it was raised, innermost last) when there is one."""
    line = (f"[{err.get('code', 'error')}] "
            f"{str(err['type']) + ': ' if err.get('type') else ''}{err.get('message', '')}")
    tb = format_frames(err.get("traceback"))
    if tb:
        where = f" on {err['forager']}" if err.get("forager") else ""
        line += f"\nTraceback{where} (most recent call last):\n" + "\n".join(tb)
    return line
