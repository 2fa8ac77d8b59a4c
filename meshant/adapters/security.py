"""CURVE keys and who may be what: pyzmq's zmq.auth does the cryptography and the ZAP
handshake; this module adds meshant's rule that a key may register only the names and
roles it was granted.

Key files are zmq's certificate format (``NAME.key`` public, ``NAME.key_secret``
secret). meshant writes its grants into the public file's ``metadata`` section:

    metadata
        roles = "forager,client"
        names = "crawler,crawler-*"

A key without grants may register only its own name (the file's stem) or ``stem-*``,
as a client. The role ``admin`` registers as a client that may also do the operators'
operations (drain, halt, dlq retry/purge, inbox purge, reserved memory keys, and
answering or attaching to anyone's task: ``meshant.core.rights``).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from meshant.errors import ConfigError

ROLES = ("forager", "client", "admin")
_META = re.compile(r'^\s+([A-Za-z0-9_-]+)\s*=\s*("?)(.*)\2\s*$')  # quoted or not (ZPL)
_PUBLIC = re.compile(r'^\s+public-key\s*=\s*"(.{40})"\s*$')


@dataclass(frozen=True)
class Grant:
    """What one public key may do."""

    key: bytes
    stem: str
    roles: tuple[str, ...]
    names: tuple[str, ...]

    def allows(self, name: str, role: str) -> str | None:
        """None if allowed, else the reason."""
        if role not in self.roles and not (role == "client" and "admin" in self.roles):
            return (f"key {self.stem!r} may register as {', '.join(self.roles)}, not as "
                    f"{role}")
        if not any(fnmatch.fnmatchcase(name, pat) for pat in self.names):
            return f"key {self.stem!r} may not use the name {name!r} (allowed: " + \
                ", ".join(self.names) + ")"
        return None


def generate(directory: str | os.PathLike[str], name: str, roles: tuple[str, ...] = ("client",),
             names: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` into ``directory``; returns their paths.

    ``zmq.auth.create_certificates`` writes both files and the grants into the secret
    one's ``metadata``; it leaves the public file's ``metadata`` section empty, so the
    grants (which the queen reads there) are added to that section.
    """
    for r in roles:
        if r not in ROLES:
            raise ConfigError(f"role {r!r} is not one of {', '.join(ROLES)}")
    Path(directory).mkdir(parents=True, exist_ok=True)
    # ZPL values, quoted as meshant has always written them (pyzmq writes them verbatim).
    meta = {"roles": f'"{",".join(roles)}"'}
    if names:
        meta["names"] = f'"{",".join(names)}"'
    pub, sec = zmq.auth.create_certificates(str(directory), name, metadata=meta)
    os.chmod(sec, 0o600)
    text = Path(pub).read_text()
    grants = "".join(f"    {k} = {v}\n" for k, v in meta.items())
    Path(pub).write_text(text.replace("\nmetadata\n", f"\nmetadata\n{grants}", 1))
    return Path(pub), Path(sec)


def load_secret(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file, with a clear error if it is not one."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the CURVE secret key file {path}: {e}") from None
    if not secret:
        raise ConfigError(f"{path} holds no secret key (give the .key_secret file)")
    return public, secret


def load_public(path_or_key: str | os.PathLike[str]) -> bytes:
    """A public key from a ``.key`` file, or given directly as 40 z85 characters."""
    text = str(path_or_key)
    if len(text) == 40 and not os.path.exists(text):
        return text.encode()
    try:
        public, _ = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the CURVE public key file {text}: {e}") from None
    return public


def read_grant(path: Path) -> Grant | None:
    meta: dict[str, str] = {}
    key = b""
    section = ""
    for line in path.read_text().splitlines():
        if line and not line[0].isspace():
            section = line.strip()
            continue
        if section == "metadata":
            m = _META.match(line)
            if m:
                meta[m.group(1)] = m.group(3)
        elif section == "curve":
            m = _PUBLIC.match(line)
            if m:
                key = m.group(1).encode()
    if not key:
        return None
    stem = path.name[: -len(".key")]
    roles = tuple(r for r in meta.get("roles", "client").split(",") if r) or ("client",)
    names = tuple(n for n in meta.get("names", "").split(",") if n) or (stem, f"{stem}-*")
    return Grant(key, stem, roles, names)


class Authorized:
    """The public keys in a folder and their grants; :meth:`reload` re-reads it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ConfigError(f"--authorized {directory}: not a folder of public keys")
        self.grants: dict[bytes, Grant] = {}
        self._stamp: tuple[Any, ...] = ()
        self.reload()

    def _fingerprint(self) -> tuple[Any, ...]:
        return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                            for p in self.directory.glob("*.key")))

    def changed(self) -> bool:
        try:
            return self._fingerprint() != self._stamp
        except OSError:
            return False

    def reload(self) -> None:
        grants = {}
        for p in sorted(self.directory.glob("*.key")):
            g = read_grant(p)
            if g is not None:
                grants[g.key] = g
        self.grants = grants
        self._stamp = self._fingerprint()

    def check(self, key: bytes | None, name: str, role: str) -> str | None:
        """None if ``key`` may register ``name`` as ``role``, else why not."""
        if key is None:
            return "no CURVE key on this connection"
        g = self.grants.get(key)
        if g is None:
            return "this key is no longer authorized"
        return g.allows(name, role)

    def roles_of(self, key: bytes) -> tuple[str, ...]:
        """The roles ``key`` was granted (none if it is not, or no longer, authorized)."""
        g = self.grants.get(key)
        return g.roles if g is not None else ()


def server_socket(sock: zmq.Socket[Any], public: bytes, secret: bytes) -> None:
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def client_socket(sock: zmq.Socket[Any], public: bytes, secret: bytes, server: bytes) -> None:
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_serverkey = server
