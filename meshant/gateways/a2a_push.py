"""A2A push notifications: where a gateway may send a task's updates, and sending them.

A webhook URL is the client's, but the request comes from the gateway's network: an
open door to the gateway's neighbours (server-side request forgery). So a gateway pushes
only to the hosts it was told to (``--push-host``; none: push notifications are not
offered), and never to a private, loopback, link-local or otherwise non-public address
unless a network holding it was allowed as well (``--push-network``). The URL's host is
checked against the allowed names when the config is created; its addresses when each
notification is sent (DNS may answer differently by then), and the request goes to the
address that was checked (no second lookup between check and connect), with no
redirects followed and no proxy from the environment.

A notification is the event as a ``StreamResponse`` (JSON), with the config's
credentials (``Authorization: SCHEME CREDENTIALS``; its ``token`` as
``X-A2A-Notification-Token``); a failed delivery (no connection, a timeout, 408, 429 or a
5xx) is tried again with exponential backoff, a few times, then given up on and logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshant.errors import ConfigError

log = logging.getLogger("meshant.gateways.a2a.push")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

RETRYABLE = frozenset({408, 425, 429})  # and every 5xx


class PushRefused(Exception):
    """A webhook URL the policy does not allow (the message says why)."""


def _address(text: str) -> Address | None:
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped if mapped is not None else addr


def public(addr: Address) -> bool:
    """Whether an address is a public unicast destination (not private, loopback,
    link-local, shared, reserved, multicast or unspecified)."""
    return (addr.is_global and not (addr.is_loopback or addr.is_link_local
                                    or addr.is_multicast or addr.is_reserved
                                    or addr.is_unspecified))


@dataclass(frozen=True, slots=True)
class PushPolicy:
    """Where push notifications may go: host names (``*`` any, ``*.example.com`` its
    subdomains, an exact name or IP address) and the non-public networks allowed as
    destinations too (``127.0.0.0/8`` for a receiver on this machine)."""

    hosts: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str], networks: Iterable[str]) -> PushPolicy:
        """A policy from option values; ConfigError names the one that is wrong."""
        hs = []
        for h in hosts:
            name = h.strip().lower().rstrip(".")
            if not name or (name != "*" and (not name.replace("*.", "", 1)
                                             or "*" in name.replace("*.", "", 1)
                                             or "/" in name or " " in name)):
                raise ConfigError(f"--push-host {h!r}: give a host name, an IP address, "
                                  "'*.DOMAIN' or '*'")
            hs.append(name)
        nets = []
        for n in networks:
            try:
                nets.append(ipaddress.ip_network(n.strip(), strict=False))
            except ValueError:
                raise ConfigError(f"--push-network {n!r}: give a network as "
                                  "ADDRESS[/BITS], e.g. 127.0.0.0/8") from None
        if nets and not hs:
            raise ConfigError("--push-network allows addresses for the hosts --push-host "
                              "allows: give --push-host too")
        return cls(tuple(hs), tuple(nets))

    @property
    def enabled(self) -> bool:
        return bool(self.hosts)

    def _named(self, host: str) -> bool:
        for pat in self.hosts:
            if pat == "*" or pat == host or (pat.startswith("*.") and host.endswith(pat[1:])):
                return True
            a, b = _address(pat), _address(host)
            if a is not None and a == b:
                return True
        return False

    def allows(self, addr: Address) -> bool:
        """Whether a notification may be sent to ``addr``."""
        return public(addr) or any(addr in n for n in self.networks
                                   if n.version == addr.version)

    def refuse(self, url: str) -> str | None:
        """Why a webhook URL is not allowed (None: it is, as far as its name goes)."""
        if not self.enabled:
            return "this gateway sends no push notifications (it was given no --push-host)"
        try:
            u = urllib.parse.urlsplit(url)
            _ = u.port
        except ValueError as e:
            return f"the webhook URL {url!r} cannot be parsed: {e}"
        if u.scheme not in ("http", "https"):
            return f"the webhook URL {url!r} is not http:// or https://"
        host = (u.hostname or "").rstrip(".")
        if not host:
            return f"the webhook URL {url!r} names no host"
        if u.username is not None or u.password is not None:
            return "a webhook URL carries no credentials: give them in 'authentication'"
        if not self._named(host):
            return (f"push notifications to {host!r} are not allowed here (the gateway "
                    f"allows {', '.join(self.hosts)}; see --push-host)")
        literal = _address(host)
        if literal is not None and not self.allows(literal):
            return (f"{host} is not a public address: push notifications go to it only "
                    "if a --push-network holds it")
        return None

    async def addresses(self, url: str) -> list[str]:
        """The addresses a notification to ``url`` may be sent to, checked now: all of
        the host's, or PushRefused (one forbidden address refuses them all: a name that
        also resolves inward is not trusted)."""
        why = self.refuse(url)
        if why is not None:
            raise PushRefused(why)
        u = urllib.parse.urlsplit(url)
        host = (u.hostname or "").rstrip(".")
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise PushRefused(f"{host!r} does not resolve: {e}") from None
        out: list[str] = []
        for info in infos:
            text = str(info[4][0])
            addr = _address(text)
            if addr is None or not self.allows(addr):
                raise PushRefused(f"{host!r} resolves to {text}, not a public address (a "
                                  "--push-network holding it would allow it)")
            if text not in out:
                out.append(text)
        return out


def _target(url: str, addr: str) -> tuple[str, str, str]:
    """The URL with its host replaced by ``addr`` (so the connection goes where the
    check said), the Host header, and the TLS server name."""
    u = urllib.parse.urlsplit(url)
    host = (u.hostname or "").rstrip(".")
    port = u.port
    shown = f"[{addr}]" if ":" in addr else addr
    netloc = f"{shown}:{port}" if port else shown
    hosthdr = f"[{host}]" if ":" in host else host
    if port:
        hosthdr += f":{port}"
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path or "/", u.query, "")), \
        hosthdr, host


class Pusher:
    """Sends notifications under a policy: ``attempts`` tries a notification, waiting
    ``backoff * 2**n`` seconds between them, each at most ``timeout`` seconds."""

    def __init__(self, policy: PushPolicy, *, attempts: int = 4, backoff: float = 0.5,
                 timeout: float = 10.0) -> None:
        self.policy = policy
        self.attempts, self.backoff, self.timeout = attempts, backoff, timeout
        self._http: Any = None
        self.sent = 0
        self.failed = 0

    def _client(self) -> Any:
        if self._http is None:
            import httpx

            # No proxy from the environment, no redirects: the request goes exactly to
            # the address the policy checked.
            self._http = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False,
                                           trust_env=False)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def send(self, url: str, body: bytes, headers: dict[str, str]) -> bool:
        """POST ``body`` to ``url`` until it is taken (True) or the tries run out."""
        import httpx

        why = "no attempt"
        for n in range(self.attempts):
            if n:
                await asyncio.sleep(self.backoff * 2 ** (n - 1))
            try:
                addrs = await self.policy.addresses(url)
            except PushRefused as e:
                log.warning("push notification to %s not sent: %s", url, e)
                self.failed += 1
                return False
            for addr in addrs:  # each checked address in turn, as a resolver would
                target, host, sni = _target(url, addr)
                ext = {"sni_hostname": sni} if target.startswith("https:") else {}
                try:
                    r = await self._client().post(
                        target, content=body, extensions=ext,
                        headers={**headers, "Host": host, "Content-Type": "application/json"})
                except httpx.TransportError as e:
                    why = f"{type(e).__name__}: {e}"
                    continue
                if 200 <= r.status_code < 300:
                    self.sent += 1
                    return True
                why = f"HTTP {r.status_code}"
                if r.status_code not in RETRYABLE and r.status_code < 500:
                    log.warning("push notification to %s refused (%s): not sent again",
                                url, why)
                    self.failed += 1
                    return False
                break
        log.warning("push notification to %s not delivered after %d tries (%s)", url,
                    self.attempts, why)
        self.failed += 1
        return False


__all__ = ["PushPolicy", "PushRefused", "Pusher", "public"]
