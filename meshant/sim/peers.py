"""Foragers and clients in the simulator: the real sans-IO sessions
(:class:`~meshant.core.peers.forager_session.ForagerSession` or
:class:`~meshant.core.peers.client_session.ClientSession`) driven by the real link
(:class:`~meshant.core.peers.link.PeerLink`), the actors' own, over the simulated
network and clock: a peer here owns only its simulated connection and process. A
forager's handlers are simulated: they take a while, stream partial results, ask
questions, spawn graph nodes, fail when told to; a durable one makes its steps, sleeps,
sub-task calls and durable asks through the actors' own
:class:`~meshant.actors.durable.Steps`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from meshant import protocol as p
from meshant.actors.durable import Diverged, Steps, Suspend, diverged_body, error_record
from meshant.actors.durable import replayed as replayed_step
from meshant.core.memory.model import RESYNC, MemoryReplica
from meshant.core.peers import client_session as cs_
from meshant.core.peers import forager_session as fs_
from meshant.core.peers import peer_session as ses
from meshant.core.peers.choice import QueenChoice
from meshant.core.peers.client_session import ClientSession
from meshant.core.peers.forager_session import ForagerSession
from meshant.core.peers.link import FLUSH_MAX, Item, PeerLink, Role
from meshant.core.tasks.model import graph_node_of
from meshant.sim.ledger import Kept, Ledger, Run, Submission, Violation
from meshant.sim.queen import WALL
from meshant.sim.world import Clock, Conn, Net, ProcessClock

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
    """What foragers and clients share: the process (its life, a pause, a crash) and the
    simulated connection that is its link's port. Everything the peer says to the queen,
    and how it reads what comes back, is the real :class:`~meshant.core.peers.link.
    PeerLink`'s, as in the actors."""

    role = "peer"
    hello_extra: dict[str, Any] = {}  # more hello fields (a test's)

    def __init__(self, name: str, *, clock: Clock | ProcessClock, net: Net, ledger: Ledger,
                 rng: random.Random, queens: list[str], log: Callable[[str], None],
                 memory: bool = False) -> None:
        self.name = name
        self.clock = clock
        self.net = net
        self.ledger = ledger
        self.rng = rng
        self.queens = queens
        self.log = log
        self.gen = 0  # the process's life: a crash ends it, a restart is the next
        self.alive = False
        self.paused_until = 0.0
        self.conn: Conn | None = None
        # Bumped whenever the process stops hearing its queen for a while: a pause, a
        # crash, a fresh connection (what an invariant about timely delivery excuses).
        self.disturbed = 0
        self._again_at = -1.0
        self.subscribed = ""  # the queen whose PUB this peer hears
        self._wake_at = float("inf")
        self.memory = memory
        self.replica: MemoryReplica | None = MemoryReplica() if memory else None
        self.heard: dict[str, int] = {}  # broadcasts heard, by id
        self.refused: str | None = None
        self.link = self._link()

    def _link(self) -> PeerLink:
        mem = SimMemory(self) if self.memory else None
        return PeerLink(self.role_session(), _SimPort(self), self.name,
                        QueenChoice(list(self.queens), check=self._known),
                        rng=random.Random(self.rng.random()), memory=mem,
                        flush_limit=self.flush_limit())

    def _known(self, queen: str) -> str:
        if queen not in self.queens:
            raise ValueError(f"no queen {queen!r}")
        return queen

    @property
    def sess(self) -> ses.PeerSession:
        return self.link.sess

    @property
    def queen(self) -> str:
        return self.link.choice.queen

    # -- life -----------------------------------------------------------------------------

    def start(self) -> None:
        self.gen += 1
        self.alive = True
        self.refused = None
        self.paused_until = 0.0
        self._wake_at = float("inf")
        if self.replica is not None:
            self.replica = MemoryReplica()
        self.fresh()
        self.link = self._link()  # a new process: its sessions and queen list afresh
        self.link.observe = self.observe
        self.link.start(self.clock.now)  # the first hello, before any timer (as the actors)
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
        self.disturbed += 1
        if self.conn is not None:
            self.net.close(self.conn)
        self.net.unsubscribe(self)
        self.subscribed = ""

    def pause(self, seconds: float) -> None:
        if not self.alive:
            return
        self.log(f"{self.name} is paused for {seconds:.2f} s")
        self.disturbed += 1
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
        self.link.receive(frames, self.clock.now)
        self.do()
        self.pump()

    def receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        gen = self.gen
        self.soon(gen, lambda: self._receive_pub(queen, topic, frames))

    def _receive_pub(self, queen: str, topic: bytes, frames: list[bytes]) -> None:
        if queen != self.subscribed:
            return  # (the PUB of a queen this peer has left)
        self.link.receive_pub(topic, frames, self.clock.now)
        self.do()
        self.pump()

    def send_frames(self, frames: list[bytes], item: Item) -> bool:
        """The port's send: on the current connection, a copy now and then kept to
        arrive again late (a duplicate the network makes)."""
        if self.conn is None:
            return False
        self.sending(item)
        return self.net.send_up(self.conn, frames,
                                keep_late=_again(item) and self.rng.random() < 0.02)

    # -- the turn -------------------------------------------------------------------------

    def pump(self) -> None:
        """After any event: the timers, what to send, then wake at the next deadline."""
        if not self.alive or self.clock.now < self.paused_until:
            return
        now = self.clock.now
        link = self.link
        link.tick(now)
        self.do()
        if link.flush(now):
            # A backlog goes out slice by slice, a turn at a time (as in the actors).
            self._again(0.0)
        elif link.active and link.role.pending:
            self._again(0.05)  # the pipe was full: try again soon (as the actors do)
        self.do()
        self._schedule()

    def _again(self, delay: float) -> None:
        """Pump again after ``delay`` (once: a pump already due soon is enough)."""
        when = self.clock.now + delay
        if self._again_at <= when and self._again_at >= self.clock.now:
            return
        self._again_at = when
        gen = self.gen
        self.clock.after(delay, lambda: self.soon(gen, self.pump))

    def _schedule(self) -> None:
        """Wake at the link's next deadline (once: a later wake is not scheduled twice)."""
        t = self.link.next_wakeup()
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

    def role_session(self) -> Role:
        raise NotImplementedError

    def sending(self, item: Item) -> None:
        """What this peer is about to send (the invariants about what a peer says)."""

    def flush_limit(self) -> int:
        return FLUSH_MAX

    def observe(self, msg: p.Message) -> None:
        """Every message from the queen, before the link hands it on (the invariants)."""

    def do(self) -> None:
        """Carry out the role session's actions."""

    def welcomed(self, first: bool) -> None:
        pass


class _SimPort:
    """The link's port for a simulated peer: the simulated network and clock."""

    __slots__ = ("peer",)

    def __init__(self, peer: SimPeer) -> None:
        self.peer = peer

    def send(self, frames: list[bytes], item: Item) -> bool:
        return self.peer.send_frames(frames, item)

    def wall(self) -> float:
        return self.peer.clock.now + self.peer.clock.skew

    def about(self) -> dict[str, Any]:
        peer = self.peer
        return {"host": "sim", "pid": peer.gen, "session": f"{peer.name}/{peer.gen}",
                **peer.hello_extra}

    def open(self, endpoint: str, why: str) -> None:
        peer = self.peer
        peer.disturbed += 1
        if peer.conn is not None:
            peer.net.close(peer.conn)
        peer.net.unsubscribe(peer)
        peer.subscribed = ""
        peer.conn = peer.net.connect(peer, endpoint)

    def moved(self) -> str | None:
        return None  # (no discovery in the simulator)

    def lost(self, why: str) -> None:
        self.peer.log(f"{self.peer.name}: {why}; reconnecting")

    def welcomed(self, first: bool, new_epoch: bool, pub: str) -> None:
        peer = self.peer
        peer.net.subscribe(peer, peer.queen)
        peer.subscribed = peer.queen
        peer.welcomed(first)

    def forgotten(self) -> None:
        pass

    def refused(self, code: str, message: str, body: dict[str, Any]) -> None:
        peer = self.peer
        peer.refused = f"{code}: {message}"
        peer.log(f"{peer.name} refused: {peer.refused}")
        peer.alive = False

    def waiting(self, waited: float) -> None:
        pass

    def broadcast(self, topic: str, msg: p.Message) -> None:
        peer = self.peer
        peer.heard[msg.id] = peer.heard.get(msg.id, 0) + 1
        if peer.heard[msg.id] > 1:
            peer.ledger.fail("broadcast-once", f"{peer.name} heard broadcast {msg.id} twice")

    def log(self, level: str, text: str) -> None:
        self.peer.log(text)


class SimMemory:
    """Colony memory as a simulated peer keeps it: the real replica, no callers."""

    __slots__ = ("peer",)

    def __init__(self, peer: SimPeer) -> None:
        self.peer = peer

    def _snapshot(self) -> None:
        self.peer.link.role.send(p.Message("mem.sync", {"op": "snapshot"}, to="queen"))

    def on_welcome(self, new_epoch: bool) -> None:
        r = self.peer.replica
        if r is not None and new_epoch:
            r.reset()
        self._snapshot()

    def on_update(self, update: dict[str, Any]) -> None:
        r = self.peer.replica
        if r is not None and r.apply(update) == RESYNC:
            self._snapshot()

    def on_queen_seq(self, seq: int) -> None:
        r = self.peer.replica
        if r is not None and r.behind(seq):
            self._snapshot()

    def on_reply(self, msg: p.Message) -> bool:
        r = self.peer.replica
        if r is None or msg.b.get("op") != "snap":
            return False
        if r.load(msg.b) == RESYNC:
            self._snapshot()
        return True

    def on_error(self, msg: p.Message) -> bool:
        return False


@dataclass(slots=True)
class HandlerRun:
    """A simulated handler at work."""

    start: fs_.Start
    uid: int
    asks: int = 0
    waiting: str | None = None  # the question it waits on
    stopped: bool = False
    steps: list[str] = field(default_factory=list)
    # A durable handler: its steps, its plan (what it does, in order), how far it got,
    # the positions the journal held as it started, a call waiting for its answer.
    durable: Steps | None = None
    plan: list[list[Any]] = field(default_factory=list)
    k: int = 0
    journaled: set[int] = field(default_factory=set)
    call: tuple[int, int, str] | None = None
    reply: tuple[dict[str, Any], dict[str, Any] | None] | None = None
    body: dict[str, Any] | None = None  # its end, when not the plain one


class _StepLink:
    """What a durable handler's steps send through: the forager session."""

    __slots__ = ("forager",)

    def __init__(self, forager: SimForager) -> None:
        self.forager = forager

    def send_message(self, msg: p.Message) -> None:
        self.forager.fs.send(msg)

    @property
    def features(self) -> frozenset[str]:
        return self.forager.sess.features


class SimForager(SimPeer):
    """A forager whose handlers are simulated (see :meth:`_plan`)."""

    role = "forager"

    def __init__(self, name: str, tools: list[str], slots: int, labels: dict[str, Any],
                 runs: Callable[[], int], **kw: Any) -> None:
        self.tools = tools
        self.slots = slots
        self.labels = labels
        self._uids = runs
        self.fs = ForagerSession(tools, slots, labels)
        self.handlers: dict[str, HandlerRun] = {}
        self.latest: dict[str, int] = {}  # assign id -> the run started for it last
        super().__init__(name, **kw)

    def crash(self) -> None:
        if self.alive:
            for h in self.handlers.values():  # (the process dies: so do its handlers)
                self.ledger.runs[h.uid].ended = self.net.clock.now
        super().crash()

    def fresh(self) -> None:
        self.fs = ForagerSession(self.tools, self.slots, self.labels)
        self.handlers = {}
        self.latest = {}

    def role_session(self) -> Role:
        return self.fs

    def sending(self, item: Item) -> None:
        """A final result answers an assignment with the run this process started for
        it last: never an older run's (one the queen no longer knows, kept for sending
        again, while a queen that forgot it assigned the same id anew)."""
        if not isinstance(item, p.Message) or item.kind not in ("task.result", "task.batch"):
            return
        items = item.b["results"] if item.kind == "task.batch" else [{**item.b,
                                                                       "ref": item.ref}]
        for b in items:
            result = b.get("result") if isinstance(b, dict) else None
            if b.get("partial") or "kind" in b or not isinstance(result, dict):
                continue
            run, latest = result.get("run"), self.latest.get(str(b.get("ref")))
            if isinstance(run, int) and latest is not None and run != latest:
                self.ledger.fail("latest-run-answers", f"{self.name} answers assignment "
                                 f"{b.get('ref')} with run {run}'s result, though it "
                                 f"started run {latest} for it since")

    def flush_limit(self) -> int:
        # The outbox in slices of 1, 2 or the real size (by the process's life, not the
        # rng, so seeds keep their schedules): batches cut at every place, in order.
        return (1, 2, FLUSH_MAX)[self.gen % 3]

    def observe(self, msg: p.Message) -> None:
        if msg.kind == "task.answer":
            request = str(msg.b.get("request"))
            asker, durable, _ = request.rpartition(".s")
            if durable and any(r.ref == msg.ref and r.task == asker
                               for r in self.ledger.runs.values()):
                return  # (a durable ask is named after its task and step)
            if not request.startswith(f"{msg.ref}.q"):  # (a request is named after its asker)
                self.ledger.fail("answer-to-asker", f"{self.name}: the answer to {request} "
                                 f"was sent to assignment {msg.ref}")

    def do(self) -> None:
        for a in self.fs.take():
            match a:
                case fs_.Start():
                    self._begin(a)
                case fs_.Stop(ref=ref):
                    h = self.handlers.get(ref)
                    if h is not None and not h.stopped:
                        h.stopped = True
                        run = self.ledger.runs[h.uid]
                        run.stopped = self.net.clock.now
                        self._later(h, self.rng.uniform(0.0, 0.02), self._finish)
                case fs_.Answered(ref=ref, request=request):
                    h = self.handlers.get(ref)
                    if h is not None and h.waiting == request:
                        h.waiting = None
                        self.ledger.answers += 1
                        self._later(h, self.rng.uniform(0.0, 0.01), self._step)
                case fs_.Reply(ref=ref, body=body, error=error):
                    for h in self.handlers.values():
                        if h.waiting == ref:
                            h.waiting = None
                            if h.call is not None:
                                h.reply = (body, error)
                            self._later(h, 0.001, self._step)
                case fs_.Leave():
                    self.crash()
                case fs_.Delivered(msg=msg):
                    self.ledger.kept_delivered(msg, self.name)

    # -- simulated handlers ---------------------------------------------------------------

    def _begin(self, start: fs_.Start) -> None:
        uid = self._uids()
        life = self.net.queens[self.queen]
        self.ledger.runs[uid] = Run(uid, start.task_id, start.attempt, self.name, start.ref,
                                    f"{self.queen}@{life.incarnation}",
                                    started=self.net.clock.now)
        h = HandlerRun(start, uid, steps=self._plan(start))
        payload = start.payload if isinstance(start.payload, dict) else {}
        if isinstance(payload.get("durable"), list):
            self._durable(h, payload)
        self.handlers[start.ref] = h
        self.latest[start.ref] = uid
        self.log(f"{self.name} runs {start.ref} (run {uid})")
        self._later(h, self.rng.uniform(0.0, 0.01), self._step)

    def _durable(self, h: HandlerRun, payload: dict[str, Any]) -> None:
        """A durable handler: its plan, and the real steps (replaying the records the
        assignment brought)."""
        task = h.start.task_id
        recorded = h.start.steps or []
        st = h.durable = Steps(_StepLink(self), h.start.ref, task, recorded,
                               wall=lambda: WALL + self.clock.skew + self.net.clock.now)
        h.plan = [list(x) for x in payload["durable"]]
        if recorded:
            self.ledger.replaying.add(task)
            if payload.get("diverge"):
                h.plan[0] = ["step", "changed"]  # (the handler as edited since)
        h.journaled = self.ledger.assigned_with.get((task, h.start.attempt), set())
        ledger = self.ledger

        def watch(pos: int, kind: str, name: str, occ: int, rec: Any) -> None:
            if isinstance(rec, dict) and kind == "step" and "error" not in rec:
                ledger.step_replayed(task, pos, rec.get("value"))
        st.watch = watch

    def _durable_step(self, h: HandlerRun) -> None:
        """The durable handler's next step (a Suspend or a divergence ends the run)."""
        st = h.durable
        assert st is not None
        task = h.start.task_id
        if h.k >= len(h.plan) and h.call is None:
            self._finish(h)
            return
        try:
            if h.call is not None:
                if h.reply is None:
                    return  # (its answer is not here yet)
                (pos, occ, name), (body, error) = h.call, h.reply
                h.call = h.reply = None
                if error is not None:
                    h.body = {"status": "error", "error": {
                        "type": "Refused", "message": str(error.get("message"))}}
                    self._finish(h)
                    return
                self.ledger.child(task, pos, str(body.get("child")))
                try:
                    st.answered(pos, occ, name, str(body.get("child")), body)
                except (Suspend, Diverged, Violation):
                    raise
                except Exception:
                    pass  # (the sub-task failed: this handler goes on)
            else:
                item = h.plan[h.k]
                h.k += 1
                if item[0] == "step":
                    def call() -> dict[str, Any]:
                        pos = st.replay.position - 1
                        value = {"run": h.uid, "pos": pos}
                        self.ledger.step_ran(task, pos, h.journaled, value)
                        return value
                    st.step(str(item[1]), call, (), {})
                elif item[0] == "sleep":
                    self.ledger.sleeps.setdefault((task, st.replay.position),
                                                  self.net.clock.now + float(item[1]))
                    st.sleep(float(item[1]))
                elif item[0] == "ask":
                    st.ask("go on?", None)
                elif item[0] == "call":
                    pos, occ, name, rec, _ = st.call("echo", {"n": 900 + h.k}, {},
                                                     lambda ref, child, body: self._call(
                                                         h, body))
                    if rec is not None:
                        try:
                            replayed_step(rec)
                        except Exception:
                            pass
                    else:
                        h.call = (pos, occ, name)
                        return
        except Suspend as s:
            h.body = {"status": "suspended", "wait": s.wait}
            self._finish(h)
            return
        except Diverged as d:
            h.body = diverged_body(d)
            self._finish(h)
            return
        except Violation:
            raise  # (a promise broken inside a step: the run's end, not the handler's)
        except Exception as e:
            h.body = {"status": "error", "error": error_record(e)}
            self._finish(h)
            return
        self._later(h, self.rng.uniform(0.001, 0.05), self._step)

    def _call(self, h: HandlerRun, body: dict[str, Any]) -> Future[dict[str, Any]]:
        msg = p.Message("task.call", body, ref=h.start.ref, to="queen")
        h.waiting = msg.id
        self.fs.send(msg)
        return Future()  # (its answer comes as a Reply: see do)

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
        if h.durable is not None and not h.stopped:
            self._durable_step(h)
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
        self.ledger.runs[h.uid].ended = self.net.clock.now
        payload = h.start.payload if isinstance(h.start.payload, dict) else {}
        if h.body is not None and not h.stopped:
            body: dict[str, Any] = h.body
        elif payload.get("fail"):
            body = {"status": "error", "error": {"type": "SimError",
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
        self.attached: dict[str, list[int]] = {}  # task -> sequence numbers seen
        # task -> the last update heard live: the queen's number, (attempt, n)
        self.live: dict[str, tuple[int, tuple[Any, Any]]] = {}
        # The requests whose callers were told they failed (queen-lost: check, then ask
        # again): one sent after that would be carried out behind its caller's back.
        self.failed: set[str] = set()
        self.cs = self._session(kw["rng"])
        super().__init__(name, **kw)

    @staticmethod
    def _session(rng: random.Random) -> ClientSession:
        return ClientSession(queen_wait=1e9, submit_timeout=1e9, retry_queue_full=True,
                             rng=random.Random(rng.random()))

    def fresh(self) -> None:
        self.cs = self._session(self.rng)

    def role_session(self) -> Role:
        return self.cs

    def sending(self, item: Item) -> None:
        if isinstance(item, p.Message) and item.id in self.failed:
            self.ledger.fail("failed-request-unsent", f"{self.name} sends {item.kind} "
                             f"{item.id} again after its caller was told it failed")

    # -- the workload's calls -------------------------------------------------------------

    def submit(self, capability: str, payload: Any, *, id: str | None = None,
               **options: Any) -> str:
        body = {"capability": capability, "payload": payload, **options}
        msg = p.Message("task.submit", body, frm=self.name, to="queen", ts=self.clock.now,
                        id=id)
        self.ledger.submissions[msg.id] = Submission(
            msg.id, self.name, capability, payload, options.get("priority", 50),
            options.get("key"), max_attempts=options.get("max_attempts", 3),
            retry_on=tuple(options.get("retry_on") or ()))
        self.log(f"{self.name} submits {msg.id} ({capability} {payload})")
        self.cs.submit(msg.id, p.binary.encode(msg), self.clock.now)
        self.pump()
        return msg.id

    def submit_graph(self, nodes: list[dict[str, Any]], id: str | None = None) -> str:
        msg = p.Message("graph.submit", {"nodes": nodes, "updates": True}, frm=self.name,
                        to="queen", ts=self.clock.now, id=id)
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

    def schedule(self, body: dict[str, Any]) -> None:
        """A ``schedule`` request (add, pause, remove...): sent until answered."""
        self.log(f"{self.name} schedule {body['op']} {body.get('name')}")
        self.cs.request(p.Message("schedule", body, frm=self.name, to="queen"))
        self.pump()

    def broadcast(self, topic: str, data: Any) -> None:
        self.cs.send(p.Message("broadcast", {"topic": topic, "data": data}, to="queen"))
        self.pump()

    def raw(self, frames: list[bytes]) -> None:
        """Garbage on this client's connection (the queen must answer and go on)."""
        if self.conn is not None and self.sess.active:
            self.net.send_up(self.conn, frames)

    # -- what arrives ---------------------------------------------------------------------

    def observe(self, msg: p.Message) -> None:
        kind, b = msg.kind, msg.b
        if kind in ("task.result", "task.progress"):
            self._update(kind, b)
        elif kind == "task.batch":
            for item in b["results"]:
                if isinstance(item, dict):
                    self._update(item.get("kind", "task.result"), item)
        elif kind == "task.update":
            self._attached(b)

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
                case cs_.RequestFailed(ref=ref):
                    self.failed.add(ref)
                case cs_.NodeUpdate(kind=kind, body=body):
                    if kind == "task.result" and not body.get("partial"):
                        self.log(f"{self.name} hears graph node {body['task']}: "
                                 f"{body.get('state')}")
                        where = graph_node_of(str(body["task"]))
                        if where is not None:
                            self.ledger.node_heard(*where)
                case cs_.GraphEvent(kind=kind, msg=msg):
                    if kind == "graph.node" and msg.b.get("state") != "running":
                        self.ledger.node_heard(msg.b["graph"], msg.b["node"])
                    elif kind == "graph.result":
                        got = self.ledger.graph_outcomes.setdefault(msg.b["graph"], [])
                        got.append(msg.b)
                        if len(got) > 1:
                            self.ledger.fail("one-outcome", f"graph {msg.b['graph']} ended "
                                             "twice")
                        self.ledger.graph_ended(msg.b)
                    elif kind == "error":
                        self.ledger.graph_outcomes.setdefault(msg.ref or "", []).append(msg.b)
                case cs_.Reply(kind="task.attached", body=body):
                    # A stream from this cursor starts (again, if this client attached before).
                    self.attached[body["task"]] = [body["after"]]
                case cs_.Delivered(msg=msg):
                    if msg.kind in ("msg", "note"):
                        self.ledger.kept_delivered(msg, self.name)
                    else:
                        k = self.ledger.kept.get(msg.b.get("message", ""))
                        if k is not None:
                            k.receipts.append(str(msg.b.get("status")))
                case _:
                    pass

    def answer_now(self, task_id: str, request: str) -> None:
        """Answer a question a person saw waiting (in status, the dashboard)."""
        if self.alive:
            self.cs.request(p.Message("task.answer", {"task": task_id, "request": request,
                                                      "value": "yes"}, to="queen"))
            self.pump()

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
