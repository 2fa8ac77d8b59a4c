"""What every service of the queen core shares: its settings (:class:`QueenConfig`), the
request a message becomes (:class:`Request`), and :class:`QueenState` — the outbox, the
counters, the clocks' offset, and the helpers that address a peer. The services hold a
QueenState; none inherits from it. The core itself is :mod:`meshant.core.queen.router`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from meshant import protocol as p
from meshant.core.counters import Counters
from meshant.core.nodes.registry import Node, Registry
from meshant.core.queen.outbox import Outbox, Send
from meshant.core.rights import permits
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code
from meshant.protocol.message import inline_blobs

HELLO_RATE = 5.0  # hellos per second per connection: a reconnecting peer needs one
LEGACY_HB_INTERVAL = 10.0  # IACP 1.1 foragers beat every 10 s


class Grants(Protocol):
    """Which names and roles each CURVE key may take (``meshant.adapters.security.Authorized``)."""

    def check(self, key: bytes | None, name: str, role: str) -> str | None:
        """None if ``key`` may register ``name`` as ``role``, else why not."""

    def roles_of(self, key: bytes) -> tuple[str, ...]:
        """The roles ``key`` was granted (``admin`` among them for operators)."""


@dataclass(frozen=True, slots=True)
class QueenConfig:
    """Everything a queen is told, with its defaults: one object that the CLI builds and
    ``Queen(bind, pub, config=...)`` (or keyword arguments of the same names) takes."""

    name: str = "queen"
    colony: str = "default"
    assign_timeout: float = 300.0
    hb_interval: float = 1.0
    hb_misses: int = 5
    max_queue: int = 100_000
    max_message: int = 64 * 1024 * 1024
    max_peers: int = 10_000
    no_forager_wait: float = 30.0
    pub_hwm: int | None = None
    pub_buffer: int = 64 * 1024 * 1024
    max_broadcast: int = 128 * 1024
    mem_max_keys: int = 10_000
    mem_max_value: int = 64 * 1024
    peer_hwm: int = 100_000
    submit_rate: float = 10_000.0
    journal: str | None = None
    retention: float = 86_400.0
    retention_count: int = 100_000
    lease: float = 5.0
    durability: str = "process"
    journal_defer: float = 0.1
    max_graph_nodes: int = 10_000
    max_schedules: int = 100_000
    # Seconds a schedule's tick may be late and still fire: later, it was missed, and its
    # catch-up policy decides (core/schedules/model.py).
    schedule_grace: float = 10.0
    retry_base: float = 0.5
    retry_cap: float = 30.0
    breaker_threshold: int = 5
    breaker_cooldown: float = 30.0
    advertise: bool | None = None
    mdns_interfaces: tuple[str, ...] | None = None
    curve_secret: str | None = None
    authorized: str | None = None
    http: str | None = None
    http_token: str | None = None
    http_read_token: str | None = None
    http_allow_host: tuple[str, ...] = ()
    # Concurrency limits, CAPABILITY[:labels.NAME|:payload.FIELD]=N (core/tasks/limits.py),
    # and rate limits, ...=N/UNIT[,burst=B][,cost] (core/tasks/rates.py).
    limits: tuple[str, ...] = ()

    @property
    def derived_pub_hwm(self) -> int:
        """libzmq bounds a pipe in messages: a subscriber's queue holds at most this many,
        each at most ``max_broadcast`` bytes, so one slow subscriber costs the queen at
        most ``pub_buffer`` bytes."""
        if self.pub_hwm is not None:
            return self.pub_hwm
        return max(64, self.pub_buffer // self.max_broadcast)


@dataclass(slots=True)
class _Info:
    """What the driver knows and status reports: set once bound."""

    endpoint: str = ""
    pub: str = ""
    pid: int = 0
    host: str = ""
    advertised: bool = False
    started: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)




@dataclass(slots=True)
class Arrival:
    """A message from a connection that has not said hello (``node`` is None), or a
    hello from one that has: what the admission handlers take."""

    identity: bytes
    node: Node | None
    msg: p.Message
    codec: str
    key: bytes | None  # the CURVE key the connection authenticated with
    now: float


@dataclass(slots=True)
class Request:
    """A message from a registered peer: what every other handler takes. ``fetched``
    holds the journal's answers to the reads it needed (see ``core/journal/archive.py``): a
    request that needs one is parked and handled again once the answer is in."""

    identity: bytes
    node: Node
    msg: p.Message
    codec: str
    key: bytes | None
    now: float
    fetched: dict[tuple[str, str], Any] | None = None


Incoming = Arrival | Request


class RateBuckets:
    """Token buckets per key: ``rate`` per second, bursts of up to a second's worth.
    Bounded: past ``4 * max_peers`` keys they all start afresh."""

    __slots__ = ("_b", "max_keys")

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._b: dict[bytes, list[float]] = {}

    def wait(self, key: bytes, now: float, rate: float, cost: float = 1.0) -> float:
        """0.0 when allowed (and the cost taken); else how long until it would be (the
        ``retry_after`` to send)."""
        burst = max(10.0, rate, cost)
        b = self._b.get(key)
        if b is None:
            if len(self._b) > self.max_keys:
                self._b.clear()  # bounded, whatever connects and goes
            b = self._b[key] = [burst, now]
        tokens = min(burst, b[0] + (now - b[1]) * rate)
        b[1] = now
        if tokens < cost:
            b[0] = tokens
            return max(0.001, (cost - tokens) / rate)
        b[0] = tokens - cost
        return 0.0


class QueenState:
    """The queen core's shared parts: settings, identity, outbox, counters, and how to
    address a peer. ``now`` is the time of the event being handled (the driver's)."""

    def __init__(self, config: QueenConfig, registry: Registry, *, epoch: str,
                 wall_offset: float, authorized: Grants | None, now: float) -> None:
        c = self.config = config
        self.name = c.name
        self.epoch = epoch
        self.wall_offset = wall_offset
        self.registry = registry
        self.authorized = authorized
        self.out = Outbox()
        self.now = now
        self.terms = p.QueenTerms(epoch=epoch, hb_interval=c.hb_interval,
                                  hb_misses=c.hb_misses, assign_timeout=c.assign_timeout,
                                  queen=c.name, max_message=c.max_message,
                                  max_broadcast=c.max_broadcast)
        # The colony's counters, one namespace: the scheduler and the graph book declare
        # theirs in it too (core/counters.py), so no two parts share a name.
        self.counters = Counters()
        self.counters.declare("queen", "protocol_errors", "messages", "dropped_sends",
                              "broadcasts", "ctl_drain", "ctl_halt", "refused_keys",
                              "rate_limited", "idempotent_hits", "resubmitted",
                              "unregistered", "forbidden", "internal_errors")
        self.rates = RateBuckets(4 * registry.max_peers)
        self.info = _Info()
        # A standby (another queen leads the shared journal): every message gets
        # ``not-leader`` with these fields (the leader's endpoint when known, the term).
        self.standby: dict[str, Any] | None = None
        self.term = 0  # the leadership term this core serves (0: no shared journal)

    def wall(self, now: float) -> float:
        return now + self.wall_offset

    # -- addressing peers -----------------------------------------------------------------

    def _finish(self, identity: bytes, codec: str, msg: p.Message) -> Send:
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = self.now + self.wall_offset
        if codec == BINARY and msg.body:
            node = self.registry.by_id.get(identity)
            if node is not None and "blobs" not in node.features:
                msg.body = inline_blobs(msg.body)  # a feature not negotiated is not used
        return Send(identity, codec, msg)

    def send_to(self, identity: bytes, codec: str, msg: p.Message) -> None:
        """Send now (in this turn's order, before its journal record)."""
        self.out.actions.append(self._finish(identity, codec, msg))

    def send(self, node: Node, msg: p.Message) -> None:
        if not msg.to:
            msg.to = node.name
        self.send_to(node.identity, node.codec, msg)

    def later(self, node: Node, msg: p.Message) -> None:
        """Send after this turn's journal record and results: for what promises
        durability (an acknowledgement, a result sent again) or follows a result."""
        if not msg.to:
            msg.to = node.name
        self.out.after.append(self._finish(node.identity, node.codec, msg))

    def later_to(self, identity: bytes, msg: p.Message) -> None:
        """:meth:`later`, to a connection in the binary codec (a graph's client)."""
        self.out.after.append(self._finish(identity, BINARY, msg))

    def error_to(self, identity: bytes, codec: str, code: str, message: str,
                 ref: str | None, **extra: Any) -> None:
        self.send_to(identity, codec, p.Message("error", {"code": code, "message": message,
                                                          **extra}, ref=ref))

    def refuse(self, req: Incoming, code: str, message: str, **extra: Any) -> None:
        """Answer ``req`` with an ``error`` naming what was wrong (it changes nothing)."""
        self.error_to(req.identity, req.codec, code, message, req.msg.id, **extra)

    # -- rights ---------------------------------------------------------------------------

    def forbidden(self, req: Request, operation: str, owner: bool = False) -> bool:
        """True (and ``forbidden`` sent) when the peer's key may not do ``operation``."""
        node = req.node
        roles = None
        if self.authorized is not None and node.key is not None:
            roles = frozenset(self.authorized.roles_of(node.key))
        if permits(operation, roles, owner):
            return False
        self.counters["forbidden"] += 1
        who = "an admin key" + (" or the submitter" if operation.startswith(("task.", "graph."))
                                else "")
        self.refuse(req, Code.FORBIDDEN, f"{operation} is allowed to {who} only; "
                    f"{node.name!r} is not (meshant keys generate ... --role admin)",
                    operation=operation)
        return True

    def not_negotiated(self, req: Request, feature: str) -> bool:
        """A feature not negotiated is not used (spec §5): refuse its messages."""
        if feature in req.node.features:
            return False
        self.counters["protocol_errors"] += 1
        self.refuse(req, Code.UNSUPPORTED, f"this peer did not negotiate {feature!r} in "
                    f"its hello: no {req.msg.kind} messages")
        return True


__all__ = ["HELLO_RATE", "LEGACY_HB_INTERVAL", "Arrival", "Grants", "Incoming",
           "QueenConfig", "QueenState", "RateBuckets", "Request"]
