"""One seeded run of the whole colony, and the shrinking of a failing one.

A seed fixes everything: its weather (:mod:`meshant.sim.weather`: which faults, the
network, the clocks, the journal's reads, durability, the queen's turn, the workload's
size), the colony's shape (one queen, or two sharing the journal with a lease), its
foragers and clients, the workload (priorities, slots, labels, cancels, idempotency
keys, task graphs with spawns, questions, messages to absent names, attach from a
cursor, broadcasts, colony memory), the faults and when they strike, and every delay on
the network. The same seed replays the same run, step for step.

Each of these draws from a random stream of its own (named after what it draws), so a
run shrunk to fewer faults keeps its workload, its network and its weather.
"""

from __future__ import annotations

import functools
import itertools
import random
import sqlite3
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshant import protocol as p
from meshant.core.queen.outbox import GraphRecord, Record, RecordMemory, Remember
from meshant.core.queen.router import QueenConfig
from meshant.core.schedules import model as schedule_model
from meshant.sim.ledger import Ledger, Violation
from meshant.sim.peers import SimClient, SimForager, SimPeer
from meshant.sim.queen import WALL, LeaseStore, SimQueen
from meshant.sim.weather import DEFAULT, Profile, Weather
from meshant.sim.world import Clock, Net, ProcessClock, garbage
from meshant.storage.journal import Journal

LOAD = 8.0  # seconds of submissions
FAULTS = 12.0  # faults strike until then
END = 240.0  # a run that has not settled by then has lost something
SETTLE = 3.0  # seconds of quiet after the last outcome, for late duplicates to show
SPIN = 100_000  # events at one instant that mean a busy loop
CANCEL_GRACE = 1.5  # seconds a cancel may take to reach the run of a cancelled task
# What a crash-at-commit dies right after: the next journal commit with a record of...
COMMIT_KINDS: tuple[tuple[str, type | None], ...] = (
    ("any kind", None), ("tasks", Record), ("graphs", GraphRecord),
    ("conversations", Remember), ("colony memory", RecordMemory))


@dataclass(frozen=True, slots=True)
class Fault:
    at: float
    kind: str
    target: str
    seconds: float = 0.0
    n: int = 0

    def __str__(self) -> str:
        extra = f" {self.seconds:.2f} s" if self.seconds else ""
        extra += f" after {self.n} actions" if self.kind == "crash-mid-turn" else ""
        if self.kind == "crash-at-commit":
            extra += f" after the next commit of {COMMIT_KINDS[self.n][0]}"
        if self.kind == "power-loss":
            extra += " (the disk keeps what was synced)"
        return f"{self.at:8.3f} fault: {self.kind} {self.target}{extra}"


@dataclass
class Result:
    seed: int
    violation: Violation | None = None
    tasks: int = 0
    steps: int = 0
    faults: list[Fault] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violation is None


def config(**kw: Any) -> QueenConfig:
    """The queens' settings in the simulator: short timeouts, small limits, so that a
    run of a few virtual seconds meets them."""
    base: dict[str, Any] = dict(hb_interval=0.5, hb_misses=4, assign_timeout=4.0,
                                no_forager_wait=4.0, max_message=64 * 1024,
                                retry_base=0.05, retry_cap=0.5, breaker_threshold=50,
                                journal_defer=0.1, max_graph_nodes=50, schedule_grace=1.0)
    base.update(kw)
    return QueenConfig(**base)


class Colony:
    """The processes of one run, and the workload and faults driving them."""

    def __init__(self, seed: int, disabled: frozenset[int] = frozenset(),
                 profile: Profile = DEFAULT) -> None:
        p.message.new_id.reset(f"{seed:x}-")
        self.seed = seed
        self.profile = profile
        weather = self.weather = Weather.draw(self.stream("weather"), profile)
        self.rng = self.stream("work")  # the workload's
        self.strike_rng = self.stream("strike")  # what a fault does as it strikes
        self.clock = Clock()
        self.trace: list[str] = []
        self.ledger = Ledger()
        # A long run (profile.hours): faults strike all along it, and it ends after it.
        self.span = profile.hours * 3600.0
        self.fault_end = max(FAULTS, self.span)
        self.end = END + self.span
        self.ledger.delay_slack = 2 * weather.skew + weather.drift * self.end + 1e-6
        self.ledger.skew_slack = 2 * weather.skew
        self.ledger.drift = weather.drift
        self.net = Net(self.clock, self.stream("net"), self.log, delay=weather.delay,
                       slow=weather.slow, pub_hwm=weather.pub_hwm, up_hwm=weather.up_hwm)
        shape, clocks, procs = self.stream("shape"), self.stream("clocks"), self.stream("procs")
        self.failover = shape.random() < profile.failover
        names = ["q1", "q2"] if self.failover else ["q1"]
        self.disk = sqlite3.connect(":memory:", isolation_level=None)
        store = LeaseStore(2.0, self.ledger) if self.failover else None
        self.store = store
        # Concurrency limits: from a stream of their own, as the delays.
        lrng = self.stream("limits")
        self.limits: list[str] = []
        if lrng.random() < profile.limits:
            self.limits.append(f"echo:payload.tenant={lrng.randint(1, 3)}")
            if lrng.random() < 0.5:
                self.limits.append(f"echo={lrng.randint(3, 6)}")
            if lrng.random() < 0.3:
                self.limits.append("*:payload.tenant=3")
            if lrng.random() < 0.5:
                # (A burst of 6 at 2/s is worth 3 s, longer than a restart takes: a queen
                # starting its buckets full would show, invariant rate-takeover.)
                self.limits.append(f"echo:payload.tenant={lrng.choice([2, 5, 10])}/s,"
                                   f"burst={lrng.choice([1, 2, 3, 6])}"
                                   + (",cost" if lrng.random() < 0.5 else ""))
        self.own_limits = bool(self.limits) and lrng.random() < 0.5
        self.tenants = lrng
        cfg = config(limits=tuple(self.limits))

        def own_clock() -> ProcessClock:
            d, k = weather.drift, weather.skew
            return ProcessClock(self.clock, rate=1.0 + clocks.uniform(-d, d),
                                offset=clocks.uniform(0.0, 1000.0) if d else 0.0,
                                skew=clocks.uniform(-k, k))
        self.queens = [SimQueen(n, cfg, clock=own_clock(), net=self.net, ledger=self.ledger,
                                rng=random.Random(procs.random()), disk=self.disk,
                                log=self.log, store=store, queens=names) for n in names]
        for q in self.queens:
            self.net.queens[q.name] = q
            q.read_delay, q.read_fail, q.turn = weather.read_delay, weather.read_fail, weather.turn
            # A power cut loses unsynced commits only of a journal on the queen's own disk
            # (SQLite); a shared PostgreSQL is another machine.
            q.durability = weather.durability if store is None else "power"
            q.sync_every = weather.sync_every
        uids = itertools.count(1)
        kw: dict[str, Any] = dict(net=self.net, ledger=self.ledger, queens=names,
                                  log=self.log)
        self.foragers: list[SimForager] = []
        for i in range(shape.randint(2, 4)):
            tools = ["echo"] + (["rare"] if i == 0 else [])
            labels = {"gpu": True} if i % 2 else {}
            self.foragers.append(SimForager(f"f{i}", tools, shape.randint(1, 3), labels,
                                            uids.__next__, rng=random.Random(procs.random()),
                                            memory=shape.random() < 0.5, clock=own_clock(),
                                            **kw))
        self.clients = [SimClient(f"c{i}", rng=random.Random(procs.random()), memory=i == 0,
                                  clock=own_clock(), **kw)
                        for i in range(shape.randint(1, 3))]
        # A name that is not connected when messages are sent to it, and joins later.
        self.mailboxes = [SimClient("mb0", rng=random.Random(procs.random()),
                                    clock=own_clock(), **kw)] if (
            shape.random() < profile.mailbox) else []
        self.scheduled: dict[str, dict[str, Any]] = {}  # schedules added: their adds
        self.paused: set[str] = set()  # schedules paused for a while
        self.faults = self._faults(disabled)
        self.ledger.on_outcome = self._outcome
        self.ledger.journaled_steps = self._journaled_steps
        self.log(weather.describe())

    def _journaled_steps(self, task: str) -> set[int]:
        """The step positions of ``task`` the journal (the disk) holds now."""
        try:
            rows = self.disk.execute("SELECT position FROM task_steps WHERE task_id=?",
                                     (task,)).fetchall()
        except sqlite3.Error:
            return set()  # (no journal made yet)
        return {int(r[0]) for r in rows}

    def stream(self, name: str) -> random.Random:
        """The random stream ``name`` of this seed (each concern draws from its own)."""
        return random.Random(f"{self.seed}/{name}")

    def log(self, text: str) -> None:
        self.trace.append(f"{self.clock.now:8.3f} {text}")

    # -- the plan -------------------------------------------------------------------------

    def _faults(self, disabled: frozenset[int]) -> list[Fault]:
        rng = self.stream("faults")
        kinds = [k for k, w in self.weather.weights if w]
        weights = [w for _, w in self.weather.weights if w]
        faults: list[Fault] = []
        for _ in range(rng.randint(*self.profile.faults) if kinds else 0):
            kind = rng.choices(kinds, weights)[0]
            at = rng.uniform(0.5, self.fault_end)
            if kind in ("kill-queen", "crash-mid-turn", "crash-at-commit", "pause-queen",
                        "power-loss"):
                target = rng.choice(self.queens).name
                seconds = rng.uniform(0.3, 6.0)
            elif kind in ("kill-forager", "pause-forager"):
                target = rng.choice(self.foragers).name
                seconds = rng.uniform(0.3, 8.0)
            elif kind == "partition":
                peer = rng.choice([*self.foragers, *self.clients, *self.mailboxes])
                target = f"{peer.name}/{rng.choice(self.queens).name}"
                seconds = rng.uniform(0.3, 5.0)
            elif kind == "client-reconnect":
                target = rng.choice([*self.clients, *self.mailboxes]).name
                seconds = 0.0
            else:
                target = rng.choice(self.clients).name
                seconds = 0.0
            n = rng.randrange(len(COMMIT_KINDS)) if kind == "crash-at-commit" else (
                rng.randint(0, 6))
            faults.append(Fault(at, kind, target, seconds, n))
        faults.sort(key=lambda f: f.at)
        return [f for i, f in enumerate(faults) if i not in disabled]

    def _workload(self) -> None:
        rng = self.rng
        clock = self.clock
        n_tasks = rng.randint(*self.weather.tasks)
        asks = rng.random() < self.profile.asks
        keys: list[str] = []
        submitted: list[tuple[SimClient, str]] = []
        foragers = [f.name for f in self.foragers]
        # Delayed tasks: drawn from a stream of their own (the rest of the workload is
        # the same with them or without).
        drng = self.stream("delays")
        delayed = drng.random() < self.profile.delays

        def submit(i: int) -> None:
            c = rng.choice(self.clients)
            payload: dict[str, Any] = {"n": i, "partials": rng.choice([0, 0, 1, 3])}
            if asks and rng.random() < 0.3:
                payload["ask"] = True
            options: dict[str, Any] = {}
            if rng.random() < 0.1:
                payload["fail"] = True
                if rng.random() < 0.3:
                    payload["retry"] = True  # the handler opts in
                elif rng.random() < 0.3:  # the submission does, or names another type
                    options["retry_on"] = [rng.choice(["SimError", "*", "OtherError"])]
            if rng.random() < 0.15:
                payload["seconds"] = rng.uniform(0.5, 6.0)
            if rng.random() < 0.5:
                options["priority"] = rng.choice([0, 10, 50, 90])
            if rng.random() < 0.15:
                options["labels"] = {"gpu": True}
            if rng.random() < 0.1:
                options["to"] = rng.choice(foragers)
            if rng.random() < 0.2:
                key = rng.choice(keys) if keys and rng.random() < 0.5 else f"k{i}"
                keys.append(key)
                options["key"] = key
            if rng.random() < 0.1:
                options["max_attempts"] = rng.randint(1, 4)
            cap = "rare" if rng.random() < 0.1 else "echo"
            due = None
            if delayed and drng.random() < 0.3:
                wait = drng.uniform(0.5, 10.0)
                due = clock.now + wait
                if drng.random() < 0.5:
                    options["after"] = wait
                else:  # (a wall-clock time, as the client's own clock reads it)
                    options["at"] = WALL + getattr(c.clock, "skew", 0.0) + due
            if self.limits:  # (every task names its tenant; some bring a limit of theirs)
                tenant = self.tenants.choice("abcd")
                payload["tenant"] = tenant
                if self.own_limits and self.tenants.random() < 0.3:
                    options["concurrency"] = {"key": f"own-{tenant}", "max": 1}
                if self.tenants.random() < 0.2:
                    options["cost"] = 0.5
            if not c.alive:
                return
            # (Ids of the workload's own: a run shrunk to fewer faults, whose hellos use
            # fewer message ids, keeps the same task ids.)
            task = c.submit(cap, payload, id=f"{self.seed:x}-t{i}", **options)
            self.ledger.submissions[task].due = due
            submitted.append((c, task))

        for i in range(n_tasks):
            clock.at(rng.uniform(0.2, LOAD), functools.partial(submit, i))
        self._durable_work()
        self._schedules()
        for _ in range(rng.randint(0, 3)):  # cancels of earlier submissions
            def cancel() -> None:
                if submitted:
                    c, task = rng.choice(submitted)
                    c.cancel(task)
            clock.at(rng.uniform(1.0, LOAD + 2), cancel)
        if rng.random() < self.profile.graphs:
            for g in range(rng.randint(1, 2)):
                clock.at(rng.uniform(0.3, LOAD), functools.partial(self._graph, g))
        if len(self.clients) > 1 and rng.random() < self.profile.attaches:
            for _ in range(rng.randint(1, 3)):  # another client follows a task
                def attach() -> None:
                    if submitted:
                        _, task = rng.choice(submitted)
                        self.clients[-1].attach(task, rng.randint(0, 2))
                clock.at(rng.uniform(0.5, LOAD + 2), attach)
        for mb in self.mailboxes:  # messages for a name that joins later
            for _ in range(rng.randint(1, 3)):
                clock.at(rng.uniform(0.3, LOAD), functools.partial(self._tell, mb.name))
            clock.at(rng.uniform(2.0, LOAD + 4), mb.start)
        if rng.random() < 0.4:
            for i in range(rng.randint(1, 5)):
                clock.at(rng.uniform(0.3, LOAD),
                         functools.partial(self.clients[0].remember, f"key{i % 3}", i))
        if rng.random() < 0.3:
            for i in range(rng.randint(1, 3)):
                clock.at(rng.uniform(0.3, LOAD),
                         functools.partial(self.clients[0].broadcast, "news", i))

    def _durable_work(self) -> None:
        """Durable agents (from a stream of their own, so the rest of the workload is
        the same with or without them): plans of steps, sleeps, sub-task calls and
        durable asks; some handlers changed since their task began (``diverge``)."""
        rng = self.stream("durable")
        if rng.random() >= self.profile.durable:
            return
        asks = rng.random() < self.profile.asks
        for i in range(rng.randint(1, 8)):
            plan: list[list[Any]] = [["step", "plan"]]
            for _ in range(rng.randint(1, 6)):
                kind = rng.choice(("step", "step", "step", "sleep", "call", "ask"))
                if kind == "step":
                    plan.append(["step", rng.choice(("llm", "tool"))])
                elif kind == "sleep":
                    plan.append(["sleep", rng.choice((0.0, 0.05, 0.5, 2.0))])
                elif kind == "call":
                    plan.append(["call"])
                elif asks:
                    plan.append(["ask"])
            payload = {"n": 10_000 + i, "durable": plan, "diverge": rng.random() < 0.15}
            c = rng.choice(self.clients)

            def submit(c: SimClient = c, payload: dict[str, Any] = payload, i: int = i) -> None:
                if c.alive:
                    # ('s', not 'd': a hex digit would make the id one of the message
                    # ids this run's IdMaker deals out, and an error's ref ambiguous.)
                    c.submit("echo", payload, id=f"{self.seed:x}-s{i}")
            self.clock.at(rng.uniform(0.2, LOAD), submit)
        self.clock.at(LOAD, self._look_for_questions)

    def _schedules(self) -> None:
        """Schedules (from a stream of their own): cron ticks every second or two, each
        policy drawn; added early, some paused and resumed, all removed once the load
        is over (so the run can settle)."""
        rng = self.stream("schedules")
        if rng.random() >= self.profile.schedules:
            return
        c = self.clients[0]
        names = []
        long = self.span > 0  # (an hour: every minute, more of them)
        for i in range(rng.randint(5, 20) if long else rng.randint(1, 3)):
            name = f"s{i}"
            names.append(name)
            body: dict[str, Any] = {
                "op": "add", "name": name, "cron": "* * * * *" if long else rng.choice((
                    "* * * * * *", "*/2 * * * * *")),
                "capability": "echo", "payload": {"n": 20_000 + i, "tenant": "a",
                                                  "seconds": rng.choice((0.0, 0.0, 1.5))},
                "overlap": rng.choice(("skip", "queue", "allow")),
                "catch_up": rng.choice(("none", "latest", "all"))}
            if rng.random() < 0.3:
                body["options"] = {"priority": rng.choice([10, 90])}
            self.scheduled[name] = body
            self.clock.at(rng.uniform(0.2, 1.5), functools.partial(c.schedule, body))
        if rng.random() < 0.4:
            name = rng.choice(names)
            at = rng.uniform(2.0, LOAD)
            self.clock.at(at, functools.partial(c.schedule, {"op": "pause", "name": name}))
            self.clock.at(at + rng.uniform(0.5, 3.0),
                          functools.partial(c.schedule, {"op": "resume", "name": name}))
            self.paused.add(name)
        if rng.random() < 0.3:
            self.clock.at(rng.uniform(1.0, LOAD), functools.partial(
                c.schedule, {"op": "trigger", "name": rng.choice(names)}))
        for name in names:
            self.clock.at(self.span + LOAD + 2.0 + rng.uniform(0, 2.0),
                          functools.partial(c.schedule, {"op": "remove", "name": name}))

    def _look_for_questions(self) -> None:
        """A person now and then looks at what the colony waits for (``meshant task``,
        the dashboard) and answers a durable question whose live update they missed
        (sent to a connection that was gone)."""
        clients = {c.name: c for c in self.clients}
        for q in self.queens:
            if q.core is None or not q.leading:
                continue
            for task in list(q.core.scheduler.tasks.values()):
                w = task.wake
                c = clients.get(task.client_name)
                if w is not None and isinstance(w.get("request"), str) and c is not None:
                    c.answer_now(task.id, w["request"])
        if self.clock.now < self.end - SETTLE:
            self.clock.after(3.0, self._look_for_questions)

    def _tell(self, name: str) -> None:
        self.rng.choice(self.clients).tell(name, "hello")

    def _graph(self, g: int) -> None:
        rng = self.rng
        fail = rng.random() < 0.3
        spawn = [{"name": "s1", "capability": "echo", "payload": {"n": 100}},
                 {"name": "s2", "capability": "echo", "payload": {"n": 101},
                  "after": ["s1"]}]
        nodes: list[dict[str, Any]] = [
            {"name": "a", "capability": "echo", "payload": {"n": 1}},
            {"name": "b", "capability": "echo", "payload": {"n": 2, "fail": fail},
             "after": ["a"], "max_attempts": 1},
            {"name": "c", "capability": "echo", "payload": {"n": 3, "spawn": spawn},
             "after": ["a"]},
            {"name": "d", "capability": "echo", "payload": {"n": 4}, "after": ["b"],
             "after_spawned": ["c"]},
        ]
        c = rng.choice(self.clients)
        if c.alive:
            c.submit_graph(nodes, id=f"{self.seed:x}-g{g}")

    def _strike(self, f: Fault) -> None:
        self.log(str(f).strip())
        rng = self.strike_rng
        clock = self.clock
        if f.kind in ("kill-queen", "crash-mid-turn", "crash-at-commit", "pause-queen",
                      "power-loss"):
            q = next(x for x in self.queens if x.name == f.target)
            if f.kind == "pause-queen":
                q.pause(f.seconds)
            elif f.kind == "power-loss":
                lost = q.power_off()
                if lost:
                    self.log(f"{q.name}: the power cut lost the last {lost} commits")
                clock.after(f.seconds, q.revive)
            elif f.kind == "kill-queen":
                q.kill()
                clock.after(f.seconds, q.revive)
            elif f.kind == "crash-at-commit":
                q.crash_commits, q.crash_kind = 0, COMMIT_KINDS[f.n][1]
                q.on_crash = lambda q: clock.after(f.seconds, q.revive)
            else:
                q.crash_after = f.n
                q.on_crash = lambda q: clock.after(f.seconds, q.revive)
        elif f.kind in ("kill-forager", "pause-forager"):
            fg = next(x for x in self.foragers if x.name == f.target)
            if f.kind == "pause-forager":
                fg.pause(f.seconds)
            else:
                fg.crash()
                if rng.random() < 0.8:
                    clock.after(f.seconds, fg.revive)
        elif f.kind == "partition":
            peer, queen = f.target.split("/")
            self.net.partition(peer, queen, f.seconds)
            for x in [*self.foragers, *self.clients, *self.mailboxes]:
                if x.name == peer:
                    x.disturbed += 1
        elif f.kind == "client-reconnect":
            c = next(x for x in [*self.clients, *self.mailboxes] if x.name == f.target)
            if c.alive:
                c.link.moved(clock.now)
                c.do()
                c.pump()
        elif f.kind == "late-duplicate":
            self.net.replay_late()
        elif f.kind == "garbage":
            c = next(x for x in self.clients if x.name == f.target)
            c.raw(garbage(rng, 64))
        elif f.kind == "oversize":
            c = next(x for x in self.clients if x.name == f.target)
            c.raw([bytes(70 * 1024)])

    # -- running --------------------------------------------------------------------------

    def run(self) -> Result:
        result = Result(self.seed, faults=self.faults)
        clock = self.clock
        for q in self.queens:
            q.start()
        for peer in [*self.foragers, *self.clients]:
            clock.at(self.rng.uniform(0.0, 0.3), peer.start)
        self._workload()
        for f in self.faults:
            clock.at(f.at, functools.partial(self._strike, f))
        clock.at(self.fault_end + 0.1, self._heal)
        try:
            self._until_settled()
            self._check_end()
        except Violation as v:
            result.violation = v
        except Exception as e:  # a bug the code met: as much a broken promise
            tb = traceback.extract_tb(e.__traceback__)[-3:]
            where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb)
            result.violation = Violation("no-internal-error",
                                         f"{type(e).__name__}: {e} (at {where})")
        result.tasks = len(self.ledger.submissions)
        result.steps = clock.steps
        result.trace = self.trace
        self.disk.close()
        return result

    # -- invariants that follow an outcome ------------------------------------------------

    def _outcome(self, task: str, body: dict[str, Any]) -> None:
        """A task's outcome reached its submitter. Cancelled: the run of its attempt that
        its forager is running gets the cancel within CANCEL_GRACE, unless the forager or
        the queen is disturbed meanwhile (paused, killed, reconnected)."""
        if body.get("state") != "cancelled" or not isinstance(body.get("attempt"), int):
            return
        foragers = {f.name: f for f in self.foragers}
        queens = {q.name: q for q in self.queens}
        now = self.clock.now
        for run in self.ledger.runs.values():
            if (run.task != task or run.attempt != body["attempt"] or run.ended is not None
                    or run.stopped is not None or run.started > now):
                continue
            f = foragers[run.forager]
            q = queens[run.life.partition("@")[0]]
            if (f.clock.now < f.paused_until or q.clock.now < q.paused_until
                    or self.net.cut(f.name, q.name)):
                continue  # (paused, or cut off: it hears nothing now)
            marks = (f.disturbed, f.gen, q.disturbed, q.incarnation)

            def check(run: Any = run, f: SimForager = f, q: SimQueen = q,
                      marks: tuple[int, int, int, int] = marks) -> None:
                if run.ended is not None or run.stopped is not None:
                    return
                if ((f.disturbed, f.gen, q.disturbed, q.incarnation) != marks or not q.up
                        or self.net.cut(f.name, q.name)):
                    return  # (a disturbed run may miss it: its queen re-runs nothing of it)
                self.ledger.fail("cancel-reaches-run", f"task {task} was cancelled at "
                                 f"{now:.3f}, and run {run.uid} of its attempt "
                                 f"{run.attempt} on {run.forager} was not told to stop by "
                                 f"{self.clock.now:.3f}")
            self.clock.after(CANCEL_GRACE, check)

    def _heal(self) -> None:
        """The faults are over: every process that is down comes back."""
        self.log("faults over: everything comes back")
        for q in self.queens:
            if not q.up:
                q.start()
        for f in self.foragers:
            if not f.alive and f.refused is None:
                f.start()

    def _until_settled(self) -> None:
        clock = self.clock
        quiet_since: float | None = None
        while clock.now < self.end:
            horizon = clock.now + 0.5
            at, same = clock.now, 0
            while clock.step(horizon):
                if clock.now == at:
                    same += 1
                    if same > SPIN:
                        # Nothing waits for anything: a process tries something flat out
                        # (a real one would burn a core doing it).
                        self.ledger.fail("no-spin", f"{SPIN:,} events at {at:.6f} without "
                                         "time passing")
                else:
                    at, same = clock.now, 0
            clock.now = max(clock.now, horizon)
            if clock.now < self.fault_end + 0.2 or not self._settled():
                quiet_since = None
                continue
            if quiet_since is None:
                quiet_since = clock.now
            elif clock.now - quiet_since >= SETTLE:
                return

    def _settled(self) -> bool:
        now = self.clock.now
        processes: list[SimQueen | SimPeer] = [*self.queens, *self.foragers, *self.clients]
        if any(x.paused_until > now for x in processes):
            return False  # (a paused process has yet to catch up)
        led = self.ledger
        if any(t not in led.outcomes for t in led.submissions):
            return False
        if any(g not in led.graph_outcomes for g in led.graphs):
            return False
        return all(not c.cs.outbox and not c.cs.requests for c in self.clients if c.alive)

    def _check_end(self) -> None:
        led = self.ledger
        missing = [t for t in led.submissions if t not in led.outcomes]
        if missing:
            led.fail("one-outcome", f"{len(missing)} submissions never got an outcome, "
                     f"first {missing[0]} ({led.submissions[missing[0]]})")
        gone = [g for g in led.graphs if g not in led.graph_outcomes]
        if gone:
            led.fail("one-outcome", f"graph {gone[0]} never ended")
        for c in self.clients:
            if c.alive and c.cs.requests:
                # A request is answered, or failed, never left waiting for an answer
                # nobody will send (one sent to a queen lost before it answered).
                msg = next(iter(c.cs.requests.values()))
                led.fail("request-answered", f"{c.name}'s {msg.kind} request {msg.id} "
                         f"({msg.b.get('op', '')}) was never answered")
        journal = Journal(":memory:", connection=self.disk)
        problems = journal.verify()
        if problems:
            led.fail("journal-chain", problems[0])
        self._check_kept_updates(journal)
        self._check_schedules(journal)
        for k in led.kept.values():
            # At most once: the queen forgets a kept message before it sends it, and its
            # receipt says it was handed over (a connection that dies loses both).
            if k.receipts.count("delivered") > 1:
                led.fail("inbox-once", f"message {k.id} has receipts {k.receipts}")
        leader = next((q for q in self.queens if q.up and q.leading), None)
        if leader is not None and leader.core is not None:
            items = leader.core.memory.items
            peers: list[SimPeer] = [*self.foragers, *self.clients]
            for peer in peers:
                r = peer.replica
                if peer.alive and r is not None and r.synced and r.items != items:
                    led.fail("memory", f"{peer.name}'s colony memory {r.items} is not the "
                             f"queen's {items}")

    def _check_kept_updates(self, journal: Journal) -> None:
        """Every partial result of the run that completed a task is kept, once and in
        order: the colony loses none to a dead connection or a queen's crash (the forager
        sends again what the welcome says the queen lacks)."""
        led = self.ledger
        for task_id, outcomes in led.outcomes.items():
            body = outcomes[0]
            result = body.get("result")
            if body.get("state") != "completed" or not isinstance(result, dict):
                continue
            run = led.runs.get(result.get("run", -1))
            if run is None or journal.find(task_id) is None:
                continue  # (a keyed duplicate's, or pruned from the journal)
            got = [b["value"]["i"] for _, kind, b in journal.conversation.updates(task_id)
                   if kind == "task.result" and isinstance(b.get("value"), dict)
                   and b["value"].get("run") == run.uid]
            if got != list(range(run.partials)):
                led.fail("updates-kept", f"task {task_id}: the journal keeps partials "
                         f"{got} of run {run.uid}, which sent {run.partials}")


    def _check_schedules(self, journal: Journal) -> None:
        """Each schedule tick made at most one task, none before its time; with overlap
        'skip' none while the one before ran; with catch-up 'all', overlap 'allow' and
        no pause, none of the ticks between its first and last firing went without one."""
        if not self.scheduled:
            return
        led = self.ledger
        # (Each task's end: its final event's time, on the queen's wall clock.)
        rows = journal.db.execute(
            "SELECT idem_key, created, (SELECT max(ts) FROM events WHERE task_id = id AND "
            "state IN ('completed', 'failed', 'cancelled')) FROM tasks WHERE idem_key LIKE "
            "'schedule:%' AND idem_key NOT LIKE '%:manual:%' ORDER BY created").fetchall()
        by_tick: dict[tuple[str, float], int] = {}
        fired: dict[str, list[tuple[float, float, float | None]]] = {}
        for key, created, ended in rows:
            named = schedule_model.tick_of(key)
            if named is None:
                continue
            name, at = named
            tick = schedule_model.stamp(at)
            by_tick[named] = by_tick.get(named, 0) + 1
            if by_tick[named] > 1:
                led.fail("schedule-once", f"schedule {name}'s tick {tick} made "
                         f"{by_tick[named]} tasks")
            if created < at - led.delay_slack:  # (the journal's wall clock drifts)
                led.fail("schedule-not-early", f"schedule {name}'s tick {tick} made a task "
                         f"at {created:.3f}, {at - created:.3f} s before its time")
            fired.setdefault(name, []).append((at, created, ended))
        for name, body in self.scheduled.items():
            ticks = sorted(fired.get(name, []))
            if body["overlap"] == "skip":
                for (_, _, end), (at, created, _) in itertools.pairwise(ticks):
                    if end is not None and created < end - led.delay_slack:
                        led.fail("schedule-overlap", f"schedule {name} (overlap skip) "
                                 f"fired its tick at {at:.0f} while the task before ran")
            if (body["overlap"] != "allow" or body["catch_up"] != "all"
                    or name in self.paused or len(ticks) < 2):
                continue
            want: list[float] = []
            t = ticks[0][0]
            while t <= ticks[-1][0]:
                want.append(t)
                t = schedule_model.next_tick(body["cron"], "UTC", t)
            got = [x[0] for x in ticks]
            if got != want:
                lost = sorted(set(want) - set(got))
                led.fail("schedule-every-tick", f"schedule {name} (catch-up all) made no "
                         f"task for {len(lost)} of its ticks, first at {lost[0]:.0f}")


def run_seed(seed: int, disabled: frozenset[int] = frozenset(),
             profile: Profile = DEFAULT) -> Result:
    """Run the colony of ``seed`` (without the faults whose indices are ``disabled``)."""
    return Colony(seed, disabled, profile).run()


def shrink(seed: int, first: Result, budget: int = 48,
           runner: Callable[[int, frozenset[int]], Result] = run_seed) -> Result:
    """The failing run of ``seed`` with as few of its faults as still break the same
    promise (delta debugging over the faults, at most ``budget`` runs)."""
    assert first.violation is not None
    want = first.violation.invariant
    n_faults = len(first.faults)
    enabled = list(range(n_faults))
    best = first
    runs = 0

    def fails(keep: list[int]) -> Result | None:
        nonlocal runs
        runs += 1
        r = runner(seed, frozenset(set(range(n_faults)) - set(keep)))
        return r if r.violation is not None and r.violation.invariant == want else None

    chunks = 2
    while enabled and runs < budget:
        size = max(1, len(enabled) // chunks)
        parts = [enabled[i:i + size] for i in range(0, len(enabled), size)]
        for part in parts:
            keep = [i for i in enabled if i not in part]
            r = fails(keep) if runs < budget else None
            if r is not None:
                enabled, best = keep, r
                chunks = max(2, chunks - 1)
                break
        else:
            if size == 1:
                break
            chunks = min(len(enabled), chunks * 2)
    best.faults = [first.faults[i] for i in enabled]
    return best


def relevant(result: Result, lines: int = 40) -> list[str]:
    """The trace lines that matter to a failure: the faults, and the lines that name what
    the broken promise names; the last ``lines`` of them."""
    assert result.violation is not None
    words = {w.strip("',.:()") for w in result.violation.detail.split()}
    words = {w for w in words if len(w) > 3 and any(ch.isdigit() for ch in w)}
    keep = [t for t in result.trace if "fault" in t or " starts" in t or "killed" in t
            or "takes over" in t or "steps down" in t or any(w in t for w in words)]
    return keep[-lines:]


def timed(fn: Callable[[], Result]) -> tuple[Result, float]:
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


__all__ = ["DEFAULT", "Colony", "Fault", "Profile", "Result", "config", "relevant", "run_seed",
           "shrink"]
