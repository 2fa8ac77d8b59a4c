"""The queen core's shared state, settings, action types and output helpers. The core
itself, and how a driver uses it, is :mod:`meshant.core.queen`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshant import protocol as p
from meshant.core.graph_book import GraphBook
from meshant.core.journal_defer import Deferral
from meshant.core.memory import DELETED, MemoryStore
from meshant.core.policy import Backoff
from meshant.core.registry import Node, Registry
from meshant.core.scheduler import Scheduler, Task
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code
from meshant.protocol.message import inline_blobs
from meshant.protocol.topics import MEM_TOPIC

log = logging.getLogger("meshant.queen")

# Error codes the queen answers with (besides the protocol's own).
NOT_REGISTERED = Code.NOT_REGISTERED
NAME_TAKEN = Code.NAME_TAKEN
NOT_ALLOWED = Code.NOT_ALLOWED
RATE_LIMITED = Code.RATE_LIMITED
HELLO_RATE = 5.0  # hellos per second per connection: a reconnecting peer needs one
QUEUE_FULL = Code.QUEUE_FULL
DUPLICATE_TASK = Code.DUPLICATE_TASK
UNKNOWN_RECIPIENT = Code.UNKNOWN_RECIPIENT
UNKNOWN_TASK = Code.UNKNOWN_TASK
NOT_YOURS = Code.NOT_YOURS
BAD_FROM = Code.BAD_FROM
WRONG_ROLE = Code.WRONG_ROLE
TOO_MANY_PEERS = Code.TOO_MANY_PEERS
UNSUPPORTED = Code.UNSUPPORTED
BAD_TOPIC = Code.BAD_TOPIC

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

    @property
    def derived_pub_hwm(self) -> int:
        """libzmq bounds a pipe in messages: a subscriber's queue holds at most this many,
        each at most ``max_broadcast`` bytes, so one slow subscriber costs the queen at
        most ``pub_buffer`` bytes."""
        if self.pub_hwm is not None:
            return self.pub_hwm
        return max(64, self.pub_buffer // self.max_broadcast)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` to the peer on ``identity``, in ``codec``."""

    identity: bytes
    codec: str
    msg: p.Message


@dataclass(frozen=True, slots=True)
class Publish:
    """Send ``frames`` on the PUB socket under ``topic``."""

    topic: bytes
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class Record:
    """Journal these tasks' changes, durably, before any later action leaves."""

    tasks: list[Task]


@dataclass(frozen=True, slots=True)
class RecordMemory:
    """Journal colony memory changes, ``(key, value, expires_wall, seq)`` (a value of
    ``meshant.storage.records.DELETED`` deletes), before any later action leaves."""

    changes: list[tuple[str, Any, float | None, int]]


@dataclass(frozen=True, slots=True)
class Remember:
    """Journal conversation state (``meshant.storage.conversation``) before any later
    action leaves: question rows (upserted), task updates, inbox messages kept, and
    inbox messages forgotten (``unkept``, delivered or expired or purged, for ``to``)."""

    questions: list[dict[str, Any]] = field(default_factory=list)
    updates: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    unkept: list[str] = field(default_factory=list)
    to: str = ""


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """Journal these graphs' and graph nodes' changes (after the turn's ``Record``, before
    any later action leaves): ``meshant.storage.graphs.record``."""

    graphs: list[Any]
    nodes: list[Any]


Action = Send | Publish | Record | RecordMemory | Remember | GraphRecord

Handler = Callable[[bytes, "Node | None", p.Message, str, float], None]


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


class QueenState:
    """What every part of the queen core shares: the registry, the scheduler, the memory,
    the counters, and the actions decided so far (``out``)."""

    def __init__(self, config: QueenConfig, *, epoch: str, wall_offset: float = 0.0,
                 authorized: Grants | None = None, archive: Any = None,
                 restore: Iterable[dict[str, Any]] = (),
                 memory: Iterable[tuple[str, Any, float | None, int]] = (),
                 now: float = 0.0) -> None:
        c = self.config = config
        self.name = c.name
        self.epoch = epoch
        self.wall_offset = wall_offset
        self.registry = Registry(c.hb_interval, c.hb_misses, c.max_peers)
        self.scheduler = Scheduler(self.registry, assign_timeout=c.assign_timeout,
                                   max_queue=c.max_queue, default_wait=c.no_forager_wait,
                                   backoff=Backoff(c.retry_base, c.retry_cap),
                                   breaker_threshold=c.breaker_threshold,
                                   breaker_cooldown=c.breaker_cooldown)
        self.terms = p.QueenTerms(epoch=epoch, hb_interval=c.hb_interval,
                                  hb_misses=c.hb_misses, assign_timeout=c.assign_timeout,
                                  queen=c.name, max_message=c.max_message,
                                  max_broadcast=c.max_broadcast)
        self.memory = MemoryStore(c.mem_max_keys, c.mem_max_value)
        self._archived = archive is not None
        if self._archived:
            self.memory.restore(memory, now, now + wall_offset)
        self.graphs = GraphBook(self.scheduler, c.max_graph_nodes, c.max_message)  # graphs
        self.authorized = authorized
        self.counters: dict[str, int] = {"protocol_errors": 0, "messages": 0, "dropped_sends": 0,
                                         "broadcasts": 0, "ctl_drain": 0, "ctl_halt": 0,
                                         "refused_keys": 0, "rate_limited": 0,
                                         "idempotent_hits": 0, "resubmitted": 0,
                                         "unregistered": 0, "forbidden": 0}
        self.info = _Info()
        # A standby (another queen leads the shared journal): every message gets
        # ``not-leader`` with these fields (the leader's endpoint when known, the term).
        self.standby: dict[str, Any] | None = None
        self.term = 0  # the leadership term this core serves (0: no shared journal)
        self.restored = 0
        # Tasks submitted with a W3C traceparent (envelope extension): forwarded on their
        # assignments, forgotten when they finish.
        self.traces: dict[str, str] = {}
        if archive is not None:
            # Final tasks stay in the archive (the journal): looked up when asked for.
            self.scheduler.track_changes = True
            self.scheduler.archive = archive
            self.restored = self.scheduler.restore(list(restore), now, now + wall_offset,
                                                   grace=self.registry.timeout * 2)
            self.graphs.track_changes = True  # graphs: journaled, and carried on
            self.graphs.restore(archive.unfinished_graphs(), now)
        # Tasks whose first journal write may wait for their end (core/journal_defer.py).
        self.deferral = Deferral(c.journal_defer)
        self.out: list[Action] = []
        self._mem_record: RecordMemory | None = None
        self._later: list[tuple[Node, p.Message]] = []
        self._key: bytes | None = None
        self._now = now
        self._buckets: dict[bytes, list[float]] = {}

    # -- driving ----------------------------------------------------------------------------

    def _wall(self, now: float) -> float:
        return now + self.wall_offset

    def _allow(self, key: bytes, now: float, rate: float, cost: float = 1.0) -> float:
        """Token bucket per peer: ``rate`` per second, bursts of up to a second's worth.
        0.0 when allowed; else how long until it would be (the ``retry_after`` to send)."""
        burst = max(10.0, rate, cost)
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) > 4 * self.registry.max_peers:
                self._buckets.clear()  # bounded, whatever connects and goes
            b = self._buckets[key] = [burst, now]
        tokens = min(burst, b[0] + (now - b[1]) * rate)
        b[1] = now
        if tokens < cost:
            b[0] = tokens
            return max(0.001, (cost - tokens) / rate)
        b[0] = tokens - cost
        return 0.0

    def _publish_mem(self, update: dict[str, Any]) -> None:
        if self._archived:
            # Durable before anyone hears of it (the journal keeps the memory across a
            # restart or a failover).
            key = update["key"]
            change: tuple[str, Any, float | None, int]
            if update.get("deleted"):
                change = (key, DELETED, None, update["seq"])
            else:
                exp = self.memory.expires.get(key)
                change = (key, update.get("value"),
                          None if exp is None else exp + self.wall_offset, update["seq"])
            # One record a turn, however many keys change (a thousand keys expiring at
            # once are one transaction): it stands before the first change's publication,
            # so before every later one too.
            rec = self._mem_record
            if rec is None:
                rec = self._mem_record = RecordMemory([])
                self.out.append(rec)
            rec.changes.append(change)
        msg = p.Message("mem.sync", update, frm=self.name, ts=self._wall(self._now))
        self.out.append(Publish(MEM_TOPIC, p.binary.encode(msg)))

    def status(self, now: float) -> dict[str, Any]:
        """Registry, queue depths and counters (the core composes it)."""
        raise NotImplementedError

    def _send(self, node: Node, msg: p.Message) -> None:
        if not msg.frm:
            msg.frm = self.name
        if not msg.to:
            msg.to = node.name
        self._send_to(node.identity, node.codec, msg)

    def _send_to(self, identity: bytes, codec: str, msg: p.Message) -> None:
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = self._wall(self._now)
        if codec == BINARY and msg.body:
            node = self.registry.by_id.get(identity)
            if node is not None and "blobs" not in node.features:
                msg.body = inline_blobs(msg.body)  # a feature not negotiated is not used
        self.out.append(Send(identity, codec, msg))

    def _error_to(self, identity: bytes, codec: str, code: str, message: str,
                  ref: str | None, **extra: Any) -> None:
        self._send_to(identity, codec, p.Message("error", {"code": code, "message": message,
                                                           **extra}, ref=ref))

