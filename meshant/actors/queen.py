"""The queen: binds a ROUTER and a PUB and drives a :class:`~meshant.core.queen.router.QueenCore`.

A thin driver: one I/O thread owns both sockets and runs a ``zmq.Poller`` loop. It reads
the clock, feeds the core what arrives, and carries out what the core decides — sends,
publications and journal records — in order. Every protocol and scheduling decision is
the core's; the driver adds sockets, CURVE authentication, discovery and the journal.
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

from meshant import protocol as p
from meshant.actors import _zmqio as _zio
from meshant.actors._boundary import translated
from meshant.actors._reads import Reads
from meshant.actors._waker import Waker
from meshant.adapters.security import Authorized, load_secret, server_socket
from meshant.core.journal.lease import Hint, Roles, StepDown, TakeOver
from meshant.core.memory.model import MemoryStore
from meshant.core.nodes.registry import ACTIVE, DRAINING, Registry
from meshant.core.queen.carry import carry_out
from meshant.core.queen.outbox import Commit
from meshant.core.queen.router import (
    QueenConfig,
    QueenCore,
    Read,
    Record,
    Send,
)
from meshant.core.queen.state import _Info
from meshant.core.tasks.limits import parse_rules
from meshant.core.tasks.scheduler import Scheduler
from meshant.errors import ConfigError, JournalError, Timeout
from meshant.observe import tracing
from meshant.storage import is_postgres, open_journal
from meshant.storage.commit import commit_all
from meshant.storage.leadership import Leadership

# Messages read per loop turn at most. 16 against 1,000 before: pipelined throughput
# +7-21 % (journal off) and +15 % (file journal) in interleaved A/B runs; 4 was worse.
# With --durability power each turn's commit is an fsync, and a turn is the group that
# one fsync covers: there the turn may gather more.
TURN_MESSAGES = 16
TURN_MESSAGES_FSYNC = 1000
log = logging.getLogger("meshant.queen")

_ASSIGNS = frozenset({"task.assign", "task.assigns"})
ROUTER_RCVHWM = 1000  # messages queued from one peer before TCP holds it back


class Queen:
    """The colony's orchestrator.

    ``bind`` and ``pub`` are ZeroMQ endpoints (``tcp://127.0.0.1:0`` picks a free port;
    the bound endpoints are in :attr:`endpoint` and :attr:`pub_endpoint` once started).
    Settings come as a :class:`~meshant.core.queen.router.QueenConfig` (``config=``) or as
    keyword arguments of the same names. Use :meth:`run` to serve in the calling thread
    or :meth:`start`/:meth:`stop` to serve from a background thread.
    """

    def __init__(self, bind: str = "tcp://127.0.0.1:5670", pub: str = "tcp://127.0.0.1:5671",
                 *, config: QueenConfig | None = None,
                 context: zmq.Context[Any] | None = None, **settings: Any) -> None:
        if "mdns_interfaces" in settings and settings["mdns_interfaces"] is not None:
            settings["mdns_interfaces"] = tuple(settings["mdns_interfaces"])
        if isinstance(settings.get("limits"), list | str):
            lim = settings["limits"]
            settings["limits"] = (lim,) if isinstance(lim, str) else tuple(lim)
        try:
            c = self.config = dataclasses.replace(config or QueenConfig(), **settings)
        except TypeError as e:
            raise ConfigError(f"Queen: {e} (see QueenConfig for the settings)") from None
        if c.durability not in ("process", "power"):
            raise ConfigError(f"durability {c.durability!r}: use 'process' (survive a killed "
                              "queen) or 'power' (survive a power cut too)")
        try:
            parse_rules(c.limits)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not 0 <= c.journal_defer <= 10:
            raise ConfigError(f"journal_defer {c.journal_defer!r}: seconds between 0 and 10")
        self.bind = bind
        self.pub = pub
        self.name = c.name
        self.colony = c.colony
        self.epoch = ""
        self.endpoint = ""
        self.pub_endpoint = ""
        self.advertiser: Any = None
        # CURVE: who may connect at all (zmq.auth's ZAP handler), and which names and
        # roles each key may take (meshant.security.Authorized).
        self.curve: tuple[bytes, bytes] | None = None
        authorized: Authorized | None = None
        if c.curve_secret is not None:
            if c.authorized is None:
                raise ConfigError("--curve-secret needs --authorized DIR: the folder of "
                                   "public keys allowed to connect")
            self.curve = load_secret(c.curve_secret)
            authorized = Authorized(c.authorized)
        elif c.authorized is not None:
            raise ConfigError("--authorized needs --curve-secret FILE: the queen's own key")
        self.authorized = authorized
        self._auth: Any = None
        self._reload_keys = False
        # The journal: opened (and checked) here, so a bad file fails before any bind.
        self.journal: Any = None
        self.leadership: Leadership | None = None
        self._waker = Waker()
        if c.journal is not None and c.journal != ":memory:":
            try:
                self.journal = open_journal(c.journal, timeout=c.lease,
                                            durability=c.durability)
            except JournalError as e:
                raise JournalError(str(e)) from None
            # Final tasks stay on disk; the journal's own thread prunes them.
            self.journal.retain(c.retention, c.retention_count)
            if is_postgres(c.journal):
                # Shared by several queens: this one leads only while it holds the lease.
                self.leadership = Leadership(self.journal, lease=c.lease,
                                             holder=secrets.token_hex(8), name=c.name,
                                             on_change=self._waker.wake)
                self.journal.patience = self.leadership.valid
        self._reads: Reads | None = None
        if self.journal is not None:
            url = c.journal if is_postgres(c.journal) else None
            opener = None if url is None else (
                lambda: open_journal(url, readonly=True, timeout=c.lease))
            self._reads = Reads(self.journal, opener, self._waker.wake)
        now = time.monotonic()
        self._wall_offset = time.time() - now
        self._roles = Roles(leading=self.leadership is None)
        self.core = self._new_core(now, restore=self._roles.leading)
        self.pub_hwm = c.derived_pub_hwm
        self._ctx = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._port = _QueenPort(self)
        self._error: BaseException | None = None
        # --http: the loop publishes a snapshot that the HTTP side reads (meshant.observe).
        self.observer: Any = None
        self._http: Any = None
        if c.http is not None:
            from meshant.actors.client import Client
            from meshant.actors.config import ClientConfig
            from meshant.observe import http_side

            def client(endpoint: str, name: str) -> Client:
                # The dashboard's lookups and actions go to the queen as a client's do.
                return Client(endpoint, config=ClientConfig(name=name, timeout=5.0,
                                                            discover=False))

            self.observer, self._http = http_side(c, lambda: self.endpoint,
                                                 self._waker.wake, client)

    def _new_core(self, now: float, restore: bool) -> QueenCore:
        """A core: restored from the journal (this queen leads), or a standby's."""
        ld = self.leadership
        self.epoch = secrets.token_hex(8) if ld is None else f"t{ld.term}-{secrets.token_hex(6)}"
        j = self.journal
        core = QueenCore(self.config, epoch=self.epoch, wall_offset=self._wall_offset,
                         authorized=self.authorized,
                         restored=j.restored() if restore and j is not None else None,
                         now=now)
        if ld is not None:
            core.lead(ld.term, None if restore else self._hint())
        if self.endpoint:
            core.terms = dataclasses.replace(core.terms, pub=self.pub_endpoint)
            core.info = dataclasses.replace(self.core.info, extra={})
        return core

    def _hint(self) -> dict[str, Any]:
        """What a standby tells a peer: the leader's endpoint, when the lease names one."""
        ld = self.leadership
        assert ld is not None
        info = ld.leader
        hint: dict[str, Any] = {"role": "standby", "term": info.term if info else ld.term,
                                "queen": self.name}
        if info is not None and info.live and info.endpoint and info.endpoint != ld.endpoint:
            hint["leader"] = info.endpoint
            hint["message"] = (f"queen {self.name!r} is a standby: queen {info.name!r} leads "
                               f"(term {info.term}) at {info.endpoint}")
        else:
            hint["message"] = f"queen {self.name!r} is a standby and no queen leads right now"
        return hint

    @property
    def role(self) -> str:
        """``leader`` (always, without a shared journal) or ``standby``."""
        return "leader" if self._roles.leading else "standby"

    def _follow_lease(self, now: float) -> None:
        """(Loop) Follow the lease: take over, step down, or refresh the standby's hint
        (the transitions are :class:`meshant.core.journal.lease.Roles`')."""
        ld = self.leadership
        if ld is None:
            return
        match self._roles.step(ld.valid(), ld.term, ld.leader):
            case TakeOver():
                self._take_over(now)
            case StepDown(term=term):
                self.core = self._new_core(now, restore=False)
                self._advertise_role()
                log.warning("queen %s is a standby now (term %d): its peers go to the "
                            "leader", self.name, term)
            case Hint(term=term):
                self.core.lead(term, self._hint())

    def _advertise_role(self) -> None:
        """Tell discovery the new role and term, from a thread: zeroconf waits for its
        announcements (and may raise), which the loop must not."""
        adv, ld = self.advertiser, self.leadership
        if adv is None or ld is None:
            return
        epoch, role, term = self.epoch, self.role, ld.term

        def update() -> None:
            try:
                adv.update(epoch=epoch, role=role, term=term)
            except Exception as e:  # discovery is advisory: the queen goes on
                log.warning("could not update the mDNS record: %s", e)
        threading.Thread(target=update, name="meshant-mdns-update", daemon=True).start()

    def _take_over(self, now: float) -> None:
        ld = self.leadership
        assert ld is not None
        t0 = time.monotonic()
        self.journal.term = ld.term
        self.journal.reset_chains()
        try:
            core = self._new_core(now, restore=True)
        except JournalError as e:
            ld.step_down(f"cannot read the journal: {e}", ld.term)
            self.core = self._new_core(now, restore=False)
            return
        self.core = core
        self._roles.took_over(ld.term)
        log.warning("queen %s takes over the colony (term %d): %d unfinished tasks, %d "
                    "memory keys restored in %.0f ms", self.name, ld.term, core.restored,
                    len(core.memory.items), (time.monotonic() - t0) * 1000)
        self._advertise_role()

    # What the core holds, for status, tests and tools.

    @property
    def registry(self) -> Registry:
        return self.core.registry

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def memory(self) -> MemoryStore:
        return self.core.memory

    @property
    def counters(self) -> dict[str, int]:
        return self.core.counters

    @property
    def terms(self) -> p.QueenTerms:
        return self.core.terms

    @property
    def restored(self) -> int:
        return self.core.restored

    @property
    def http_url(self) -> str | None:
        """The dashboard's address once serving (``--http``), else None."""
        return self._http.url if self._http is not None and self.endpoint else None

    def status(self) -> dict[str, Any]:
        """Registry, queue depths and counters (what ``meshant status`` shows); safe from
        any thread."""
        return self.core.status(time.monotonic())

    # -- running --------------------------------------------------------------------------

    @translated("the queen")
    def start(self, timeout: float = 10.0) -> Queen:
        """Serve from a background thread; returns once bound (raises if binding failed)."""
        self._thread = threading.Thread(target=self._run_guarded, name="meshant-queen",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise Timeout(f"the queen did not start within {timeout} s")
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

    @translated("the queen")
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
            router.setsockopt(zmq.MAXMSGSIZE, self.config.max_message + 65536)
            # Per-peer buffers: at most this many messages queue for (or from) one peer.
            # Incoming: a peer that sends faster than the loop reads is held back by TCP
            # (its own pipe fills), so a small receive queue loses nothing.
            router.setsockopt(zmq.RCVHWM, min(self.config.peer_hwm, ROUTER_RCVHWM))
            router.setsockopt(zmq.SNDHWM, self.config.peer_hwm)
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
                raise ConfigError(f"cannot bind {self.bind} / {self.pub}: {e.strerror}. "
                                   "Is another queen running there? Pick free endpoints "
                                   "with --bind/--pub.") from None
            self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self.pub_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            core = self.core
            core.terms = dataclasses.replace(core.terms, pub=self.pub_endpoint)
            self._router = router
            self._pub = pub
            if self.leadership is not None:
                from meshant.adapters.discovery import reachable

                # The endpoint standbys name in their not-leader hints: one peers can dial.
                self.leadership.start(reachable(self.endpoint), reachable(self.pub_endpoint))
                core.lead(core.term, self._hint())
            if self.leadership is not None:
                self._follow_lease(time.monotonic())  # a lone queen leads before it says ready
                core = self.core
            self._start_advertising()
            core.info = _Info(endpoint=self.endpoint, pub=self.pub_endpoint, pid=os.getpid(),
                              host=socket.gethostname(), advertised=self.advertiser is not None,
                              started=time.monotonic())
            if self._http is not None:
                self.observer.publish(core, time.monotonic(), self._wall_offset)
                self._http.start()
            self._ready.set()
            self._loop(router)
        finally:
            if self._http is not None:
                self._http.stop()
            if self.advertiser is not None:
                self.advertiser.close()  # unregistered: joiners see the queen go
            if self.leadership is not None:
                self.leadership.stop()  # the lease handed back: a standby leads at once
            router.close(0)
            pub.close()  # (its LINGER: 0, or the farewell's, set when it was sent)
            if self._auth is not None:
                self._auth.stop()
            if self._reads is not None:
                self._reads.close()
            if self.journal is not None:
                self.journal.close()
            self._waker.close()

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
        self.core.revoke(auth.grants, now)
        log.info("reloaded %d authorized keys", len(auth.grants))

    def _start_advertising(self) -> None:
        from meshant.adapters.discovery import Advertiser, advertise_interfaces, is_loopback

        tcp = self.endpoint.startswith("tcp://")
        on = self.config.advertise if self.config.advertise is not None else (
            tcp and not is_loopback(self.endpoint))
        if not on:
            return
        if not tcp:
            # ipc:// and inproc:// queens are reachable from this host only: nothing to
            # tell the network (and no interface to say it on).
            log.warning("not advertising %s: mDNS discovery needs a tcp:// endpoint",
                        self.endpoint)
            return
        ifaces = list(self.config.mdns_interfaces or ()) or advertise_interfaces(self.endpoint)
        self.advertiser = Advertiser(colony=self.config.colony, name=self.name,
                                     router=self.endpoint, pub=self.pub_endpoint,
                                     epoch=self.epoch,
                                     interfaces=ifaces or None,
                                     curve_key=self.curve[0].decode() if self.curve else "",
                                     role=self.role, term=self.core.term)

    def _loop(self, router: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        hb_interval = self.config.hb_interval
        tick_every = min(0.05, hb_interval / 4)
        next_tick = time.monotonic()
        next_beat = next_tick
        next_keys = next_tick
        events_of: Callable[[int], int] = router.getsockopt  # type: ignore[assignment]
        EVENTS, POLLIN = _zio.EVENTS, _zio.POLLIN
        recv_frames = _zio.recv_frames
        curve = self.curve is not None
        turn_max = TURN_MESSAGES_FSYNC if (
            self.journal is not None and self.config.durability == "power") else TURN_MESSAGES
        leadership = self.leadership
        obs = self.observer
        reads = self._reads
        while not self._stop.is_set():
            if leadership is not None:
                # Before anything is read: a queen that slept past its lease (SIGSTOP,
                # a long pause) steps down before it acts on a single message.
                self._follow_lease(time.monotonic())
            core = self.core
            receive = core.receive
            now = time.monotonic()
            answers = reads.answers if reads is not None else None
            wait = 0.0 if answers else max(0.0, min(next_tick, next_beat) - now)
            events = dict(poller.poll(int(wait * 1000)))
            if leadership is not None:
                self._follow_lease(time.monotonic())  # (the poll may have slept through a pause)
                if self.core is not core:
                    continue
            if router in events:
                now = time.monotonic()
                # Drain what is there without blocking, a few messages a turn: the
                # turn's end sends what they decided (assignments go out while the
                # queen reads on), so under load the colony's stages overlap instead
                # of passing one big batch around in lockstep (docs/performance.md).
                # Asking EVENTS (1.5 µs) is cheaper than the exception a NOBLOCK recv
                # raises (4 µs); the first message is there, the poll saw it.
                for i in range(turn_max):
                    if i and not events_of(EVENTS) & POLLIN:
                        break
                    if curve:
                        frames, key = _zio.recv_frames_key(router)
                    else:
                        frames, key = recv_frames(router), None
                    try:
                        receive(frames, key, now)
                    except Exception:
                        # A bug met by one message must not take the colony down with
                        # it: that message is dropped, loudly, and the queen serves on.
                        core.counters["internal_errors"] += 1
                        log.exception("internal error handling a message (dropped); "
                                      "please report it")
            if self._waker.fd in events:
                self._waker.drain()
            now = time.monotonic()
            if answers:
                self._answered(core, answers, now)
            if now >= next_tick:
                next_tick = now + tick_every
                if now >= next_keys:
                    next_keys = now + 2.0
                    self._check_keys(now)
                core.tick(now)
            if now >= next_beat:
                next_beat = now + hb_interval
                if self._roles.leading:
                    core.beat(now)
            if self.core is not core:
                continue  # stepped down meanwhile: nothing of the old core goes out
            core.end_turn(now)
            if core.out.actions:
                self._carry_out(core.take())
            if obs is not None and now >= obs.next:
                obs.publish(core, now, self._wall_offset)
        if self._roles.leading:
            self.core.farewell(time.monotonic())
            self._carry_out(self.core.take())
            # The farewell must get out (a busy machine's I/O thread may take a while).
            self._pub.setsockopt(zmq.LINGER, 1000)

    @staticmethod
    def _answered(core: QueenCore, answers: Any, now: float) -> None:
        """Give the core the journal's answers to its reads (the start of a turn)."""
        while answers:
            token, value, error = answers.popleft()
            if token == 0:
                if error is None:
                    core.fetched_names(value)
                continue
            core.fetched(token, value, now, error)

    def _submitted(self, task_id: str) -> float | None:
        task = self.core.scheduler.tasks.get(task_id)
        return task.submitted + self._wall_offset if task is not None else None

    def _carry_out(self, actions: list[Any]) -> None:
        """Do what the core decided, in order (:func:`meshant.core.queen.carry.carry_out`:
        a journal record before what follows it, each run of records in one transaction)."""
        if self.core.traces:
            for a in actions:
                if a.__class__ is Send and a.msg.kind in _ASSIGNS:
                    tracing.assign_spans(a.msg, self._submitted)
        carry_out(actions, self._port, self.core.counters)


class _QueenPort:
    """The queen core's actions on this queen's sockets and journal."""

    __slots__ = ("queen",)

    def __init__(self, queen: Queen) -> None:
        self.queen = queen

    def send(self, identity: bytes, frames: list[bytes], msg: p.Message) -> bool:
        try:
            _zio.send_frames(self.queen._router, frames, identity)
        except zmq.ZMQError:
            # Peer gone (ROUTER_MANDATORY) or its pipe full: never block the loop.
            return False
        return True

    def publish(self, topic: bytes, frames: list[bytes]) -> None:
        self.queen._pub.send_multipart([topic, *frames])

    def read(self, read: Read) -> None:
        if self.queen._reads is not None:
            self.queen._reads.ask(read)

    def commit(self, commit: Commit) -> bool:
        q = self.queen
        try:
            t0 = time.perf_counter()
            commit_all(q.journal, commit.actions, q._wall_offset)
            if q.observer is not None and any(r.__class__ is Record for r in commit.actions):
                q.observer.wrote(time.perf_counter() - t0)
        except JournalError as e:
            if q.leadership is None:
                raise
            # Deposed, or the database away past the lease: nothing after this record
            # may leave. The journal holds the truth; the leader rebuilds.
            q.leadership.step_down(str(e), q.core.term)
            q._follow_lease(time.monotonic())
            return False
        return True

    def unencodable(self, msg: p.Message, error: p.ProtocolError) -> None:
        log.warning("cannot encode %s for a peer: %s", msg.kind, error)


__all__ = ["ACTIVE", "DRAINING", "Queen", "QueenConfig"]
