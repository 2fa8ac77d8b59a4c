"""Zeroconf discovery: the queen advertises itself over mDNS; foragers and clients find it.

python-zeroconf runs on its own threads; nothing here blocks an I/O loop. The queen's
TXT record carries what a joiner needs (ROUTER and PUB endpoints, protocol versions,
colony, epoch, queen name). Several colonies share a network without mixing: a joiner
asks for its colony by name. Which of one colony's records a joiner follows is decided
by :func:`choose` without comparing anyone's clock.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zeroconf import (
    IPVersion,
    ServiceBrowser,
    ServiceInfo,
    ServiceListener,
    ServiceStateChange,
    Zeroconf,
)

from meshant.errors import ConfigError, MeshantError, QueenUnreachable
from meshant.protocol.binary import SUPPORTED_VERSIONS
from meshant.protocol.codes import Code

log = logging.getLogger("meshant.discovery")

SERVICE_TYPE = "_meshant._tcp.local."
DEFAULT_COLONY = "default"
SETTLE = 1.5  # seconds a joiner with no colony keeps listening after the first queen


@dataclass(frozen=True)
class QueenRecord:
    """A queen as seen through mDNS."""

    instance: str
    colony: str
    name: str
    router: str
    pub: str
    versions: tuple[int, ...]
    epoch: str
    host: str
    started: float = 0.0  # the queen's wall clock at start: shown, never compared
    curve: str = ""
    # With a shared PostgreSQL journal: "leader" or "standby", and the leadership term
    # (a queen on its own is a leader of term 0).
    role: str = "leader"
    term: int = 0
    # The order in which this joiner first heard of the record (its Browser counts them):
    # local, not advertised, not part of the record's identity.
    heard: int = field(default=0, compare=False)

    def as_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "versions": list(self.versions)}
        del d["heard"]
        return d


def _label(epoch: str) -> str:
    """Eight characters of the epoch fit for a DNS label (its random end: a queen on a
    shared journal starts its epoch with the term)."""
    return "".join(c for c in epoch if c.isalnum())[-8:]


def reachable(endpoint: str) -> str:
    """A bound endpoint as other hosts reach it: a wildcard host (``*``, ``0.0.0.0``)
    becomes this host's address."""
    if endpoint.startswith("tcp://") and _endpoint_host(endpoint) in ("*", "0.0.0.0", ""):
        host = socket.gethostbyname(socket.gethostname())
        return endpoint.replace("//*:", f"//{host}:").replace("//0.0.0.0:", f"//{host}:")
    return endpoint


def _endpoint_host(endpoint: str) -> str:
    rest = endpoint.partition("://")[2]
    return rest.rpartition(":")[0].strip("[]")


def _endpoint_port(endpoint: str) -> int:
    try:
        return int(endpoint.rpartition(":")[2])
    except ValueError:
        return 0


def advertise_interfaces(bind_endpoint: str) -> list[str]:
    """Where to speak mDNS for a queen bound there: its own interface; loopback for
    loopback; every IPv4 interface only for an explicit wildcard bind."""
    if not bind_endpoint.startswith("tcp://"):
        raise ValueError(f"cannot advertise {bind_endpoint}: only tcp:// endpoints")
    host = _endpoint_host(bind_endpoint)
    if host in ("*", "0.0.0.0"):
        return []  # all interfaces
    return [host]


def is_loopback(endpoint: str) -> bool:
    host = _endpoint_host(endpoint)
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_interfaces() -> list[str] | None:
    """``MESHANT_MDNS_INTERFACES=ip,ip``: where joiners browse (default: every interface)."""
    import os

    v = os.environ.get("MESHANT_MDNS_INTERFACES", "").strip()
    return [x.strip() for x in v.split(",") if x.strip()] or None


def _zeroconf(interfaces: list[str] | None) -> Zeroconf:
    if interfaces:
        return Zeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
    return Zeroconf(ip_version=IPVersion.V4Only)


class Advertiser:
    """Registers the queen's service; unregisters it on :meth:`close` (a crash is expired
    by the records' TTL)."""

    def __init__(self, *, colony: str, name: str, router: str, pub: str, epoch: str,
                 interfaces: list[str] | None = None, curve_key: str = "",
                 role: str = "leader", term: int = 0) -> None:
        self.colony = colony
        router, pub = reachable(router), reachable(pub)
        host = _endpoint_host(router)
        self.instance = f"{colony}-{name}-{_label(epoch)}.{SERVICE_TYPE}"
        props = {"router": router, "pub": pub, "colony": colony, "name": name,
                 "epoch": epoch, "versions": ",".join(map(str, SUPPORTED_VERSIONS)),
                 "started": f"{time.time():.3f}", "role": role, "term": str(term)}
        if curve_key:
            props["curve"] = curve_key
        self._props = props
        self._addresses: list[bytes] = []
        try:
            self._addresses = [socket.inet_aton(host)]
        except OSError:
            pass
        self._port = _endpoint_port(router)
        self._server = f"meshant-{_label(epoch)}.local."
        self.info = self._info()
        self._zc = _zeroconf(interfaces if interfaces is not None else [host])
        self._zc.register_service(self.info, allow_name_change=True)
        self.instance = self.info.name
        log.info("advertising %s on mDNS", self.instance)

    def _info(self) -> ServiceInfo:
        return ServiceInfo(SERVICE_TYPE, self.instance, addresses=self._addresses,
                           port=self._port, properties=dict(self._props),
                           server=self._server)

    def update(self, *, epoch: str, role: str, term: int) -> None:
        """A takeover or a step-down: tell joiners the queen's new role and term."""
        self._props.update(epoch=epoch, role=role, term=str(term))
        self.info = self._info()
        self._zc.update_service(self.info)

    def close(self) -> None:
        try:
            self._zc.unregister_service(self.info)
        finally:
            self._zc.close()


def _record(info: ServiceInfo) -> QueenRecord | None:
    props = {k.decode(): (v or b"").decode() for k, v in (info.properties or {}).items()}
    if not props.get("router"):
        return None
    try:
        versions = tuple(int(v) for v in props.get("versions", "").split(",") if v)
    except ValueError:
        versions = ()
    return QueenRecord(instance=info.name, colony=props.get("colony", DEFAULT_COLONY),
                       name=props.get("name", ""), router=props["router"],
                       pub=props.get("pub", ""), versions=versions,
                       epoch=props.get("epoch", ""), host=info.server or "",
                       started=_float(props.get("started")), curve=props.get("curve", ""),
                       role=props.get("role", "leader") or "leader",
                       term=int(_float(props.get("term"))))


def _float(v: str | None) -> float:
    try:
        return float(v or 0)
    except ValueError:
        return 0.0


class Browser(ServiceListener):
    """Keeps the set of queens currently advertised, from zeroconf's own threads."""

    def __init__(self, interfaces: list[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queens: dict[str, QueenRecord] = {}
        self._heard = itertools.count(1)
        self._zc = _zeroconf(interfaces)
        self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_change])

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str,
                   state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            with self._changed:
                self._queens.pop(name, None)
                self._changed.notify_all()
            return
        info = zeroconf.get_service_info(service_type, name, timeout=2000)
        rec = _record(info) if info is not None else None
        with self._changed:
            if rec is not None:
                old = self._queens.get(name)
                # An updated record keeps its place; a new (or returning) one goes last.
                heard = old.heard if old is not None else next(self._heard)
                self._queens[name] = replace(rec, heard=heard)
            self._changed.notify_all()

    # ServiceListener protocol (unused: the handler above sees every change)
    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None: ...
    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None: ...
    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None: ...

    def queens(self, colony: str | None = None) -> list[QueenRecord]:
        with self._lock:
            found = list(self._queens.values())
        return sorted((q for q in found if colony is None or q.colony == colony),
                      key=lambda q: q.instance)

    def wait(self, colony: str | None, timeout: float) -> list[QueenRecord]:
        """Queens of ``colony`` seen within ``timeout`` (returns as soon as there is one)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [q for q in self._queens.values()
                         if colony is None or q.colony == colony]
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return sorted(found, key=lambda q: q.instance)
                self._changed.wait(left)

    def close(self) -> None:
        self._browser.cancel()
        self._zc.close()


def discover(timeout: float = 3.0, colony: str | None = None,
             interfaces: list[str] | None = None) -> list[QueenRecord]:
    """Every queen seen within ``timeout`` seconds (of ``colony``, if given)."""
    b = Browser(interfaces)
    try:
        time.sleep(timeout)
        return b.queens(colony)
    finally:
        b.close()


def choose(queens: list[QueenRecord], colony: str | None) -> QueenRecord:
    """The one queen to join, or a clear error.

    Several records of one colony are normally a restarted queen's and its crashed
    predecessor's, which lingers in a joiner's cache until its TTL runs out. The record
    this joiner heard of last wins (``QueenRecord.heard``, counted by its own
    :class:`Browser`): a restarted queen is always heard after the predecessor it
    replaces, by every joiner that knew that predecessor, and a joiner that starts later
    never hears the dead one (a crashed responder answers no queries). No clock is
    compared: the ``started`` time in the TXT record is one remote host's wall clock,
    shown by ``meshant discover`` only. Two live queens advertising one colony are a
    misconfiguration: each joiner then takes the one it heard last (``meshant discover``
    lists both), and the instance name breaks a tie, so the choice is deterministic but
    advisory. Queens sharing a PostgreSQL journal advertise their role and term: a leader
    goes before a standby, and of two leaders (a deposed one not yet stepped down) the
    higher term wins — a number the database hands out, never a clock.
    """
    if colony is not None:
        queens = [q for q in queens if q.colony == colony]
    if not queens:
        where = f" of colony {colony!r}" if colony else ""
        raise QueenUnreachable(f"no queen{where} found by mDNS discovery: is one running "
                               "with --advertise on this network? (or give --queen)")
    colonies = {q.colony for q in queens}
    if colony is None and len(colonies) > 1:
        listing = ", ".join(f"{q.colony} ({q.router})" for q in queens)
        raise ConfigError(f"several colonies found: {listing}; choose one with --colony",
                           code=Code.AMBIGUOUS)
    return max(queens, key=lambda q: (q.role == "leader", q.term, q.heard, q.instance))


class Follower:
    """A joiner's view of its colony's queen, kept current on zeroconf's threads so an
    I/O loop can read it without waiting."""

    def __init__(self, colony: str | None, interfaces: list[str] | None = None) -> None:
        self.colony = colony
        self._browser = Browser(interfaces)

    def first(self, timeout: float) -> QueenRecord:
        found = self._browser.wait(self.colony, timeout)
        if found and self.colony is None:
            # No colony named: listen a little longer, so that several colonies on the
            # network are seen (and refused as ambiguous) rather than one picked by chance.
            time.sleep(SETTLE)
            found = self._browser.queens(None)
        return choose(found, self.colony)

    def current(self) -> QueenRecord | None:
        try:
            return choose(self._browser.queens(self.colony), self.colony)
        except MeshantError:
            return None

    def close(self) -> None:
        self._browser.close()
