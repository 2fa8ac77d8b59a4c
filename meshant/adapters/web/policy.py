"""What every meshant HTTP surface accepts, sans-IO: the limits and timeouts a server
applies, and who may ask what (the Host, the Origin, the bearer token).

A page on another site must not read the colony through the user's browser: neither by
rebinding its own name to 127.0.0.1 (so **Host** must be one of this server's names),
nor by calling the port from its own origin (so an **Origin** other than the server's
own, or a browser's ``Sec-Fetch-Site: cross-site``, is refused — reads included, as
Jupyter does and the MCP specification asks of local servers). A **token** guards the
actions always, and the reads too when the server is given a read token.

Nothing here does I/O: :meth:`Policy.check` takes a request's method, headers and what
it needs, and returns a :class:`Verdict`. The dashboard's asyncio server
(:mod:`.server`) and the ASGI middleware (:mod:`.asgi`, for gateways served by uvicorn)
both apply it.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

# Names that only ever mean this machine: no page can rebind them (browsers resolve
# *.localhost themselves, RFC 6761), so they are safe Host values everywhere.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                            "ip6-loopback"})
WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})
_DEFAULT_PORT = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one HTTP surface may take, and for how long (seconds, bytes, counts).

    The server holds at most ``max_connections`` sockets (fewer when the process may
    open few files: see :meth:`bounded`); one that has sent no whole request costs a
    descriptor and a few hundred bytes. A new one past that replaces the oldest that
    has not finished sending a request, or gets 503 when every one is busy. It accepts
    at most ``accept_rate`` new connections a second, so a flood of connects costs its
    thread a bounded share of a core. A request's head must arrive within
    ``header_timeout`` of the connection (or of its first byte, on a kept-alive one),
    its body within ``body_timeout`` after that; a kept-alive connection may sit idle
    ``idle_timeout``, and a client must take each response within ``write_timeout``.
    """

    max_connections: int = 4096
    accept_rate: float = 2000.0
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 5.0
    write_timeout: float = 10.0
    max_head: int = 16 * 1024
    max_headers: int = 64
    max_body: int = 64 * 1024
    max_streams: int = 64
    max_pending: int = 16

    def bounded(self, open_files: int) -> Limits:
        """These limits with ``max_connections`` at most a quarter of ``open_files`` (the
        process's RLIMIT_NOFILE), so HTTP sockets can never take the descriptors the
        queen's own sockets and journal need."""
        from dataclasses import replace

        return replace(self, max_connections=max(8, min(self.max_connections,
                                                         open_files // 4)))


DEFAULT_LIMITS = Limits()


class Access(enum.IntEnum):
    """What a request needs, or what its credentials grant: each level includes those
    below it."""

    PUBLIC = 0  # no colony data: the page, its script, health status
    READ = 1  # the colony's state
    ACT = 2  # changing it


@dataclass(frozen=True, slots=True)
class Verdict:
    """``status`` 0 lets the request through with ``rights``; anything else is the HTTP
    status to answer with and ``reason``, one line for the person who sent it."""

    status: int
    reason: str = ""
    rights: Access = Access.PUBLIC

    @property
    def ok(self) -> bool:
        return self.status == 0


@dataclass(frozen=True, slots=True)
class Flags:
    """How the operator turns each setting on, named in refusals (a gateway names its
    own flags)."""

    allow_host: str = "--http-allow-host"
    token: str = "--http-token (or MESHANT_HTTP_TOKEN)"
    read_token: str = "--http-read-token (or --http-token)"


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (``name``, ``name:port``, ``[v6]:port``) as (lower-case name without
    brackets or trailing dot, port); None if it is not one."""
    v = value.strip()
    if not v or any(c in v for c in " /\\@?#\t"):
        return None
    port: int | None = None
    if v.startswith("["):
        host, sep, rest = v[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        ptxt = rest[1:] if rest else None
    else:
        host, sep, ptxt_ = v.rpartition(":")
        if not sep:
            host, ptxt = v, None
        else:
            ptxt = ptxt_
        if ":" in host:  # an IPv6 address must be bracketed
            return None
    if ptxt is not None:
        if not ptxt.isdigit() or len(ptxt) > 5 or int(ptxt) > 65535:
            return None
        port = int(ptxt)
    host = host.lower().removesuffix(".")
    return (host, port) if host else None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback_name(host: str) -> bool:
    """A loopback address, or a name that means this machine whatever DNS says."""
    ip = _ip(host)
    if ip is not None:
        mapped = getattr(ip, "ipv4_mapped", None)
        return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))
    return host in LOOPBACK_NAMES or host.endswith(".localhost")


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` header, else ''."""
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _same(given: str, token: str | None) -> bool:
    # Constant time: how long the comparison takes says nothing about the token.
    return token is not None and hmac.compare_digest(given.encode(), token.encode())


class Policy:
    """Host, Origin and token rules for one surface bound to ``bound`` (its listening
    host). ``allow_hosts`` adds names a reverse proxy forwards under (``*`` turns the
    Host check off: only behind a proxy that checks it). ``action_token`` turns the
    actions on; ``read_token``, when set, is needed for reads too (the action token
    reads as well)."""

    def __init__(self, bound: str, *, allow_hosts: Iterable[str] = (),
                 read_token: str | None = None, action_token: str | None = None,
                 flags: Flags = Flags()) -> None:
        self.bound = bound.strip("[]").lower().removesuffix(".")
        names = set()
        for h in allow_hosts:
            parsed = split_host(h) if h.strip() != "*" else ("*", None)
            if parsed is None:
                raise ValueError(f"{flags.allow_host} {h!r}: expected a host name or "
                                 "address (a port is ignored)")
            names.add(parsed[0])
        self.allow_any = "*" in names
        self.allow_hosts = frozenset(names - {"*"})
        self.read_token = read_token or None
        self.action_token = action_token or None
        self.flags = flags

    # -- the rules, each on its own ------------------------------------------------------

    def host_refusal(self, host: str | None, version: str = "HTTP/1.1") -> str | None:
        """Why this Host is refused, or None."""
        if host is None:
            # HTTP/1.0 may omit it (a browser never does, so it is no rebinding).
            return None if version == "HTTP/1.0" else "a Host header is required"
        parsed = split_host(host)
        if parsed is None:
            return f"Host {host[:100]!r} is not a host name"
        name = parsed[0]
        if self.allow_any or self.host_allowed(name):
            return None
        return (f"Host {name[:100]!r} is not a name of this server: it answers to "
                f"{self._names()}; a reverse proxy's name is added with "
                f"{self.flags.allow_host}")

    def host_allowed(self, name: str) -> bool:
        if name in self.allow_hosts or name == self.bound or is_loopback_name(name):
            return True
        # A page's DNS rebinding always arrives under a name; an address typed as such
        # is the page's own origin. So a wildcard bind serves any address literal.
        return self.bound in WILDCARDS and _ip(name) is not None

    def origin_refusal(self, origin: str | None, host: str | None) -> str | None:
        """Why a request from this Origin is refused, or None: only the server's own
        pages (same host and port as the request's Host) and the allowed names pass."""
        if origin is None:
            return None
        why = f"cross-origin request from {origin[:100]!r} refused: only this server's " \
              "own pages may call it"
        try:
            u = urlsplit(origin.strip())
            oport = u.port or _DEFAULT_PORT.get(u.scheme)
        except ValueError:
            return why
        oname = (u.hostname or "").removesuffix(".")
        if u.scheme not in _DEFAULT_PORT or not oname:
            return why  # "null" (a sandboxed frame, a file), or not a web origin
        if oname in self.allow_hosts:
            return None
        own = split_host(host) if host is not None else None
        if own is not None and own[0] == oname and (
                own[1] == oport or (own[1] is None and u.port is None)):
            return None
        return why

    @staticmethod
    def fetch_refusal(method: str, headers: Mapping[str, str]) -> str | None:
        """A browser's own word (``Sec-Fetch-*``) that another site sent the request: it
        covers what sends no Origin (an image, a script tag). A top-level navigation
        is let through: the user's tab shows the answer, no page reads it."""
        site = headers.get("sec-fetch-site")
        if site not in ("cross-site", "same-site"):
            return None
        if (method in ("GET", "HEAD") and headers.get("sec-fetch-mode") == "navigate"
                and headers.get("sec-fetch-dest", "document") == "document"):
            return None
        return f"request from another site ({site}) refused: only this server's own " \
               "pages may call it"

    def rights(self, authorization: str | None) -> Access:
        """What the request's bearer token grants."""
        given = bearer(authorization)
        if given and _same(given, self.action_token):
            return Access.ACT
        if given and _same(given, self.read_token):
            return Access.READ
        return Access.READ if self.read_token is None else Access.PUBLIC

    # -- all of them ---------------------------------------------------------------------

    def check(self, method: str, headers: Mapping[str, str], need: Access,
              version: str = "HTTP/1.1") -> Verdict:
        """The verdict on one request; ``headers`` has lower-case names."""
        host = headers.get("host")
        why = self.host_refusal(host, version)
        if why is not None:
            return Verdict(400 if host is None or split_host(host) is None else 403, why)
        why = self.origin_refusal(headers.get("origin"), host) or self.fetch_refusal(
            method, headers)
        if why is not None:
            return Verdict(403, why)
        rights = self.rights(headers.get("authorization"))
        if need == Access.ACT and self.action_token is None:
            return Verdict(403, "actions are off: this server is read-only; start it with "
                                f"{self.flags.token} to allow them", rights)
        if rights < need:
            token = self.flags.read_token if need == Access.READ else self.flags.token
            return Verdict(401, "a valid token is needed: send 'Authorization: Bearer "
                                f"TOKEN', TOKEN being the one given to {token}", rights)
        return Verdict(0, "", rights)

    def _names(self) -> str:
        own = ["any address"] if self.bound in WILDCARDS else [self.bound]
        names = [*own, *sorted(self.allow_hosts), "localhost"]
        return ", ".join(dict.fromkeys(names)) + " and loopback addresses"


def security_headers(html: bool = False) -> list[tuple[str, str]]:
    """Headers every answer carries: not cached, not sniffed, not embedded in another
    site's frame (where a click could land on an action), not read by another origin's
    no-cors request; a page may load only what this server serves."""
    out = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
           ("Cross-Origin-Resource-Policy", "same-origin"), ("Referrer-Policy", "no-referrer"),
           ("X-Frame-Options", "DENY")]
    if html:
        out.append(("Content-Security-Policy",
                    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                    "form-action 'self'"))
    return out


__all__ = ["DEFAULT_LIMITS", "LOOPBACK_NAMES", "Access", "Flags", "Limits", "Policy",
           "Verdict", "bearer", "is_loopback_name", "security_headers", "split_host"]
