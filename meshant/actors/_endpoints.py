"""Endpoints and names for peers: the queen's endpoint (argument, environment, default),
a check that it is one ZeroMQ can connect to, the PUB endpoint to use, default names, and
sizes as people read them."""

from __future__ import annotations

import os
import re
import secrets
import socket

from meshant.errors import ConfigError


def default_name(role: str) -> str:
    return f"{role}-{socket.gethostname().split('.')[0]}-{os.getpid()}-{secrets.token_hex(2)}"


def resolve_queen(queen: str | None) -> str:
    """The queen endpoint: the argument, else ``$MESHANT_QUEEN``, else the default."""
    if queen is not None:
        return queen  # given: checked as it is (an empty one is refused, not defaulted)
    return os.environ.get("MESHANT_QUEEN") or "tcp://127.0.0.1:5670"


_ENDPOINT_RE = re.compile(
    r"^(?:(?:tcp|ws|wss)://(?:\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?:\d{1,5}|\*)(?:/\S*)?"
    r"|(?:ipc|inproc)://\S+|(?:pgm|epgm|udp|vmci)://\S+)$")


def check_endpoint(endpoint: str, what: str = "queen endpoint") -> str:
    """``endpoint`` if it is a ZeroMQ endpoint this peer can connect to, else ConfigError
    naming what is wrong (libzmq would only say "Invalid argument", from another thread)."""
    if not isinstance(endpoint, str) or not _ENDPOINT_RE.match(endpoint):
        raise ConfigError(
            f"{what} {endpoint!r} is not a ZeroMQ endpoint: use tcp://HOST:PORT (e.g. "
            "tcp://127.0.0.1:5670), ipc:///path/to/socket or inproc://name")
    if endpoint.startswith(("tcp://", "ws://", "wss://")):
        port = endpoint.rsplit(":", 1)[1].split("/", 1)[0]
        if port != "*" and not 0 < int(port) < 65536:
            raise ConfigError(f"{what} {endpoint!r}: the port must be 1-65535")
    return endpoint


def check_endpoints(spec: str, what: str = "queen endpoint") -> list[str]:
    """A comma-separated list of queen endpoints (a leader and its standbys), each checked."""
    if not isinstance(spec, str):
        raise ConfigError(f"{what} must be a string, not {type(spec).__name__}")
    endpoints = [e.strip() for e in spec.split(",")]
    if not any(endpoints):
        raise ConfigError(f"{what} is empty: give tcp://HOST:PORT (several, comma-separated, "
                          "for a leader and its standbys)")
    return [check_endpoint(e, what) for e in endpoints if e]


def pub_endpoint_for(pub: str, queen: str) -> str:
    """The PUB endpoint to connect to: a wildcard host is replaced by the queen's host."""
    scheme, _, rest = pub.partition("://")
    if scheme != "tcp":
        return pub
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::", ""):
        qhost = queen.partition("://")[2].rpartition(":")[0]
        return f"tcp://{qhost}:{port}" if qhost else pub
    return pub


def _size_n(n: int) -> str:
    return f"{n:,} bytes" if n < 1024 * 1024 else f"{n:,} bytes ({n / 1048576:.1f} MiB)"


def _size(frames: list[bytes]) -> str:
    return _size_n(max(len(f) for f in frames))
