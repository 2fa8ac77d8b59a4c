"""The node registry: who is connected, what they serve, and whether they are alive.

Sans-IO: a peer is keyed by its ROUTER identity (bytes); time is always passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from meshant.core.lifecycle import PEER, PeerEvent, PeerState, step
from meshant.core.nodes.heartbeat import HeartbeatMonitor

# Clients run no tasks, so nothing waits on their liveness: a silent one keeps its
# registration this many heartbeat timeouts (a direct client may sit idle between calls),
# though its name may be taken over after one timeout.
CLIENT_IDLE_FACTOR = 60

ACTIVE = PeerState.ACTIVE
DRAINING = PeerState.DRAINING
OFFLINE = PeerState.OFFLINE


@dataclass(slots=True, eq=False)
class Node:
    """One registered peer: a forager or a client."""

    name: str
    identity: bytes
    role: str
    codec: str
    slots: int = 0
    tools: frozenset[str] = frozenset()
    labels: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    version: int | str = 2
    features: frozenset[str] = frozenset()
    joined: float = 0.0
    last_seen: float = 0.0
    state: PeerState = ACTIVE  # changed by the registry only, by its table (PEER)
    # Slots taken: kept by the scheduler, which owns what runs where (the attempts).
    busy: int = 0
    # Assign ids this forager said (in its hello) it still runs or holds a result of,
    # which this queen did not give it (it restarted without them): the answers that
    # come for them are an old run's, never the answer to an assignment this queen
    # makes under the same id (a re-sent task's attempt 1 again). Cleared as each is
    # answered, or no longer listed in a heartbeat.
    stale: set[str] | None = None
    load: float | None = None
    timeout: float = 0.0
    session: str = ""
    key: bytes | None = None
    # What its hello said of each capability (description, payload and result schemas).
    describe: dict[str, dict[str, Any]] | None = None

    @property
    def free(self) -> int:
        return self.slots - self.busy if self.state == ACTIVE else 0

    def record(self, now: float) -> dict[str, Any]:
        """The registry record as shown by ``status`` and ``tool.reply``."""
        return {
            "name": self.name,
            "role": self.role,
            "state": self.state,
            "slots": self.slots,
            "in_flight": self.busy,
            "tools": sorted(self.tools),
            "labels": self.labels,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "codec": self.codec,
            "features": sorted(self.features),
            "last_seen_age": round(max(0.0, now - self.last_seen), 3),
            **({"describe": self.describe} if self.describe else {}),
        }


class Registry:
    """Peers by identity and by name, with a liveness deadline of ``interval * misses``."""

    def __init__(self, hb_interval: float = 1.0, hb_misses: int = 5, max_peers: int = 10_000):
        self.hb_interval = hb_interval
        self.hb_misses = hb_misses
        self.max_peers = max_peers
        self.by_id: dict[bytes, Node] = {}
        self.by_name: dict[str, Node] = {}
        # Names per tool, in the order they joined (a dict, not a set: the same colony
        # picks the same forager in every run, which the simulator's replays rely on).
        self.by_tool: dict[str, dict[str, None]] = {}
        self.gone: deque[dict[str, Any]] = deque(maxlen=64)
        self.monitor = HeartbeatMonitor(hb_interval, hb_misses)

    @property
    def timeout(self) -> float:
        return self.hb_interval * self.hb_misses

    def get(self, identity: bytes) -> Node | None:
        return self.by_id.get(identity)

    def name_taken(self, name: str, identity: bytes, now: float | None = None,
                   session: str = "") -> bool:
        """True when a live peer on another connection holds ``name``.

        A peer reconnecting on a fresh connection proves it is the holder with the session
        secret it gave in its first hello; it may then take its name over.
        """
        held = self.by_name.get(name)
        if held is None or held.identity == identity:
            return False
        if session and held.session == session:
            return False
        # A silent client's name may be taken over.
        return not (held.role == "client" and now is not None
                    and now - held.last_seen > self.timeout)

    def full(self) -> bool:
        return len(self.by_id) >= self.max_peers

    def add(self, node: Node, now: float) -> Node:
        """Register ``node``; a peer saying hello again on the same identity is replaced."""
        old = self.by_id.get(node.identity)
        if old is not None:
            self._unlink(old)
        node.joined = node.last_seen = now
        timeout = (self.timeout * CLIENT_IDLE_FACTOR if node.role == "client"
                   else node.timeout or None)
        self.monitor.add(node.identity, now, timeout)
        self.by_id[node.identity] = node
        self.by_name[node.name] = node
        for t in node.tools:
            self.by_tool.setdefault(t, {})[node.name] = None
        return node

    def touch(self, node: Node, now: float) -> None:
        """Any message from a peer is a sign of life."""
        node.last_seen = now
        self.monitor.beat(node.identity, now)

    def _unlink(self, node: Node) -> None:
        if self.by_id.get(node.identity) is node:
            del self.by_id[node.identity]
            self.monitor.remove(node.identity)
        if self.by_name.get(node.name) is node:
            del self.by_name[node.name]
        for t in node.tools:
            names = self.by_tool.get(t)
            if names is not None:
                names.pop(node.name, None)
                if not names:
                    del self.by_tool[t]

    def _move(self, node: Node, event: PeerEvent) -> None:
        node.state = step(PEER, node.state, event, "%s %r", node.role, node.name)

    def drain(self, node: Node) -> None:
        """The node drains: it finishes what it runs and is given nothing new."""
        self._move(node, PeerEvent.DRAIN)

    def remove(self, node: Node, now: float) -> None:
        if node.state is not OFFLINE:
            self._move(node, PeerEvent.LEAVE)
        self._unlink(node)
        self.gone.append(node.record(now))

    def expired(self, now: float) -> list[Node]:
        """Nodes not heard from within the liveness timeout; each is reported once."""
        dead = [self.by_id[i] for i in self.monitor.check(now) if i in self.by_id]
        for n in dead:
            self.remove(n, now)
        return dead

    def foragers(self) -> list[Node]:
        return [n for n in self.by_id.values() if n.role == "forager"]

    def serving(self, tool: str) -> list[Node]:
        return [self.by_name[n] for n in self.by_tool.get(tool, ())]
