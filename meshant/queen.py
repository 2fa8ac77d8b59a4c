"""The queen: binds a ROUTER and a PUB, registers peers, schedules tasks, relays results.

Thin glue over :mod:`meshant.registry` and :mod:`meshant.scheduler`: one I/O thread owns
both sockets and runs a ``zmq.Poller`` loop; every decision is made by the sans-IO objects.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from . import _zmqio as _zio
from . import protocol as p
from ._peer import HB_TOPIC, MEM_TOPIC, valid_topic
from ._waker import Waker
from .errors import MeshantError
from .journal import Journal, JournalError
from .memory import MemoryError_, MemoryStore
from .policy import Backoff
from .protocol.codec import BINARY, JSON
from .registry import ACTIVE, DRAINING, Node, Registry
from .scheduler import DuplicateTask, QueueFull, Scheduler, Task
from .security import Authorized, load_secret, server_socket

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
TOPIC_MAX = 200

LEGACY_HB_INTERVAL = 10.0  # IACP 1.1 foragers beat every 10 s
ROUTER_RCVHWM = 1000  # messages queued from one peer before TCP holds it back




class Queen:
    """The colony's orchestrator.

    ``bind`` and ``pub`` are ZeroMQ endpoints (``tcp://127.0.0.1:0`` picks a free port;
    the bound endpoints are in :attr:`endpoint` and :attr:`pub_endpoint` once started).
    Use :meth:`run` to serve in the calling thread or :meth:`start`/:meth:`stop` to serve
    from a background thread.
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5670",
        pub: str = "tcp://127.0.0.1:5671",
        *,
        name: str = "queen",
        assign_timeout: float = 300.0,
        hb_interval: float = 1.0,
        hb_misses: int = 5,
        max_queue: int = 100_000,
        max_message: int = 64 * 1024 * 1024,
        max_peers: int = 10_000,
        no_forager_wait: float = 30.0,
        pub_hwm: int | None = None,
        pub_buffer: int = 64 * 1024 * 1024,
        max_broadcast: int = 128 * 1024,
        mem_max_keys: int = 10_000,
        mem_max_value: int = 64 * 1024,
        colony: str = "default",
        advertise: bool | None = None,
        mdns_interfaces: list[str] | None = None,
        curve_secret: str | None = None,
        authorized: str | None = None,
        peer_hwm: int = 100_000,
        submit_rate: float = 10_000.0,
        journal: str | None = None,
        retention: float = 86_400.0,
        retention_count: int = 100_000,
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.bind = bind
        self.pub = pub
        self.name = name
        self.epoch = secrets.token_hex(8)
        self.max_message = max_message
        self.no_forager_wait = no_forager_wait
        self.registry = Registry(hb_interval, hb_misses, max_peers)
        self.scheduler = Scheduler(self.registry, assign_timeout=assign_timeout,
                                   max_queue=max_queue, default_wait=no_forager_wait,
                                   backoff=Backoff(retry_base, retry_cap),
                                   breaker_threshold=breaker_threshold,
                                   breaker_cooldown=breaker_cooldown)
        self.terms = p.QueenTerms(epoch=self.epoch, hb_interval=hb_interval,
                                  hb_misses=hb_misses, assign_timeout=assign_timeout,
                                  queen=name, max_message=max_message)
        self.endpoint = ""
        self.pub_endpoint = ""
        self.counters: dict[str, int] = {"protocol_errors": 0, "messages": 0, "dropped_sends": 0,
                                         "broadcasts": 0, "ctl_drain": 0, "ctl_halt": 0,
                                         "refused_keys": 0, "rate_limited": 0,
                                         "idempotent_hits": 0, "resubmitted": 0}
        self.memory = MemoryStore(mem_max_keys, mem_max_value)
        self.colony = colony
        # Advertise by default only where others could join: not on loopback.
        self.advertise = advertise
        self.mdns_interfaces = mdns_interfaces
        self.advertiser: Any = None
        # CURVE: who may connect at all (zmq.auth's ZAP handler), and which names and
        # roles each key may take (meshant.security.Authorized).
        self.curve: tuple[bytes, bytes] | None = None
        self.authorized: Authorized | None = None
        if curve_secret is not None:
            if authorized is None:
                raise MeshantError("--curve-secret needs --authorized DIR: the folder of "
                                   "public keys allowed to connect")
            self.curve = load_secret(curve_secret)
            self.authorized = Authorized(authorized)
        elif authorized is not None:
            raise MeshantError("--authorized needs --curve-secret FILE: the queen's own key")
        self.peer_hwm = peer_hwm
        self.submit_rate = submit_rate
        self._auth: Any = None
        self._reload_keys = False
        # The journal: opened (and checked) here, so a bad file fails before any bind.
        self.journal: Journal | None = None
        self.restored = 0
        self.retention = retention
        self.retention_count = retention_count
        if journal is not None and journal != ":memory:":
            try:
                self.journal = Journal(journal)
            except JournalError as e:
                raise MeshantError(str(e), code="bad-journal") from None
            self.scheduler.track_changes = True
            # Final tasks stay on disk: the scheduler looks them up there (find,
            # find_key), and the journal's own thread prunes them.
            self.scheduler.archive = self.journal
            self.journal.retain(retention, retention_count)
            self.restored = self.scheduler.restore(
                self.journal.unfinished(), time.monotonic(), time.time(),
                grace=self.registry.timeout * 2)
        # libzmq bounds a pipe in messages: a subscriber's queue holds at most pub_hwm
        # of them, and a broadcast is at most max_broadcast bytes, so pub_hwm derived from
        # the byte budget bounds what one slow subscriber can make the queen hold.
        self.max_broadcast = max_broadcast
        self.pub_buffer = pub_buffer
        self.pub_hwm = pub_hwm if pub_hwm is not None else max(64, pub_buffer // max_broadcast)
        self._ctx = context or zmq.Context.instance()
        self._waker = Waker()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._started = 0.0
        self._later: list[tuple[Node, p.Message]] = []
        self._key: bytes | None = None
        self._buckets: dict[bytes, list[float]] = {}
        self._handlers: dict[str, Callable[[bytes, Node | None, p.Message, str, float], None]] = {
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

    # -- running --------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Queen:
        """Serve from a background thread; returns once bound (raises if binding failed)."""
        self._thread = threading.Thread(target=self._run_guarded, name="meshant-queen",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise MeshantError(f"queen did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as e:  # reported to start(); the thread must not die silently
            self._error = e
            self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the loop to stop and wait for it (when it runs in a background thread)."""
        self._stop.set()
        self._waker.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def run(self) -> None:
        """Bind and serve until :meth:`stop` is called (from any thread or a signal handler)."""
        router = self._ctx.socket(zmq.ROUTER)
        pub = self._ctx.socket(zmq.PUB)
        try:
            for s in (router, pub):
                s.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            # A little over the protocol's own limit: a frame just too large gets a
            # "too-large" answer; one far too large never gets past libzmq (the
            # connection is dropped), so it cannot even be buffered.
            router.setsockopt(zmq.MAXMSGSIZE, self.max_message + 65536)
            # Per-peer buffers: at most this many messages queue for (or from) one peer.
            # Incoming: a peer that sends faster than the loop reads is held back by TCP
            # (its own pipe fills), so a small receive queue loses nothing.
            router.setsockopt(zmq.RCVHWM, min(self.peer_hwm, ROUTER_RCVHWM))
            router.setsockopt(zmq.SNDHWM, self.peer_hwm)
            # A peer reconnecting with an identity it had takes over the old connection.
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            # ZMTP pings drop dead TCP peers' pipes, so nothing queues for them. Liveness
            # is the application heartbeat (a silent forager is offline after hb_misses x
            # hb_interval); the pings only reclaim pipes, so they go every two liveness
            # timeouts (10 s by default): each is a wakeup and a write plus a read per
            # peer in libzmq's I/O thread, most of the queen's cost with 1,000 foragers
            # when it was every interval. A dead peer's pipe goes within ~20 s.
            zmtp = max(1000, int(self.registry.timeout * 2000))
            router.setsockopt(zmq.HEARTBEAT_IVL, zmtp)
            router.setsockopt(zmq.HEARTBEAT_TIMEOUT, zmtp)
            # A subscriber that falls this many messages behind loses the newest ones
            # (PUB drops, never blocks): the queen's memory stays bounded.
            pub.setsockopt(zmq.SNDHWM, self.pub_hwm)
            if self.curve is not None:
                self._start_auth()
                for sock in (router, pub):
                    server_socket(sock, *self.curve)
            try:
                router.bind(self.bind)
                pub.bind(self.pub)
            except zmq.ZMQError as e:
                raise MeshantError(f"cannot bind {self.bind} / {self.pub}: {e.strerror}. "
                                   "Is another queen running there? Pick free endpoints "
                                   "with --bind/--pub.") from None
            self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self.pub_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.terms = dataclasses.replace(self.terms, pub=self.pub_endpoint)
            self._router = router
            self._pub = pub
            self._started = time.monotonic()
            self._start_advertising()
            self._ready.set()
            self._loop(router)
        finally:
            if self.advertiser is not None:
                self.advertiser.close()  # unregistered: joiners see the queen go
            router.close(0)
            pub.close(0)
            if self._auth is not None:
                self._auth.stop()
            if self.journal is not None:
                self.journal.close()
            self._waker.close()

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

    def _start_auth(self) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        assert self.authorized is not None
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("meshant.zap"))
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(self.authorized.directory))

    def reload_keys(self) -> None:
        """Re-read the authorized keys (safe from any thread or a signal handler)."""
        self._reload_keys = True
        self._waker.wake()

    def _check_keys(self, now: float) -> None:
        auth = self.authorized
        if auth is None or not (self._reload_keys or auth.changed()):
            return
        self._reload_keys = False
        auth.reload()
        self._auth.configure_curve(domain="*", location=str(auth.directory))
        # A revoked key's live connections are dropped too, not just future handshakes.
        for node in list(self.registry.by_id.values()):
            if node.key is not None and node.key not in auth.grants:
                self.registry.remove(node, now)
                if node.role == "forager":
                    self.scheduler.forager_lost(node, now, "key revoked")
        log.info("reloaded %d authorized keys", len(auth.grants))

    def _start_advertising(self) -> None:
        from .discovery import Advertiser, advertise_interfaces, is_loopback

        tcp = self.endpoint.startswith("tcp://")
        on = self.advertise if self.advertise is not None else (
            tcp and not is_loopback(self.endpoint))
        if not on:
            return
        if not tcp:
            # ipc:// and inproc:// queens are reachable from this host only: nothing to
            # tell the network (and no interface to say it on).
            log.warning("not advertising %s: mDNS discovery needs a tcp:// endpoint",
                        self.endpoint)
            return
        ifaces = self.mdns_interfaces or advertise_interfaces(self.endpoint)
        self.advertiser = Advertiser(colony=self.colony, name=self.name, router=self.endpoint,
                                     pub=self.pub_endpoint, epoch=self.epoch,
                                     interfaces=ifaces or None,
                                     curve_key=self.curve[0].decode() if self.curve else "")

    def _loop(self, router: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        sched = self.scheduler
        tick_every = min(0.05, self.registry.hb_interval / 4)
        next_tick = time.monotonic()
        next_beat = next_tick
        next_keys = next_tick
        handle = self._handle
        events_of = router.getsockopt
        EVENTS, POLLIN = _zio.EVENTS, _zio.POLLIN
        recv_frames = _zio.recv_frames
        curve = self.curve is not None
        while not self._stop.is_set():
            now = time.monotonic()
            wait = max(0.0, min(next_tick, next_beat) - now)
            events = dict(poller.poll(wait * 1000))
            if router in events:
                # Drain what is there without blocking, bounded so timers still run.
                # Asking EVENTS is cheaper than the exception a NOBLOCK recv raises.
                for _ in range(1000):
                    if not events_of(EVENTS) & POLLIN:
                        break
                    if curve:
                        frames, key = _zio.recv_frames_key(router)
                        handle(frames, key)
                    else:
                        handle(recv_frames(router))
            if self._waker.fd in events:
                self._waker.drain()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + tick_every
                if now >= next_keys:
                    next_keys = now + 2.0
                    self._check_keys(now)
                for node in self.registry.expired(now):
                    if node.role == "forager":
                        sched.forager_lost(node, now, "forager went silent")
                sched.tick(now)
                for update in self.memory.expire(now):
                    self._publish_mem(update)
            if now >= next_beat:
                next_beat = now + self.registry.hb_interval
                self._beat()
            if sched.dirty:
                sched.dispatch(now)
            if sched.changed and self.journal is not None:
                # Durable before anything about it leaves: one transaction per turn.
                self.journal.record(sched.changed.values(), time.time() - time.monotonic())
                sched.changed.clear()
            if sched.out:
                self._flush()
            if self._later:
                later, self._later = self._later, []
                for node, msg in later:
                    self._send(node, msg)

    # -- input ----------------------------------------------------------------------------

    def _handle(self, frames: list[bytes], key: bytes | None = None) -> None:
        identity = frames[0]
        self._key = key
        self.counters["messages"] += 1
        try:
            msg, codec = p.decode_any(frames[1:], max_frame=self.max_message)
        except p.ProtocolError as e:
            self.counters["protocol_errors"] += 1
            codec = JSON if len(frames) == 2 and frames[1][:1] == b"{" else BINARY
            ref = p.binary.peek_id(frames[1:]) if codec == BINARY else None
            self._error_to(identity, codec, e.code, e.message, ref)
            if e.code == p.errors.TOO_LARGE and codec == BINARY:
                self._oversized_result(identity, frames[1:])
            return
        node = self.registry.by_id.get(identity)
        now = time.monotonic()
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

    def _oversized_result(self, identity: bytes, frames: list[bytes]) -> None:
        """A forager's result over the limit (libzmq let it through, just): the task
        fails at once with too-large, rather than wait out its lease and run again."""
        node = self.registry.by_id.get(identity)
        if node is None or node.role != "forager":
            return
        try:
            msg = p.binary.decode(frames, max_frame=self.max_message + 65536)
        except p.ProtocolError:
            return
        size = max(len(f) for f in frames)
        if msg.kind == "task.result" and not msg.b.get("partial"):
            refs = [msg.ref]
        elif msg.kind == "task.batch":
            refs = [i.get("ref") for i in msg.b["results"] if isinstance(i, dict)]
        else:
            return
        now = time.monotonic()
        for ref in refs:
            verdict, att = self.scheduler.lookup(node, ref if isinstance(ref, str) else None)
            if verdict == "ok" and att is not None:
                self.scheduler.too_large(att, f"the result from {node.name} is {size:,} bytes, "
                                         f"over the queen's limit of {self.max_message:,} "
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
        slow = self._allow(identity, now, self.submit_rate)
        if slow:
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED,
                           f"more than {self.submit_rate:g} submissions per second from this "
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
        wait = body.get("wait", self.no_forager_wait)
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

    def status(self) -> dict[str, Any]:
        """Registry, queue depths and counters (what ``meshant status`` shows).

        Safe to call from another thread: it reads snapshots (``list()`` of a dict is
        atomic under the GIL) and changes nothing.
        """
        now = time.monotonic()
        peers = list(self.registry.by_id.values())
        foragers = [n.record(now) for n in peers if n.role == "forager"]
        return {
            "queen": {"name": self.name, "colony": self.colony, "epoch": self.epoch,
                      "advertised": self.advertiser is not None, "endpoint": self.endpoint,
                      "pub": self.pub_endpoint, "pid": os.getpid(),
                      "host": socket.gethostname(),
                      "uptime": round(now - self._started, 3),
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
        self._send(node, p.Message("status.reply", self.status(), ref=msg.id))

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
        if size > self.max_broadcast:
            self._error_to(identity, codec, p.errors.TOO_LARGE,
                           f"the broadcast is {size:,} bytes, over the queen's limit of "
                           f"{self.max_broadcast:,} (--max-broadcast): send large data as a "
                           "task payload or in colony memory", msg.id)
            return
        # One send on PUB reaches every subscriber; "u." keeps user topics apart from ours.
        self._pub.send_multipart([b"u." + topic.encode(), *frames])
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
        msg = p.Message("mem.sync", update, frm=self.name, ts=time.time())
        self._pub.send_multipart([MEM_TOPIC, *p.binary.encode(msg)])

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

    def _beat(self) -> None:
        hb = p.Message("hb", {"epoch": self.epoch, "queen": self.name,
                              "interval": self.registry.hb_interval,
                              "mem_seq": self.memory.seq},
                       frm=self.name, ts=time.time())
        self._pub.send_multipart([HB_TOPIC, *p.binary.encode(hb)])

    def _flush(self) -> None:
        out = self.scheduler.out
        self.scheduler.out = []
        wall = time.time()
        mono = time.monotonic()
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
            msg.ts = time.time()
        try:
            frames = p.encode_for(msg, codec)
        except p.ProtocolError as e:
            log.warning("cannot encode %s for peer: %s", msg.kind, e)
            return
        try:
            _zio.send_frames(self._router, frames, identity)
        except zmq.ZMQError:
            # Peer gone (ROUTER_MANDATORY) or its pipe full: never block the loop.
            self.counters["dropped_sends"] += 1

    def _error_to(self, identity: bytes, codec: str, code: str, message: str,
                  ref: str | None, **extra: Any) -> None:
        self._send_to(identity, codec, p.Message("error", {"code": code, "message": message,
                                                           **extra}, ref=ref))


__all__ = ["ACTIVE", "DRAINING", "Queen"]
