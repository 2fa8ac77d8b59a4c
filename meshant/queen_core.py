"""The queen's logic, sans-IO: peers' messages in, what to do out.

``QueenCore`` owns the registry, the scheduler and the colony memory. A driver (the
:class:`~meshant.queen.Queen` actor, or a test) feeds it what arrives —
``receive(identity, frames, key, now)`` — and the passing of time — ``tick(now)``,
``beat(now)`` — and closes each loop turn with ``end_turn(now)``; then it takes the
actions to carry out, in order, with ``take()``:

* :class:`Send` — a message for one peer (the driver encodes and sends it);
* :class:`Publish` — frames for the PUB socket under a topic;
* :class:`Record` — tasks whose changes the journal must make durable *before* any later
  action of the same turn leaves.

It reads no clock (``now`` is the driver's monotonic time; wall-clock stamps are ``now``
plus the ``wall_offset`` the driver gives) and touches no socket, so whole colony
scenarios run in memory (``tests/colony_sim.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import protocol as p
from .memory import MemoryError_, MemoryStore
from .policy import Backoff
from .protocol.codec import BINARY, JSON
from .protocol.topics import HB_TOPIC, MEM_TOPIC, TOPIC_MAX, USER_PREFIX, valid_topic
from .registry import ACTIVE, DRAINING, Node, Registry
from .scheduler import DuplicateTask, QueueFull, Scheduler, Task
from .security import Authorized

log = logging.getLogger("meshant.queen")

# Error codes the queen answers with (besides the protocol's own).
NOT_REGISTERED = "not-registered"
NAME_TAKEN = "name-taken"
NOT_ALLOWED = "not-allowed"
RATE_LIMITED = "rate-limited"
HELLO_RATE = 5.0  # hellos per second per connection: a reconnecting peer needs one
QUEUE_FULL = "queue-full"
DUPLICATE_TASK = "duplicate-task"
UNKNOWN_RECIPIENT = "unknown-recipient"
UNKNOWN_TASK = "unknown-task"
NOT_YOURS = "not-yours"
BAD_FROM = "bad-from"
WRONG_ROLE = "wrong-role"
TOO_MANY_PEERS = "too-many-peers"
UNSUPPORTED = "unsupported"
BAD_TOPIC = "bad-topic"

LEGACY_HB_INTERVAL = 10.0  # IACP 1.1 foragers beat every 10 s


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
    retry_base: float = 0.5
    retry_cap: float = 30.0
    breaker_threshold: int = 5
    breaker_cooldown: float = 30.0
    advertise: bool | None = None
    mdns_interfaces: tuple[str, ...] | None = None
    curve_secret: str | None = None
    authorized: str | None = None

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


Action = Send | Publish | Record

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


class QueenCore:
    """The queen's decisions, driven by method calls and a clock argument."""

    def __init__(self, config: QueenConfig, *, epoch: str, wall_offset: float = 0.0,
                 authorized: Authorized | None = None, archive: Any = None,
                 restore: Iterable[dict[str, Any]] = (), now: float = 0.0) -> None:
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
                                  queen=c.name, max_message=c.max_message)
        self.memory = MemoryStore(c.mem_max_keys, c.mem_max_value)
        self.authorized = authorized
        self.counters: dict[str, int] = {"protocol_errors": 0, "messages": 0, "dropped_sends": 0,
                                         "broadcasts": 0, "ctl_drain": 0, "ctl_halt": 0,
                                         "refused_keys": 0, "rate_limited": 0,
                                         "idempotent_hits": 0, "resubmitted": 0}
        self.info = _Info()
        self.restored = 0
        if archive is not None:
            # Final tasks stay in the archive (the journal): looked up when asked for.
            self.scheduler.track_changes = True
            self.scheduler.archive = archive
            self.restored = self.scheduler.restore(list(restore), now, now + wall_offset,
                                                   grace=self.registry.timeout * 2)
        self.out: list[Action] = []
        self._later: list[tuple[Node, p.Message]] = []
        self._key: bytes | None = None
        self._now = now
        self._buckets: dict[bytes, list[float]] = {}
        self._handlers: dict[str, Handler] = {
            "hello": self._on_hello,
            "hb": self._on_hb,
            "task.submit": self._on_submit,
            "task.accept": self._on_accept,
            "task.reject": self._on_reject,
            "task.progress": self._on_progress,
            "task.result": self._on_result,
            "task.batch": self._on_batch,
            "task.cancel": self._on_cancel,
            "task.status": self._on_task_status,
            "status.query": self._on_status,
            "tool.query": self._on_tool_query,
            "msg": self._on_directed,
            "note": self._on_directed,
            "mem.sync": self._on_memory,
            "broadcast": self._on_broadcast,
            "dlq": self._on_dlq,
            "ctl.drain": self._on_control,
            "ctl.halt": self._on_control,
        }

    # -- driving ----------------------------------------------------------------------------

    def take(self) -> list[Action]:
        """The actions decided since the last call, in the order to carry them out."""
        out, self.out = self.out, []
        return out

    def receive(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        """One message from the ROUTER: ``frames[0]`` is the peer's identity; ``key`` the
        CURVE key its connection authenticated with (or None)."""
        self._now = now
        self._handle(frames, key, now)

    def tick(self, now: float) -> None:
        """Liveness, leases, deadlines, retries and memory expiry (every few ms)."""
        self._now = now
        sched = self.scheduler
        for node in self.registry.expired(now):
            if node.role == "forager":
                sched.forager_lost(node, now, "forager went silent")
        sched.tick(now)
        for update in self.memory.expire(now):
            self._publish_mem(update)

    def end_turn(self, now: float) -> None:
        """Close a loop turn: assign what can be, journal what changed, then what to send."""
        self._now = now
        sched = self.scheduler
        if sched.dirty:
            sched.dispatch(now)
        if sched.changed:
            # Durable before anything about it leaves: one record per turn.
            self.out.append(Record(list(sched.changed.values())))
            sched.changed.clear()
        if sched.out:
            self._flush()
        if self._later:
            later, self._later = self._later, []
            for node, msg in later:
                self._send(node, msg)

    def revoke(self, grants: Iterable[bytes], now: float) -> int:
        """Authorized keys changed: drop the live peers whose key is no longer granted."""
        self._now = now
        allowed = set(grants)
        dropped = 0
        for node in list(self.registry.by_id.values()):
            if node.key is not None and node.key not in allowed:
                self.registry.remove(node, now)
                if node.role == "forager":
                    self.scheduler.forager_lost(node, now, "key revoked")
                dropped += 1
        return dropped

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

    def _oversized_result(self, identity: bytes, frames: list[bytes], now: float) -> None:
        """A forager's result over the limit (libzmq let it through, just): the task
        fails at once with too-large, rather than wait out its lease and run again."""
        node = self.registry.by_id.get(identity)
        if node is None or node.role != "forager":
            return
        try:
            msg = p.binary.decode(frames, max_frame=self.config.max_message + 65536)
        except p.ProtocolError:
            return
        size = max(len(f) for f in frames)
        if msg.kind == "task.result" and not msg.b.get("partial"):
            refs = [msg.ref]
        elif msg.kind == "task.batch":
            refs = [i.get("ref") for i in msg.b["results"] if isinstance(i, dict)]
        else:
            return
        for ref in refs:
            verdict, att = self.scheduler.lookup(node, ref if isinstance(ref, str) else None)
            if verdict == "ok" and att is not None:
                self.scheduler.too_large(att, f"the result from {node.name} is {size:,} bytes, "
                                         f"over the queen's limit of {self.config.max_message:,} "
                                         "(--max-message)", now)

    def _on_hello(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                  now: float) -> None:
        if self._allow(b"hello:" + identity, now, HELLO_RATE):
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED,
                           f"more than {HELLO_RATE:g} hellos per second from this connection",
                           msg.id, retry_after=1.0)
            return
        body = msg.b
        fallback = f"{body.get('role', 'peer')}-{identity.hex()[:8]}"
        decision = p.negotiate(body, self.terms, fallback)
        if isinstance(decision, p.Refusal):
            self._error_to(identity, codec, decision.code, decision.reason, msg.id)
            return
        if self.authorized is not None:
            why = self.authorized.check(self._key, decision.name, decision.role)
            if why is not None:
                self.counters["refused_keys"] += 1
                self._error_to(identity, codec, NOT_ALLOWED, why, msg.id)
                return
        session = str(body.get("session", ""))
        if self.registry.name_taken(decision.name, identity, now, session):
            self.counters["protocol_errors"] += 1
            held = self.registry.by_name[decision.name]
            # When the holder stops beating it is declared offline and the name is free:
            # a restarted peer may wait that long instead of giving up.
            left = max(0.0, held.last_seen + (held.timeout or self.registry.timeout) - now)
            self._error_to(identity, codec, NAME_TAKEN,
                           f"the name {decision.name!r} is held by a live peer; choose another",
                           msg.id, retry_after=round(left + 0.05, 3))
            return
        if node is None and self.registry.full():
            self._error_to(identity, codec, TOO_MANY_PEERS, "the queen has no room for more "
                           "peers", msg.id)
            return
        new = Node(name=decision.name, identity=identity, role=decision.role, codec=codec,
                   slots=decision.slots, tools=frozenset(decision.tools),
                   labels=decision.labels, host=str(body.get("host", "")),
                   pid=int(body.get("pid", 0)), version=decision.version,
                   features=frozenset(decision.features), session=session, key=self._key)
        # The same peer again: on this connection, or reconnected on a fresh one.
        previous = node
        if previous is None:
            held = self.registry.by_name.get(decision.name)
            if held is not None and session and held.session == session:
                previous = held
                self.registry.remove(held, now)
        self.registry.add(new, now)
        if decision.role == "forager":
            running = list(body.get("running", []))
            if previous is not None and previous.role == "forager":
                self.scheduler.forager_rejoined(previous, new, running, now)
            if self.scheduler.held:
                self.scheduler.adopt(new, running, now)
            self.scheduler.forager_joined(new)
            stale = [r for r in running if isinstance(r, str) and r not in new.in_flight]
        elif previous is not None and previous.identity != identity:
            self.scheduler.client_moved(previous.identity, identity)
        self._send(new, p.Message("welcome", decision.body(self.terms), ref=msg.id))
        if decision.role == "forager":
            # Assignments it still runs that this queen no longer holds (it restarted
            # without them, or gave them to another forager): stop them there.
            for ref in stale:
                self._send(new, p.Message("task.cancel", {"task": ref.rpartition(".")[0]},
                                          ref=ref))

    def _on_hb(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
               now: float) -> None:
        body = msg.b
        if node is None:
            # An IACP 1.1 forager registers with its first heartbeat.
            self._register_legacy(identity, msg, now)
            return
        if body.get("state") == "draining" and node.state == ACTIVE:
            node.state = DRAINING
        if body.get("state") == "leaving":
            self.registry.remove(node, now)
            if node.role == "forager":
                self.scheduler.forager_lost(node, now, "forager left")
            return
        if "load" in body and isinstance(body["load"], int | float):
            node.load = float(body["load"])
        running = body.get("running")
        if running:
            self.scheduler.renew(node, running, now)

    def _register_legacy(self, identity: bytes, msg: p.Message, now: float) -> None:
        body = msg.b
        name = msg.frm
        if not p.valid_name(name):
            self._error_to(identity, JSON, "bad-name", f"name {name!r} is not allowed", msg.id)
            return
        if self.registry.name_taken(name, identity, now):
            self._error_to(identity, JSON, NAME_TAKEN,
                           f"the name {name!r} is held by a live peer", msg.id)
            return
        if self.authorized is not None:
            why = self.authorized.check(self._key, name, "forager")
            if why is not None:
                self.counters["refused_keys"] += 1
                self._error_to(identity, JSON, NOT_ALLOWED, why, msg.id)
                return
        slots = body.get("slots", 1)
        tools = body.get("tools", [])
        if not isinstance(slots, int) or slots < 1 or not all(isinstance(t, str) for t in tools):
            self._error_to(identity, JSON, "bad-hello",
                           "hb body needs slots >= 1 and a list of tool names", msg.id)
            return
        new = Node(name=name, identity=identity, role="forager", codec=JSON, slots=slots,
                   key=self._key,
                   tools=frozenset(tools), labels=dict(body.get("labels") or {}),
                   version=msg.v)
        # 1.1 peers beat every 10 s; give them the same number of misses at that pace.
        new.timeout = max(self.registry.timeout, LEGACY_HB_INTERVAL * self.registry.hb_misses)
        self.registry.add(new, now)
        self.scheduler.forager_joined(new)

    def _on_submit(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        rate = self.config.submit_rate
        slow = self._allow(identity, now, rate)
        if slow:
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED,
                           f"more than {rate:g} submissions per second from this "
                           "peer: slow down", msg.id, retry_after=round(slow, 4))
            return
        body = msg.b
        known = self.scheduler.known(msg.id)
        if known is not None:
            self._resubmitted(identity, node, msg, codec, known)
            return
        priority = body.get("priority", 50)
        max_attempts = body.get("max_attempts", 3)
        if not 0 <= priority <= 99 or not 1 <= max_attempts <= 100:
            self._error_to(identity, codec, "bad-value",
                           "priority must be 0-99 and max_attempts 1-100", msg.id)
            return
        timeout = body.get("timeout")
        wait = body.get("wait", self.config.no_forager_wait)
        if any(not 0 <= body.get(k, 0) <= 3600 for k in ("retry_base", "retry_cap")):
            self._error_to(identity, codec, "bad-value",
                           "retry_base and retry_cap are seconds between 0 and 3600", msg.id)
            return
        if (timeout is not None and timeout <= 0) or wait < 0:
            self._error_to(identity, codec, "bad-value", "timeout must be > 0 and wait >= 0",
                           msg.id)
            return
        key = body.get("key")
        if key is not None:
            if not isinstance(key, str) or not 0 < len(key) <= 200:
                self._error_to(identity, codec, "bad-value",
                               "an idempotency key is a string of 1-200 characters", msg.id)
                return
            known = self.scheduler.find_key(key)  # in memory, else in the journal
            if known is not None and self._attach(identity, node, msg, known):
                return
        task = Task(id=msg.id, capability=body["capability"], payload=body.get("payload"),
                    client=identity, client_name=node.name, priority=priority,
                    timeout=timeout, to=body.get("to"), labels=dict(body.get("labels") or {}),
                    max_attempts=max_attempts, wait=wait, key=key,
                    retry_base=body.get("retry_base"), retry_cap=body.get("retry_cap"))
        try:
            self.scheduler.submit(task, now, unknown=True)
        except QueueFull as e:
            self._error_to(identity, codec, QUEUE_FULL, f"queue full: {e}", msg.id)
            return
        except DuplicateTask:
            self._error_to(identity, codec, DUPLICATE_TASK,
                           f"a task with id {msg.id!r} already exists", msg.id)
            return
        if body.get("ack"):
            # Sent after this turn's assignments go out: the assign is on the critical
            # path of the task, the acknowledgement is not.
            self._later.append((node, p.Message("task.submitted", {"task": task.id},
                                                ref=msg.id)))

    def _resubmitted(self, identity: bytes, node: Node, msg: p.Message, codec: str,
                     task: Task) -> None:
        """A submission whose id the queen holds: its client sending it again after a
        reconnect. The same task, not a new one: its results go to the client's current
        connection, and a result it may have missed is sent now."""
        if task.client_name != node.name:
            self._error_to(identity, codec, DUPLICATE_TASK,
                           f"a task with id {msg.id!r} was submitted by another client: "
                           "task ids must be unique in the colony", msg.id)
            return
        self.counters["resubmitted"] += 1
        task.client = identity
        if task.final is not None:
            self._send(node, p.Message("task.result", task.final, ref=task.id))
        elif msg.b.get("ack"):
            self._later.append((node, p.Message("task.submitted", {"task": task.id},
                                                ref=msg.id)))

    def _attach(self, identity: bytes, node: Node, msg: p.Message, task_id: str) -> bool:
        """A submission repeating an idempotency key: attach it to the task it names (or
        answer with its result) instead of running the work again."""
        task = self.scheduler.find(task_id)
        if task is None:
            return False
        if task.final is not None:
            self._send(node, p.Message("task.result", {**task.final, "task": msg.id,
                                                       "original": task.id}, ref=msg.id))
        else:
            task.watchers.append((identity, node.name, msg.id))
            if msg.b.get("ack"):
                self._later.append((node, p.Message(
                    "task.submitted", {"task": msg.id, "original": task.id}, ref=msg.id)))
        self.counters["idempotent_hits"] += 1
        return True

    def _attempt(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                 ref: str | None) -> Any:
        assert node is not None
        verdict, att = self.scheduler.lookup(node, ref)
        if verdict == "ok":
            return att
        if verdict == "duplicate":
            return None
        self.counters["protocol_errors"] += 1
        if verdict == "foreign":
            self._error_to(identity, codec, NOT_YOURS,
                           f"assign {ref!r} belongs to another forager", msg.id)
        else:
            self.scheduler.counters["unknown_results"] += 1
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"no assign {ref!r} is known for this forager", msg.id, assign=ref)
        return None

    def _on_accept(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        att = self._attempt(identity, node, msg, codec, msg.ref)
        if att is not None:
            self.scheduler.accept(att, now)

    def _on_reject(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        att = self._attempt(identity, node, msg, codec, msg.ref)
        if att is not None:
            self.scheduler.reject(att, msg.b["reason"], now)
        else:
            self._release(node, msg.ref)

    def _on_progress(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                     now: float) -> None:
        att = self._attempt(identity, node, msg, codec, msg.ref)
        if att is not None:
            self.scheduler.progress(att, msg.b, now)

    def _on_result(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        self._result(identity, node, msg, codec, msg.ref, msg.b, now)

    def _result(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                ref: str | None, body: dict[str, Any], now: float) -> None:
        att = self._attempt(identity, node, msg, codec, ref)
        if att is not None:
            self.scheduler.result(att, body, now)
        elif not body.get("partial"):
            self._release(node, ref)

    def _release(self, node: Node | None, ref: str | None) -> None:
        att = self.scheduler.attempts.get(ref) if ref is not None else None
        if att is None or node is None or att.node.name != node.name or att.live:
            return
        # A final answer for an abandoned attempt: count it unless it was an expected
        # cancellation, and free the slot it was holding.
        if att.task.state != "cancelled":
            self.scheduler.counters["duplicates"] += 1
        self.scheduler.release(att)

    def _on_batch(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                  now: float) -> None:
        for item in msg.b["results"]:
            if not isinstance(item, dict) or not isinstance(item.get("ref"), str):
                self.counters["protocol_errors"] += 1
                self._error_to(identity, codec, "bad-type",
                               "each batched result must be a map with a 'ref'", msg.id)
                continue
            self._result(identity, node, msg, codec, item["ref"], item, now)

    def _on_cancel(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        task_id = msg.b.get("task") or msg.ref
        task = self.scheduler.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None or task.client != identity:
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"no running task {task_id!r} submitted by this client", msg.id)
            return
        self.scheduler.cancel(task.id, now)

    def _on_task_status(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                        now: float) -> None:
        assert node is not None
        task = self.scheduler.find(msg.b["task"])
        if task is None:
            self._error_to(identity, codec, UNKNOWN_TASK, f"no task {msg.b['task']!r}", msg.id)
            return
        if task.client_name == node.name and task.client != identity:
            task.client = identity  # its submitter reconnected: results go to the new link
        body: dict[str, Any] = {
            "task": task.id, "state": task.state, "attempt": task.attempt,
            "capability": task.capability, "priority": task.priority,
            "forager": task.current.node.name if task.current else None,
            "age": round(now - task.submitted, 3),
            "history": [[round(t - task.submitted, 6), s, w] for t, s, w in task.history],
        }
        if task.final is not None and task.client_name == node.name:
            body["final"] = task.final  # lets a reconnected submitter collect a result it missed
        self._send(node, p.Message("task.state", body, ref=msg.id))

    def status(self, now: float) -> dict[str, Any]:
        """Registry, queue depths and counters (what ``meshant status`` shows).

        Safe to call from another thread: it reads snapshots (``list()`` of a dict is
        atomic under the GIL) and changes nothing.
        """
        peers = list(self.registry.by_id.values())
        foragers = [n.record(now) for n in peers if n.role == "forager"]
        info = self.info
        return {
            "queen": {"name": self.name, "colony": self.config.colony, "epoch": self.epoch,
                      "advertised": info.advertised, "endpoint": info.endpoint,
                      "pub": info.pub, "pid": info.pid, "host": info.host,
                      "uptime": round(now - info.started, 3),
                      "assign_timeout": self.scheduler.assign_timeout,
                      "hb_interval": self.registry.hb_interval,
                      "hb_misses": self.registry.hb_misses},
            "foragers": foragers,
            "clients": sum(1 for n in peers if n.role == "client"),
            "queues": self.scheduler.depths(),
            "queued": self.scheduler.queued,
            "running": sum(f["in_flight"] for f in foragers),
            "counters": {**self.scheduler.counters, **self.counters},
            "dead_letters": len(self.scheduler.dlq),
            "breakers": self.scheduler.breakers(),
            "recently_gone": list(self.registry.gone)[-10:],
        }

    def _on_status(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        self._send(node, p.Message("status.reply", self.status(now), ref=msg.id))

    def _on_tool_query(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                       now: float) -> None:
        assert node is not None
        tool = msg.b["tool"]
        foragers = [{"name": n.name, "slots": n.slots, "in_flight": len(n.in_flight),
                     "labels": n.labels, "state": n.state}
                    for n in self.registry.serving(tool)]
        self._send(node, p.Message("tool.reply", {"tool": tool, "foragers": foragers},
                                   ref=msg.id))

    def _on_directed(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                     now: float) -> None:
        assert node is not None
        names = msg.recipients
        missing = [n for n in names if n not in self.registry.by_name]
        if not names or missing:
            self._error_to(identity, codec, UNKNOWN_RECIPIENT,
                           f"no live peer named {', '.join(missing) or '(none given)'}", msg.id)
            return
        for name in names:
            target = self.registry.by_name[name]
            out = p.Message(msg.kind, msg.body, id=msg.id, frm=node.name, to=name, ts=msg.ts,
                            ref=msg.ref, extra=msg.extra)
            self._send(target, out)

    def _on_broadcast(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                      now: float) -> None:
        assert node is not None
        topic = msg.b["topic"]
        if not valid_topic(topic):
            self._error_to(identity, codec, BAD_TOPIC, f"topic {topic[:40]!r} is not allowed: "
                           f"use 1-{TOPIC_MAX} characters of A-Z a-z 0-9 . _ : / -", msg.id)
            return
        out = p.Message("broadcast", msg.body, id=msg.id, frm=node.name, ts=msg.ts)
        frames = p.binary.encode(out)
        size = sum(len(f) for f in frames)
        limit = self.config.max_broadcast
        if size > limit:
            self._error_to(identity, codec, p.errors.TOO_LARGE,
                           f"the broadcast is {size:,} bytes, over the queen's limit of "
                           f"{limit:,} (--max-broadcast): send large data as a "
                           "task payload or in colony memory", msg.id)
            return
        # One send on PUB reaches every subscriber; "u." keeps user topics apart from ours.
        self.out.append(Publish(USER_PREFIX + topic.encode(), frames))
        self.counters["broadcasts"] += 1

    def _on_memory(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        b = msg.b
        op = b.get("op")
        try:
            if op == "snapshot":
                self._send(node, p.Message("mem.sync", self.memory.snapshot(), ref=msg.id))
                return
            if op == "set":
                ttl = b.get("ttl")
                update = self.memory.set(b.get("key"), b.get("value"), now,  # type: ignore[arg-type]
                                         float(ttl) if ttl is not None else None)
            elif op == "delete":
                update = self.memory.delete(b.get("key"))  # type: ignore[arg-type]
            else:
                self._error_to(identity, codec, "bad-value",
                               "mem.sync op must be set, delete or snapshot", msg.id)
                return
        except MemoryError_ as e:
            self._error_to(identity, codec, e.code, e.message, msg.id)
            return
        if update is not None:
            self._publish_mem(update)
        self._send(node, p.Message("mem.sync", {"op": "ok", "seq": self.memory.seq},
                                   ref=msg.id))

    def _on_dlq(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                now: float) -> None:
        assert node is not None
        b = msg.b
        op = b["op"]
        dlq = self.scheduler.dlq
        wanted = list(dlq) if b.get("all") else [b.get("task")] if b.get("task") else []
        missing = [t for t in wanted if t not in dlq]
        if op in ("show", "retry", "purge") and (not wanted or missing):
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"no dead letter {', '.join(map(str, missing)) or '(none given)'}",
                           msg.id)
            return
        if op in ("list", "show"):
            chosen = wanted if op == "show" else list(dlq)
            items = [{"task": t.id, "capability": t.capability, "error": (t.final or {}).get(
                "error"), "attempts": t.attempt, "client": t.client_name,
                "payload": t.payload if op == "show" else None} for t in
                (dlq[i] for i in chosen)]
            self._send(node, p.Message("dlq.reply", {"op": op, "items": items}, ref=msg.id))
            return
        if op == "retry":
            new = [self.scheduler.dlq_retry(t, identity, node.name, now).id for t in wanted]
            self._send(node, p.Message("dlq.reply", {"op": op, "tasks": new}, ref=msg.id))
            return
        if op == "purge":
            for t in wanted:
                self.scheduler.dlq_purge(t)
            self._send(node, p.Message("dlq.reply", {"op": op, "tasks": wanted}, ref=msg.id))
            return
        self._error_to(identity, codec, "bad-value", "dlq op must be list, show, retry or purge",
                       msg.id)

    def _publish_mem(self, update: dict[str, Any]) -> None:
        msg = p.Message("mem.sync", update, frm=self.name, ts=self._wall(self._now))
        self.out.append(Publish(MEM_TOPIC, p.binary.encode(msg)))

    def _on_control(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                    now: float) -> None:
        """ctl.drain / ctl.halt for a forager, from a client (or the CLI)."""
        assert node is not None
        names = msg.recipients
        targets = [self.registry.by_name.get(n) for n in names]
        if not names or any(t is None or t.role != "forager" for t in targets):
            self._error_to(identity, codec, UNKNOWN_RECIPIENT,
                           f"no live forager named {', '.join(names) or '(none given)'}",
                           msg.id)
            return
        for target in targets:
            assert target is not None
            self._send(target, p.Message(msg.kind, msg.body, frm=node.name))
            if msg.kind == "ctl.drain":
                target.state = DRAINING  # assign nothing more to it, at once
            else:
                self.registry.remove(target, now)
                self.scheduler.forager_lost(target, now, "forager halted")
        self.counters[msg.kind.replace(".", "_")] += 1

    # -- output ---------------------------------------------------------------------------

    def beat(self, now: float) -> None:
        """The queen's heartbeat on PUB (every ``hb_interval``)."""
        self._now = now
        hb = p.Message("hb", {"epoch": self.epoch, "queen": self.name,
                              "interval": self.registry.hb_interval,
                              "mem_seq": self.memory.seq},
                       frm=self.name, ts=self._wall(now))
        self.out.append(Publish(HB_TOPIC, p.binary.encode(hb)))

    def _flush(self) -> None:
        out = self.scheduler.out
        self.scheduler.out = []
        mono = self._now
        wall = self._wall(mono)
        by_id = self.registry.by_id
        # Per peer, in one turn: results for a client, assignments for a forager travel
        # as one message when the peer negotiated batching. Anything else sent to that
        # peer first flushes its batch, so the order of what it receives never changes.
        results: dict[bytes, list[dict[str, Any]]] = {}
        assigns: dict[bytes, tuple[Node, list[dict[str, Any]]]] = {}
        for action in out:
            what = action[0]
            if what == "assign":
                node, att = action[1], action[2]
                task = att.task
                body: dict[str, Any] = {"task": task.id, "attempt": att.number,
                                        "capability": task.capability, "payload": task.payload}
                if task.deadline is not None:
                    left = task.deadline - mono
                    body["timeout"] = left
                    body["deadline"] = wall + left
                if node.codec == JSON:
                    body["node"] = task.id
                if "batch" in node.features:
                    body["id"] = att.id
                    assigns.setdefault(node.identity, (node, []))[1].append(body)
                    continue
                self._send(node, p.Message("task.assign", body, id=att.id, to=node.name,
                                           ts=wall))
            elif what == "watch":
                self._send_to(action[1], BINARY, p.Message(
                    "task.result", action[3], to=action[2], ref=action[3]["task"], ts=wall))
            elif what == "cancel":
                node, att = action[1], action[2]
                if node.identity in assigns:
                    self._send_assigns(*assigns.pop(node.identity))
                self._send(node, p.Message("task.cancel", {"task": att.task.id}, to=node.name,
                                           ref=att.id, ts=wall))
            else:
                task, kind, body = action[1], action[2], action[3]
                client = task.client
                if kind == "task.result":
                    peer = by_id.get(client)
                    if peer is not None and "batch" in peer.features:
                        results.setdefault(client, []).append(body)
                        continue
                if client in results:
                    self._send_results(client, results.pop(client))
                self._send_to(client, BINARY,
                              p.Message(kind, body, to=task.client_name, ref=task.id, ts=wall))
        for node, items in assigns.values():
            self._send_assigns(node, items)
        for client, items2 in results.items():
            self._send_results(client, items2)

    def _send_assigns(self, node: Node, items: list[dict[str, Any]]) -> None:
        if len(items) == 1:
            body = items[0]
            self._send(node, p.Message("task.assign", body, id=body.pop("id"), to=node.name))
        else:
            self._send(node, p.Message("task.assigns", {"assigns": items}, to=node.name))

    def _send_results(self, client: bytes, items: list[dict[str, Any]]) -> None:
        if len(items) == 1:
            msg = p.Message("task.result", items[0], ref=items[0]["task"])
        else:
            msg = p.Message("task.batch", {"results": items})
        self._send_to(client, BINARY, msg)

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
        self.out.append(Send(identity, codec, msg))

    def _error_to(self, identity: bytes, codec: str, code: str, message: str,
                  ref: str | None, **extra: Any) -> None:
        self._send_to(identity, codec, p.Message("error", {"code": code, "message": message,
                                                           **extra}, ref=ref))

    def _handle(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        identity = frames[0]
        self._key = key
        self.counters["messages"] += 1
        try:
            msg, codec = p.decode_any(frames[1:], max_frame=self.config.max_message)
        except p.ProtocolError as e:
            self.counters["protocol_errors"] += 1
            codec = JSON if len(frames) == 2 and frames[1][:1] == b"{" else BINARY
            ref = p.binary.peek_id(frames[1:]) if codec == BINARY else None
            self._error_to(identity, codec, e.code, e.message, ref)
            if e.code == p.errors.TOO_LARGE and codec == BINARY:
                self._oversized_result(identity, frames[1:], now)
            return
        node = self.registry.by_id.get(identity)
        if node is not None:
            self.registry.touch(node, now)
            if msg.frm and msg.frm != node.name:
                self._error_to(identity, codec, BAD_FROM,
                               f"'from' is {msg.frm!r} but this peer registered as "
                               f"{node.name!r}", msg.id)
                return
        handler = self._handlers.get(msg.kind)
        if handler is None:
            self._error_to(identity, codec, UNSUPPORTED,
                           f"the queen does not accept {msg.kind!r} messages", msg.id)
            return
        if node is None and msg.kind != "hello" and not (codec == JSON and msg.kind == "hb"):
            self.counters["protocol_errors"] += 1
            if msg.kind == "task.result" and not msg.b.get("partial"):
                # A forager we declared offline sends the result of an attempt we already
                # moved on from: count it as the duplicate it is.
                att = self.scheduler.attempts.get(msg.ref or "")
                if att is not None and not att.live:
                    self.scheduler.counters["duplicates"] += 1
            self._error_to(identity, codec, NOT_REGISTERED,
                           "say hello first: this peer is not registered with the queen",
                           msg.id)
            return
        handler(identity, node, msg, codec, now)


__all__ = ["Action", "Publish", "QueenConfig", "QueenCore", "Record", "Send"]
