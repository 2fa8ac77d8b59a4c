"""Foragers and clients in the simulator: the real sans-IO sessions
(:class:`~meshant.core.peers.peer_session.PeerSession` beside a
:class:`~meshant.core.peers.forager_session.ForagerSession` or a
:class:`~meshant.core.peers.client_session.ClientSession`), driven as the actors drive them,
over the simulated network and clock. A forager's handlers are simulated: they take a
while, stream partial results, ask questions, spawn graph nodes, fail when told to.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshant import protocol as p
from meshant.core.memory.model import RESYNC, MemoryReplica
from meshant.core.peers import client_session as cs_
from meshant.core.peers import forager_session as fs_
from meshant.core.peers import peer_session as ses
from meshant.core.peers.client_session import ClientSession
from meshant.core.peers.forager_session import ForagerSession
from meshant.protocol.topics import HB_TOPIC, MEM_TOPIC, USER_PREFIX
from meshant.sim.ledger import Kept, Ledger, Run, Submission
from meshant.sim.world import Clock, Conn, Net

Item = p.Message | list[bytes]
# Messages a peer may send again, so the queen may get them twice (late copies of these
# are the simulator's duplicated messages): a re-sent submission, a result re-sent after
# a reconnect, a hello, a heartbeat.
RESENT = frozenset({"task.submit", "graph.submit", "task.result", "task.batch", "hello",
                    "hb", "task.accept"})


def _again(item: Item) -> bool:
    if isinstance(item, p.Message):
        return item.kind in RESENT
    return True  # encoded frames: a client's kept submission


class SimPeer:
    """What foragers and clients share: the session with the queen, the connection, the
    queen's endpoint (a list of queens, a standby's hint), the colony memory."""

    role = "peer"

    def __init__(self, name: str, *, clock: Clock, net: Net, ledger: Ledger,
                 rng: random.Random, queens: list[str], log: Callable[[str], None],
                 memory: bool = False) -> None:
        self.name = name
        self.clock = clock
        self.net = net
        self.ledger = ledger
        self.rng = rng
        self.queens = queens
        self.queen = queens[0]
        self.log = log
        self.gen = 0  # the process's life: a crash ends it, a restart is the next
        self.alive = False
        self.paused_until = 0.0
        self.conn: Conn | None = None
        self.sess = PeerSessionFactory.make(rng)
        self._wake_at = float("inf")
        self.replica: MemoryReplica | None = MemoryReplica() if memory else None
        self.heard: dict[str, int] = {}  # broadcasts heard, by id
        self.refused: str | None = None

    # -- life -----------------------------------------------------------------------------

    def start(self) -> None:
        self.gen += 1
        self.alive = True
        self.refused = None
        self.paused_until = 0.0
        self.sess = PeerSessionFactory.make(self.rng)
        self._wake_at = float("inf")
        if self.replica is not None:
            self.replica = MemoryReplica()
        self.fresh()
        self.conn = self.net.connect(self, self.queen)
        self.sess.start(self.clock.now)
        self.act()  # the first hello, before any timer (as the actors' loop does)
        self.pump()

    def fresh(self) -> None:
        """A new process: subclasses start their session afresh."""

    def revive(self) -> None:
        """Start again, unless alive (or refused for good)."""
        if not self.alive and self.refused is None:
            self.start()

    def crash(self) -> None:
        if not self.alive:
            return
        self.log(f"{self.name} crashes")
        self.alive = False
        if self.conn is not None:
            self.net.close(self.conn)
        self.net.unsubscribe(self)

    def pause(self, seconds: float) -> None:
        if not self.alive:
            return
        self.log(f"{self.name} is paused for {seconds:.2f} s")
        self.paused_until = self.clock.now + seconds
        gen = self.gen
        self.clock.at(self.paused_until, lambda: self.soon(gen, self.pump))

    def soon(self, gen: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` in this process (now, or when it resumes), if it is still alive."""
        if not self.alive or self.gen != gen:
            return
        if self.clock.now < self.paused_until:
            self.clock.at(self.paused_until, lambda: self.soon(gen, fn))
            return
        fn()

    # -- the network ----------------------------------------------------------------------

    def receive(self, conn: Conn, frames: list[bytes]) -> None:
        gen = self.gen
        self.soon(gen, lambda: self._receive(conn, frames))

    def _receive(self, conn: Conn, frames: list[bytes]) -> None:
        if conn is not self.conn:
            return  # an old connection's
        try:
            msg = p.binary.decode(frames)
        except p.ProtocolError as e:
            # As a real peer does (actors/_peer.py): the queen answers garbage that looks
            # like an IACP 1.1 envelope (a first byte "{") in that codec.
            self.log(f"{self.name}: bad message from the queen: {e}")
            return
        self.sess.heard(self.clock.now)
        if msg.kind == "welcome":
            if msg.ref == self.sess.hello_id:
                self.sess.on_welcome(msg.ref, msg.b, self.clock.now)
        elif msg.kind == "error":
            self._error(msg)
        elif msg.kind == "hb":  # a farewell, sent directly too
            if self.sess.active:
                self.sess.on_queen_beat(msg.b.get("epoch"), self.clock.now)
        elif msg.kind == "mem.sync" and self.replica is not None:
            self._memory(msg.b)
        else:
            self.on_message(msg)
        self.pump()

    def _error(self, msg: p.Message) -> None:
        b = msg.b
        if b["code"] == "not-registered":
            self.forgotten(msg.ref)
        if self.sess.on_error(msg.ref, b["code"], b["message"], b.get("retry_after"),
                              self.clock.now, b.get("leader")):
            return
        self.on_error(msg)

    def receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        gen = self.gen
        self.soon(gen, lambda: self._receive_pub(queen, topic, frames))

    def _receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        if queen != self.queen:
            return
        msg = p.binary.decode(frames)
        if topic == HB_TOPIC:
            if self.sess.active:
                self.sess.on_queen_beat(msg.b.get("epoch"), self.clock.now)
                seq = msg.b.get("mem_seq")
                if self.replica is not None and isinstance(seq, int) and (
                        self.replica.behind(seq)):
                    self._send(p.Message("mem.sync", {"op": "snapshot"}, to="queen"))
        elif topic == MEM_TOPIC and self.replica is not None:
            self._memory(msg.b)
        elif topic.startswith(USER_PREFIX):
            self.heard[msg.id] = self.heard.get(msg.id, 0) + 1
            if self.heard[msg.id] > 1:
                self.ledger.fail("broadcast-once", f"{self.name} heard broadcast {msg.id} "
                                 "twice")
        self.pump()

    def _memory(self, b: dict[str, Any]) -> None:
        assert self.replica is not None
        if b.get("op") == "snap":
            r = self.replica.load(b)
        elif b.get("op") == "update":
            r = self.replica.apply(b)
        else:
            return
        if r == RESYNC:
            self._send(p.Message("mem.sync", {"op": "snapshot"}, to="queen"))

    def _send(self, item: Item) -> bool:
        """Send at once on the current connection (a hello, a heartbeat)."""
        if self.conn is None:
            return False
        frames = item if isinstance(item, list) else self._encode(item)
        self.net.send_up(self.conn, frames, keep_late=_again(item) and self.rng.random() < 0.02)
        self.sess.last_send = self.clock.now
        return True

    def _encode(self, msg: p.Message) -> list[bytes]:
        if not msg.frm:
            msg.frm = self.name
        if not msg.ts:
            msg.ts = self.clock.now
        frames: list[bytes] = p.binary.encode(msg)
        if max(len(f) for f in frames) > self.sess.max_message:
            raise p.LocalProtocolError("too-large", f"a {msg.kind} over the queen's limit")
        return frames

    # -- carrying out the sessions' decisions ---------------------------------------------

    def pump(self) -> None:
        """After any event: the session's actions, the timers, what to send."""
        if not self.alive or self.clock.now < self.paused_until:
            return
        now = self.clock.now
        self.sess.tick(now, self.busy())
        self.act()
        self.on_timers(now)
        if self.sess.active:
            self.flush(now)
        self.act()
        self._schedule()

    def act(self) -> None:
        sess = self.sess
        for a in sess.take():
            match a:
                case ses.Beat():
                    if self._send(p.Message("hb", self.hb_body(), to="queen")):
                        sess.sent(self.clock.now, beat=True)
                case ses.SayHello(fresh_connection=fresh):
                    if fresh or self.conn is None or self.conn.queen != self.queen:
                        self._reconnect()
                    hello = p.Message("hello", self.hello_body(), frm=self.name, to="queen",
                                      ts=self.clock.now)
                    self._send(hello)
                    sess.hello_sent(hello.id, self.clock.now)
                case ses.Redirect(leader=leader):
                    if leader and leader in self.queens:
                        self.queen = leader
                    else:
                        self.queen = self.queens[(self.queens.index(self.queen) + 1)
                                                 % len(self.queens)]
                case ses.Welcomed(first=first, new_epoch=new_epoch):
                    self.net.subscribe(self, self.queen)
                    if self.replica is not None:
                        if new_epoch:
                            self.replica.reset()
                        self._send(p.Message("mem.sync", {"op": "snapshot"}, to="queen"))
                    self.welcomed(first)
                case ses.Lost(why=why):
                    self.log(f"{self.name}: {why}; reconnecting")
                    self._reconnect()
                    self.lost(why)
                case ses.Refused(code=code, message=message):
                    self.refused = f"{code}: {message}"
                    self.log(f"{self.name} refused: {self.refused}")
                    self.alive = False
                case _:
                    pass

    def _reconnect(self) -> None:
        if self.conn is not None:
            self.net.close(self.conn)
        self.net.unsubscribe(self)
        self.conn = self.net.connect(self, self.queen)

    def flush(self, now: float) -> None:
        for _ in range(100_000):  # (a network without full pipes: until all went)
            items = self.outgoing(now)
            if not items:
                return
            for item in items:
                try:
                    frames = item if isinstance(item, list) else self._encode(item)
                except p.ProtocolError as e:
                    self.unencodable(item, e)
                    continue
                assert self.conn is not None
                self.net.send_up(self.conn, frames,
                                 keep_late=_again(item) and self.rng.random() < 0.02)
                self.sess.last_send = now
                self.sent(item, now)

    def _schedule(self) -> None:
        """Wake at the sessions' next deadline (once: a later wake is not scheduled twice)."""
        t = min(self.sess.next_deadline(self.busy()), self.next_timer())
        if t >= self._wake_at and self._wake_at > self.clock.now:
            return
        if t == float("inf"):
            return
        self._wake_at = t
        gen = self.gen

        def wake() -> None:
            if self._wake_at == t:
                self._wake_at = float("inf")
            self.soon(gen, self.pump)
        self.clock.at(t, wake)

    # -- what subclasses say --------------------------------------------------------------

    def hello_body(self) -> dict[str, Any]:
        return {"role": self.role, "name": self.name, "versions": [2], "codecs": ["msgpack"],
                "features": list(p.negotiation.FEATURES), "host": "sim", "pid": self.gen,
                "session": f"{self.name}/{self.gen}"}

    def hb_body(self) -> dict[str, Any]:
        return {}

    def busy(self) -> bool:
        return False

    def next_timer(self) -> float:
        return float("inf")

    def on_timers(self, now: float) -> None:
        pass

    def welcomed(self, first: bool) -> None:
        pass

    def lost(self, why: str) -> None:
        pass

    def forgotten(self, ref: str | None) -> None:
        pass

    def on_message(self, msg: p.Message) -> None:
        pass

    def on_error(self, msg: p.Message) -> None:
        pass

    def outgoing(self, now: float) -> list[Item]:
        return []

    def sent(self, item: Item, now: float) -> None:
        pass

    def unencodable(self, item: Item, e: p.ProtocolError) -> None:
        pass


class PeerSessionFactory:
    """Peer sessions with their randomness from the simulator's seed."""

    @staticmethod
    def make(rng: random.Random) -> ses.PeerSession:
        return ses.PeerSession(rng=random.Random(rng.random()))


@dataclass(slots=True)
class HandlerRun:
    """A simulated handler at work."""

    start: fs_.Start
    uid: int
    asks: int = 0
    waiting: str | None = None  # the question it waits on
    stopped: bool = False
    steps: list[str] = field(default_factory=list)


class SimForager(SimPeer):
    """A forager whose handlers are simulated (see :meth:`_plan`)."""

    role = "forager"

    def __init__(self, name: str, tools: list[str], slots: int, labels: dict[str, Any],
                 runs: Callable[[], int], **kw: Any) -> None:
        super().__init__(name, **kw)
        self.tools = tools
        self.slots = slots
        self.labels = labels
        self._uids = runs
        self.fs = ForagerSession(tools, slots, labels)
        self.handlers: dict[str, HandlerRun] = {}

    def fresh(self) -> None:
        self.fs = ForagerSession(self.tools, self.slots, self.labels)
        self.handlers = {}

    def hello_body(self) -> dict[str, Any]:
        return {**super().hello_body(), **self.fs.hello_fields()}

    def hb_body(self) -> dict[str, Any]:
        return self.fs.hb_body()

    def busy(self) -> bool:
        return self.fs.busy

    def next_timer(self) -> float:
        return self.fs.next_deadline()

    def on_timers(self, now: float) -> None:
        mon = self.sess.monitor
        patience = mon.timeout if mon is not None else 5 * self.sess.hb_interval
        self.fs.tick(now, patience, self.sess.active)
        self.do()

    def welcomed(self, first: bool) -> None:
        self.fs.welcomed(first, self.sess.welcome.get("updates"))

    def lost(self, why: str) -> None:
        self.fs.queen_lost()

    def outgoing(self, now: float) -> list[Item]:
        self.fs.features = self.sess.features
        # The outbox in slices of 1, 2 or the real size (by the process's life, not the
        # rng, so seeds keep their schedules): batches cut at every place, in order.
        return list(self.fs.flush(now, (1, 2, fs_.FLUSH_MAX)[self.gen % 3]))

    def sent(self, item: Item, now: float) -> None:
        if isinstance(item, p.Message):
            self.fs.sent(item, now)

    def unencodable(self, item: Item, e: p.ProtocolError) -> None:
        if isinstance(item, p.Message):
            self.fs.unencodable(item, e.code, e.message)

    def on_message(self, msg: p.Message) -> None:
        now = self.clock.now
        fs = self.fs
        if msg.kind == "task.assign":
            fs.assign(msg.id, msg.b, None, now)
        elif msg.kind == "task.assigns":
            fs.assigns(msg.b["assigns"], now)
        elif msg.kind == "task.cancel":
            fs.cancel(msg.ref)
        elif msg.kind == "task.answer":
            request = str(msg.b.get("request"))
            if not request.startswith(f"{msg.ref}.q"):  # (a request is named after its asker)
                self.ledger.fail("answer-to-asker", f"{self.name}: the answer to {request} "
                                 f"was sent to assignment {msg.ref}")
            fs.answer(msg.ref, msg.b.get("request"), msg.b.get("value"))
        elif msg.kind == "graph.spawned":
            fs.reply(msg.ref, msg.b)
        elif msg.kind == "ctl.drain":
            if fs.drain():
                self._send(p.Message("hb", fs.hb_body(), to="queen"))
        elif msg.kind in ("msg", "note"):
            self.ledger.kept_delivered(msg, self.name)
        self.do()

    def on_error(self, msg: p.Message) -> None:
        self.fs.error(msg.ref, msg.b)
        self.do()

    def do(self) -> None:
        for a in self.fs.take():
            match a:
                case fs_.Start():
                    self._begin(a)
                case fs_.Stop(ref=ref):
                    h = self.handlers.get(ref)
                    if h is not None and not h.stopped:
                        h.stopped = True
                        self._later(h, self.rng.uniform(0.0, 0.02), self._finish)
                case fs_.Answered(ref=ref, request=request):
                    h = self.handlers.get(ref)
                    if h is not None and h.waiting == request:
                        h.waiting = None
                        self.ledger.answers += 1
                        self._later(h, self.rng.uniform(0.0, 0.01), self._step)
                case fs_.Reply(ref=ref):
                    for h in self.handlers.values():
                        if h.waiting == ref:
                            h.waiting = None
                            self._later(h, 0.001, self._step)
                case fs_.Leave():
                    self.crash()

    # -- simulated handlers ---------------------------------------------------------------

    def _begin(self, start: fs_.Start) -> None:
        uid = self._uids()
        life = self.net.queens[self.queen]
        self.ledger.runs[uid] = Run(uid, start.task_id, start.attempt, self.name, start.ref,
                                    f"{self.queen}@{life.incarnation}")
        h = HandlerRun(start, uid, steps=self._plan(start))
        self.handlers[start.ref] = h
        self.log(f"{self.name} runs {start.ref} (run {uid})")
        self._later(h, self.rng.uniform(0.0, 0.01), self._step)

    def _plan(self, start: fs_.Start) -> list[str]:
        payload = start.payload if isinstance(start.payload, dict) else {}
        steps = ["partial"] * int(payload.get("partials", 0))
        if payload.get("ask"):
            steps.insert(self.rng.randint(0, len(steps)), "ask")
        if payload.get("spawn"):
            steps.append("spawn")
        if self.rng.random() < 0.3:
            steps.insert(0, "progress")
        steps.append("finish")
        return steps

    def _later(self, h: HandlerRun, delay: float, fn: Callable[[HandlerRun], None]) -> None:
        gen = self.gen
        self.clock.after(delay, lambda: self.soon(gen, lambda: self._current(h, fn)))

    def _current(self, h: HandlerRun, fn: Callable[[HandlerRun], None]) -> None:
        if self.handlers.get(h.start.ref) is h:
            fn(h)
            self.pump()

    def _step(self, h: HandlerRun) -> None:
        if h.waiting is not None:
            return
        if h.stopped or not h.steps:
            self._finish(h)
            return
        step = h.steps.pop(0)
        ref = h.start.ref
        payload = h.start.payload if isinstance(h.start.payload, dict) else {}
        if step == "finish":
            duration = float(payload.get("seconds", self.rng.expovariate(1 / 0.05)))
            self._later(h, min(duration, 8.0), self._finish)
            return
        if step == "partial":
            if "progress" in self.sess.features:
                run = self.ledger.runs[h.uid]
                self.fs.send(p.Message("task.result", {"partial": True, "value": {
                    "run": h.uid, "i": run.partials}}, ref=ref, to="queen"))
                run.partials += 1
                if h.uid % 3 == 0:
                    # A streamer (a third of the runs, by run, not by the rng): a
                    # progress report after each partial, and its updates in one burst,
                    # so they leave in batches (batch.progress).
                    self.fs.send(p.Message("task.progress", {"fraction": 0.5}, ref=ref,
                                           to="queen"))
        elif step == "progress":
            if "progress" in self.sess.features:
                self.fs.send(p.Message("task.progress", {"fraction": 0.5}, ref=ref, to="queen"))
        elif step == "ask":
            h.asks += 1
            request = f"{ref}.q{h.asks}"
            h.waiting = request
            self.fs.send(p.Message("task.ask", {"request": request, "prompt": "go on?",
                                                "timeout": 3.0}, ref=ref, to="queen"))
            self._later(h, 3.0, lambda h: self._ask_timeout(h, request))
            return
        elif step == "spawn":
            msg = p.Message("graph.spawn", {"nodes": payload["spawn"]}, ref=ref, to="queen")
            h.waiting = msg.id
            self.fs.send(msg)
            self._later(h, 3.0, lambda h: self._reply_timeout(h, msg.id))
            return
        delay = self.rng.uniform(0.001, 0.03)
        if h.uid % 3 == 0 and step == "partial" and h.steps and h.steps[0] == "partial":
            self._step(h)
            return
        self._later(h, delay, self._step)

    def _ask_timeout(self, h: HandlerRun, request: str) -> None:
        if h.waiting == request:  # no answer: withdraw it and go on
            h.waiting = None
            self.fs.send(p.Message("task.ask", {"request": request, "withdraw": True},
                                   ref=h.start.ref, to="queen"))
            self._step(h)

    def _reply_timeout(self, h: HandlerRun, msg_id: str) -> None:
        if h.waiting == msg_id:
            h.waiting = None
            self._step(h)

    def _finish(self, h: HandlerRun) -> None:
        if self.handlers.get(h.start.ref) is not h:
            return
        del self.handlers[h.start.ref]
        payload = h.start.payload if isinstance(h.start.payload, dict) else {}
        if payload.get("fail"):
            body: dict[str, Any] = {"status": "error", "error": {"type": "SimError",
                                                                 "message": "told to fail"}}
            if payload.get("retry"):  # the handler's own retry_on
                body["error"]["retry"] = True
        else:
            body = {"status": "ok", "result": {"run": h.uid, "task": h.start.task_id,
                                               "attempt": h.start.attempt,
                                               "out": payload.get("n")}}
        self.fs.finished(h.start.ref, h.start.run, body)


class SimClient(SimPeer):
    """A client: submits what the workload says, answers questions, follows tasks."""

    role = "client"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.cs = ClientSession(queen_wait=1e9, submit_timeout=1e9, retry_queue_full=True,
                                rng=random.Random(self.rng.random()))
        self.attached: dict[str, list[int]] = {}  # task -> sequence numbers seen
        # task -> the last update heard live: the queen's number, (attempt, n)
        self.live: dict[str, tuple[int, tuple[Any, Any]]] = {}

    def fresh(self) -> None:
        self.cs = ClientSession(queen_wait=1e9, submit_timeout=1e9, retry_queue_full=True,
                                rng=random.Random(self.rng.random()))

    # -- the workload's calls -------------------------------------------------------------

    def submit(self, capability: str, payload: Any, **options: Any) -> str:
        body = {"capability": capability, "payload": payload, **options}
        msg = p.Message("task.submit", body, frm=self.name, to="queen", ts=self.clock.now)
        self.ledger.submissions[msg.id] = Submission(
            msg.id, self.name, capability, payload, options.get("priority", 50),
            options.get("key"), max_attempts=options.get("max_attempts", 3),
            retry_on=tuple(options.get("retry_on") or ()))
        self.log(f"{self.name} submits {msg.id} ({capability} {payload})")
        self.cs.submit(msg.id, p.binary.encode(msg), self.clock.now)
        self.pump()
        return msg.id

    def submit_graph(self, nodes: list[dict[str, Any]]) -> str:
        msg = p.Message("graph.submit", {"nodes": nodes, "updates": True}, frm=self.name,
                        to="queen", ts=self.clock.now)
        self.ledger.graphs[msg.id] = self.name
        self.log(f"{self.name} submits graph {msg.id} ({len(nodes)} nodes)")
        self.cs.submit_graph(msg.id, p.binary.encode(msg), self.clock.now)
        self.pump()
        return msg.id

    def cancel(self, task_id: str) -> None:
        sub = self.ledger.submissions.get(task_id)
        if sub is not None:
            sub.cancelled = True
        self.log(f"{self.name} cancels {task_id}")
        self.cs.send(p.Message("task.cancel", {"task": task_id}, to="queen"))
        self.pump()

    def attach(self, task_id: str, after: int) -> None:
        self.cs.request(p.Message("task.attach", {"task": task_id, "after": after},
                                  to="queen"))
        self.pump()

    def tell(self, to: str, text: str) -> None:
        """A directed message with a receipt, perhaps to a name not connected."""
        msg = p.Message("msg", {"text": text}, frm=self.name, to=to, extra={"receipt": True})
        self.ledger.kept[msg.id] = Kept(msg.id, to, self.name, True)
        self.cs.send(msg)
        self.pump()

    def remember(self, key: str, value: Any) -> None:
        self.cs.send(p.Message("mem.sync", {"op": "set", "key": key, "value": value},
                               to="queen"))
        self.pump()

    def broadcast(self, topic: str, data: Any) -> None:
        self.cs.send(p.Message("broadcast", {"topic": topic, "data": data}, to="queen"))
        self.pump()

    def raw(self, frames: list[bytes]) -> None:
        """Garbage on this client's connection (the queen must answer and go on)."""
        if self.conn is not None and self.sess.active:
            self.net.send_up(self.conn, frames)

    # -- the session ----------------------------------------------------------------------

    def welcomed(self, first: bool) -> None:
        self.cs.welcomed(first)

    def lost(self, why: str) -> None:
        self.cs.lost(self.clock.now, why)

    def forgotten(self, ref: str | None) -> None:
        self.cs.forgotten(ref)

    def next_timer(self) -> float:
        return self.cs.next_deadline()

    def on_timers(self, now: float) -> None:
        self.cs.tick(now)
        self.do()

    def outgoing(self, now: float) -> list[Item]:
        return self.cs.flush(now)

    def on_message(self, msg: p.Message) -> None:
        kind, b = msg.kind, msg.b
        if kind in ("task.result", "task.progress", "task.ask"):
            self._update(kind, b)
        elif kind == "task.batch":
            for item in b["results"]:
                self._update(item.pop("kind", "task.result"), item)
        elif kind == "graph.result":
            if self.cs.graph_ended(b["graph"]):
                self.ledger.graph_outcomes.setdefault(b["graph"], []).append(b)
                if len(self.ledger.graph_outcomes[b["graph"]]) > 1:
                    self.ledger.fail("one-outcome", f"graph {b['graph']} ended twice")
        elif kind == "task.update":
            self._attached(b)
        elif kind in ("msg", "note"):
            self.ledger.kept_delivered(msg, self.name)
        elif kind == "msg.receipt":
            k = self.ledger.kept.get(b.get("message", ""))
            if k is not None:
                k.receipts.append(str(b.get("status")))
        elif kind == "task.attached":
            # A stream from this cursor starts (again, if this client attached before).
            self.attached[b["task"]] = [b["after"]]
            self.cs.answered(msg.ref or "")
        elif kind in ("task.answered", "status.reply", "inbox.reply", "graph.state",
                      "task.state"):
            self.cs.answered(msg.ref or "")
        self.do()

    def _update(self, kind: str, b: dict[str, Any]) -> None:
        seq = b.get("seq")
        if isinstance(seq, int) and (kind == "task.progress" or b.get("partial")):
            # A submitter's live updates come in the order the queen numbered them, and
            # an attempt's in the order its handler made them (the forager's ``n``),
            # batched or not; after a takeover one may come again, never an older one.
            task, n = b["task"], (b.get("attempt"), b.get("n"))
            last, last_n = self.live.get(task, (0, (None, None)))
            if seq < last or (n[0] == last_n[0] and isinstance(n[1], int)
                              and isinstance(last_n[1], int) and n[1] < last_n[1]):
                self.ledger.fail("live-order", f"{self.name} heard update {seq} (run "
                                 f"{n}) of {task} after {last} (run {last_n})")
            self.live[task] = (max(last, seq), n if n[1] is not None else last_n)
        if (not self.cs.update(kind, b) and str(b.get("task", ""))[:3] == "tg:"
                and kind == "task.result" and not b.get("partial")):
            self.log(f"{self.name} hears graph node {b['task']}: {b.get('state')}")

    def _attached(self, b: dict[str, Any]) -> None:
        seen = self.attached.setdefault(b["task"], [0])
        seq = b["seq"]
        if seq <= seen[-1]:
            self.ledger.fail("attach-order", f"{self.name} attached to {b['task']} saw "
                             f"update {seq} after {seen[-1]}")
        if seq != seen[-1] + 1:
            # Every update the queen numbered is kept (in its log or its journal), so a
            # stream that was not refused cursor-expired has no hole.
            self.ledger.fail("attach-gapless", f"{self.name} attached to {b['task']} saw "
                             f"update {seq} right after {seen[-1]}")
        seen.append(seq)

    def on_error(self, msg: p.Message) -> None:
        about = self.cs.error(msg.ref, dict(msg.b), self.clock.now)
        if about == "graph":
            self.ledger.graph_outcomes.setdefault(msg.ref or "", []).append(msg.b)
        elif about == "request":
            self.cs.answered(msg.ref or "")
        self.do()

    def do(self) -> None:
        for a in self.cs.take():
            match a:
                case cs_.Ended(task_id=task_id, body=body, error=error):
                    outcome = body if body is not None else {"refused": error}
                    state = body.get("state") if body is not None else (error or {}).get("code")
                    self.log(f"{self.name} hears {task_id}: {state}")
                    self.ledger.outcome(task_id, outcome)
                case cs_.Update(task_id=task_id, kind=kind, body=body):
                    if kind == "task.ask" and not body.get("withdraw"):
                        self._answer_later(task_id, body)
                case cs_.GiveUp(why=why):
                    self.ledger.fail("one-outcome", f"{self.name} gave up: {why}")

    def _answer_later(self, task_id: str, body: dict[str, Any]) -> None:
        gen = self.gen
        request = body.get("request")

        def answer() -> None:
            self.cs.request(p.Message("task.answer", {"task": task_id, "request": request,
                                                      "value": "yes"}, to="queen"))
            self.pump()
        # Mostly at once; now and then late, as a person does (after the forager that
        # asked may be gone, its task running again elsewhere).
        delay = self.rng.uniform(0.01, 1.0) if self.rng.random() < 0.8 else (
            self.rng.uniform(2.0, 8.0))
        self.clock.after(delay, lambda: self.soon(gen, answer))


__all__ = ["SimClient", "SimForager", "SimPeer"]
