"""A queen in the simulator: the real :class:`~meshant.core.queen.router.QueenCore` and the real
journal code (SQLite in memory: the disk, which outlives a killed queen), driven as the
queen actor drives them, over the simulated network and clock.

With a :class:`LeaseStore` several queens share the disk and one leads: each follows its
lease with the real rules (:mod:`meshant.core.journal.lease`), and every journal write is fenced
by the term, as a PostgreSQL journal fences it.
"""

from __future__ import annotations

import random
import sqlite3
from collections import deque
from collections.abc import Callable, Container, Iterable
from typing import Any

from meshant import protocol as p
from meshant.actors._reads import answer
from meshant.core.journal.lease import Hint, LeaseHold, Roles, StepDown, TakeOver
from meshant.core.lifecycle import TaskState
from meshant.core.nodes.registry import Node
from meshant.core.queen import outbox
from meshant.core.queen.carry import carry_out
from meshant.core.queen.outbox import Action, Commit, Publish, Read, Send
from meshant.core.queen.reads import PER_PEER
from meshant.core.queen.router import QueenConfig, QueenCore
from meshant.core.schedules import model as schedule_model
from meshant.core.tasks.limits import Rule, parse_rules
from meshant.core.tasks.model import QUEUED, SUSPENDED, Task, graph_node_of, is_graph_node
from meshant.core.tasks.rates import RateRule
from meshant.core.tasks.work import Deliver
from meshant.errors import Deposed
from meshant.sim.ledger import Ledger
from meshant.sim.world import Clock, Net, ProcessClock
from meshant.storage.commit import commit_all
from meshant.storage.journal import Journal
from meshant.storage.schedules import rows as schedule_rows

WALL = 1.0e9  # the simulated wall clock: virtual time plus this
TICK = 0.05


class LeaseStore:
    """The shared database's lease row and fence, with PostgreSQL's rules
    (``meshant.storage.leadership`` and the ``fence`` function of ``storage/pg.py``), on
    the store's own clock."""

    def __init__(self, lease: float, ledger: Ledger) -> None:
        self.lease = lease
        self.term = 0
        self.holder = ""
        self.expires = float("-inf")
        self.ledger = ledger

    def acquire(self, holder: str, now: float) -> int | None:
        """A standby's attempt: once the lease lapsed, or at once by its own holder."""
        if self.expires < now or self.holder == holder:
            self.term += 1
            self.holder = holder
            self.expires = now + self.lease
            if self.term in self.ledger.terms:
                self.ledger.fail("one-leader-per-term", f"term {self.term} granted twice")
            self.ledger.terms[self.term] = holder
            return self.term
        return None

    def renew(self, holder: str, term: int, now: float) -> bool:
        if self.term == term and self.holder == holder:
            self.expires = now + self.lease
            return True
        return False

    def release(self, holder: str, term: int) -> None:
        if self.term == term and self.holder == holder:
            self.expires = float("-inf")

    def fenced(self, term: int) -> bool:
        """A write of ``term`` may go in (the transaction's first statement)."""
        return term == self.term


class SimQueen:
    """One queen process: started, killed, paused, restarted by the faults."""

    def __init__(self, name: str, config: QueenConfig, *, clock: Clock | ProcessClock,
                 net: Net,
                 ledger: Ledger, rng: random.Random, disk: sqlite3.Connection | None,
                 log: Callable[[str], None], store: LeaseStore | None = None,
                 queens: list[str] | None = None, journal: Any = None) -> None:
        """``disk``: the in-memory database its journal is written to (and read back from
        after a restart); ``journal``: a journal to use instead (a test's file or
        database); neither: no journal."""
        self.name = name
        self.config = config
        self._rules: list[Rule] | None = None  # its concurrency limits, parsed once
        self._rates: list[RateRule] | None = None  # and its rate limits
        # What went through each rate limit's bucket: (core, limit, key) -> [(t, cost)].
        self._taken: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
        self.clock = clock
        self.net = net
        self.ledger = ledger
        self.rng = rng
        self.disk = disk
        self.log = log
        self.store = store
        self.all_queens = queens or [name]
        self.incarnation = 0
        self.up = False
        self.disturbed = 0  # bumped by a kill, a pause, a change of leadership
        self.paused_until = 0.0
        self.core: QueenCore | None = None
        self.journal: Any = None
        self.hold = LeaseHold(store.lease) if store is not None else None
        self.roles = Roles(leading=store is None)
        self._held: deque[Callable[[], None]] = deque()  # what came while paused
        self.crash_after: int | None = None  # armed: die after this many more actions
        # Armed: die right after the next journal commit that holds a record of this kind
        # (None: any), before what follows it leaves (a power cut between a write and
        # what depends on it).
        self.crash_commits: int | None = None
        self.crash_kind: type | None = None
        self.on_crash: Callable[[SimQueen], None] = lambda q: None
        self.on_action: Callable[[Any], None] = lambda a: None
        # How long a journal read takes: a network database's round trip (a test's
        # in-memory colony reads as SQLite does, at once).
        self.read_delay = (0.0001, 0.003)
        self.read_fail = 0.0  # how often a read fails
        self.turn = 16  # messages read a turn at most (the actor's TURN_MESSAGES)
        self._inbox: deque[tuple[bytes, list[bytes]]] = deque()
        self._reading = False
        # Durability: "power" (each commit synced) or "process" (a power cut loses the
        # commits since the last sync, every ``sync_every``): the disk as last synced.
        self.durability = "power"
        self.sync_every = 1
        self._since_sync = 0
        self.synced: bytes | None = None
        # The CURVE key a connection authenticated with (the simulator's have none).
        self.key_of: Callable[[bytes], bytes | None] = lambda identity: None
        self._given = journal
        self._lease_asked = 0  # the life whose lease round is in flight (0: none)
        self._marks: dict[tuple[str, Any], int] = {}
        self._woken: list[tuple[str, dict[str, Any]]] = []  # this turn's wakes
        self._restored_n: dict[tuple[str, Any], int] = {}

    @property
    def wall_offset(self) -> float:
        """This process's wall clock, less its monotonic one (its skew included)."""
        return WALL + getattr(self.clock, "skew", 0.0) - (
            self.clock.now - self.net.clock.now)

    @property
    def life(self) -> str:
        return f"{self.name}@{self.incarnation}"

    @property
    def leading(self) -> bool:
        return self.roles.leading and self.core is not None and self.core.standby is None

    # -- life and death -------------------------------------------------------------------

    def start(self) -> None:
        self.incarnation += 1
        self.up = True
        self.paused_until = 0.0
        self._held.clear()
        self.journal = self._open()
        if self.synced is None and self.durability == "process" and self.disk is not None:
            self.synced = self.disk.serialize()  # (the empty journal, its tables made)
        if self.hold is not None:
            self.hold = LeaseHold(self.hold.lease)
            self.roles = Roles(leading=False)
        self.core = self._core(restore=self.roles.leading)
        self.log(f"{self.life} starts ({'leader' if self.roles.leading else 'standby'})")
        life = self.incarnation
        self._every(TICK, life, self._tick)
        self._every(self.config.hb_interval, life, self._beat)
        if self.store is not None:
            self._every(self.store.lease / 4, life, self._lease_round)
            self._lease_round()

    def revive(self) -> None:
        """Start again, unless up already."""
        if not self.up:
            self.start()

    def kill(self) -> None:
        """kill -9: the process is gone; what it had not committed is lost."""
        if not self.up:
            return
        self.log(f"{self.life} is killed")
        self.disturbed += 1
        self.up = False
        self.core = None
        self.journal = None
        self._held.clear()
        self._inbox.clear()
        self._reading = False
        self.on_crash(self)

    def power_off(self) -> int:
        """A power cut: the process dies, and the disk keeps only what was synced (with
        durability "process"). Returns how many commits were lost."""
        lost = 0
        if self.up:
            self.kill()
        if self.durability == "process" and self.disk is not None and self._since_sync:
            lost = self._since_sync
            if self.synced is not None:
                self.disk.deserialize(self.synced)
            self._since_sync = 0
            self.ledger.lossy += lost
        return lost

    def pause(self, seconds: float) -> None:
        """SIGSTOP for ``seconds``: nothing is handled; what comes waits."""
        if not self.up:
            return
        self.log(f"{self.life} is paused for {seconds:.2f} s")
        self.disturbed += 1
        self.paused_until = self.clock.now + seconds
        life = self.incarnation
        self.clock.at(self.paused_until, lambda: self._resume(life))

    def _resume(self, life: int) -> None:
        if not self.up or self.incarnation != life or self.clock.now < self.paused_until:
            return
        self.log(f"{self.life} resumes ({len(self._held)} events waited)")
        held, self._held = self._held, deque()
        while held and self.up and self.incarnation == life:
            held.popleft()()

    def _open(self) -> Any:
        """The journal, as a fresh connection sees it (a new process, a new term)."""
        if self._given is not None:
            return self._given
        if self.disk is None:
            return None
        return Journal(":memory:", connection=self.disk)

    def _every(self, period: float, life: int, fn: Callable[[], None]) -> None:
        def again() -> None:
            if not self.up or self.incarnation != life:
                return
            self._when_running(fn)
            self.clock.after(period, again)
        self.clock.after(period * self.rng.uniform(0.5, 1.0), again)

    def _when_running(self, fn: Callable[[], None]) -> None:
        if self.clock.now < self.paused_until:
            self._held.append(fn)
        else:
            fn()

    # -- the core -------------------------------------------------------------------------

    def _core(self, restore: bool) -> QueenCore:
        term = self.hold.term if self.hold is not None else 0
        epoch = f"t{term}-{self.life}" if self.store is not None else self.life
        journal = self.journal if restore else None
        restore = journal is not None
        core = QueenCore(self.config, epoch=epoch, wall_offset=self.wall_offset,
                         restored=journal.restored() if journal is not None else None,
                         now=self.clock.now, rng=random.Random(self.rng.random()))
        core.lead(term, self._hint() if not restore and not self.roles.leading else None)
        # The update numbers this life starts from (what the journal holds of each run).
        self._marks = {}
        self._restored_n = {(a.task.id, a.number): a.n
                            for a in core.scheduler.attempts.values()}
        if restore:
            self.ledger.restored[self.life] = {
                (att.task.id, att.number) for att in core.scheduler.held.values()}
        self._watch_wakes(core)
        return core

    def _watch_wakes(self, core: QueenCore) -> None:
        """A suspended task wakes never before its time (on this queen's wall clock);
        the wakes a turn made count once the turn is carried out (see ``_turn``)."""
        sched = core.scheduler
        wake = sched.wake
        self._woken = []

        def watched(task: Task, now: float, why: str) -> None:
            w = task.wake
            if task.state == SUSPENDED and w is not None:
                until = w.get("until")
                if isinstance(until, int | float) and now + sched.to_wall < until - 1e-6:
                    self.ledger.fail("wake-on-time", f"{self.life} woke task {task.id} at "
                                     f"{now + sched.to_wall:.3f}, before {until:.3f} ({why})")
                # (a sleep of s seconds on a clock running up to 1 % fast: s/100 early)
                rate = getattr(self.clock, "rate", 1.0)
                self.ledger.woke_at(task.id, w, self.net.clock.now,
                                    abs(1.0 - 1.0 / rate) * 10.0 + 1e-6, self.life)
                self._woken.append((task.id, dict(w)))
            wake(task, now, why)
        setattr(sched, "wake", watched)  # noqa: B010  (the simulator's probe, on one core)

    def _hint(self) -> dict[str, Any]:
        store = self.store
        leader = store.holder if store is not None and store.expires > self.net.clock.now else ""
        hint: dict[str, Any] = {"role": "standby", "queen": self.name,
                                "term": store.term if store is not None else 0}
        if leader and leader != self.name:
            hint["leader"] = leader
            hint["message"] = f"queen {self.name!r} is a standby: queen {leader!r} leads"
        else:
            hint["message"] = f"queen {self.name!r} is a standby and no queen leads right now"
        return hint

    def _follow_lease(self) -> None:
        """Before anything is handled, as the actor does: take over, step down, hint."""
        hold, store = self.hold, self.store
        if hold is None or store is None:
            return
        now = self.clock.now
        leader = store.holder if store.expires > self.net.clock.now else ""
        match self.roles.step(hold.valid(now), hold.term, leader):
            case TakeOver(term=term):
                self.disturbed += 1
                self.journal = self._open()  # fresh chains
                self.core = self._core(restore=True)
                self.roles.took_over(term)
                self.log(f"{self.life} takes over (term {term}): "
                         f"{self.core.restored} unfinished tasks")
            case StepDown(term=term):
                self.disturbed += 1
                self.core = self._core(restore=False)
                self.log(f"{self.life} steps down (term {term})")
            case Hint():
                assert self.core is not None
                self.core.lead(self.core.term, self._hint())

    def _lease_round(self) -> None:
        hold, store = self.hold, self.store
        if hold is None or store is None or self._lease_asked == self.incarnation:
            return  # (one round at a time, as the actor's leadership thread makes them)
        self._lease_asked = self.incarnation
        sent = self.clock.now
        life = self.incarnation
        leading = hold.role == "leader"
        term = hold.term

        def at_store() -> None:
            now = self.net.clock.now  # (the database's clock, not this queen's)
            if leading:
                ok = store.renew(self.name, term, now)
                won = None
            else:
                won = store.acquire(self.name, now)
                ok = won is not None

            def reply() -> None:
                if not self.up or self.incarnation != life:
                    return
                self._lease_asked = 0
                self._when_running(lambda: self._lease_reply(leading, ok, won, sent))
            self.clock.after(self.net._delay(), reply)
        self.clock.after(self.net._delay(), at_store)

    def _lease_reply(self, leading: bool, ok: bool, won: int | None, sent: float) -> None:
        hold = self.hold
        assert hold is not None
        if won is not None:
            hold.won(won, sent)
        elif leading and ok and hold.role == "leader":
            hold.renewed(sent)
        elif leading and not ok:
            hold.lost()
        if hold.role == "leader" and not hold.valid(self.clock.now):
            hold.lost()
        self._follow_lease()
        self._turn()

    # -- events in ------------------------------------------------------------------------

    def deliver(self, identity: bytes, frames: list[bytes]) -> None:
        """A message reaches the ROUTER: it waits there until a turn reads it (a turn
        reads up to ``turn`` messages, as the actor's does, then ends)."""
        self._inbox.append((identity, frames))
        if not self._reading:
            self._reading = True
            life = self.incarnation
            self._when_running(lambda: self._read_turn(life))

    def _read_turn(self, life: int) -> None:
        if not self.up or self.incarnation != life:
            return
        self._follow_lease()
        core = self.core
        inbox = self._inbox
        if core is None:
            inbox.clear()
            self._reading = False
            return
        now = self.clock.now
        for _ in range(min(self.turn, len(inbox))):
            identity, frames = inbox.popleft()
            if core.reads.peers and core.reads.held(identity):
                waiting = len(core.reads.peers[identity])
                if waiting >= PER_PEER:
                    self.ledger.fail("bounded", f"{waiting} messages wait behind a read")
            core.receive([identity, *frames], self.key_of(identity), now)
        self._turn()
        if inbox and self.up and self.incarnation == life:
            self.clock.after(0.0, lambda: self._when_running(lambda: self._read_turn(life)))
        else:
            self._reading = False

    def _tick(self) -> None:
        if self.core is None:
            return
        self._follow_lease()
        self.core.tick(self.clock.now)
        self._turn()

    def _beat(self) -> None:
        if self.core is not None and self.leading:
            self.core.beat(self.clock.now)
            self._turn()

    # -- a turn's end: invariants, then what the core decided -----------------------------

    def _turn(self) -> None:
        core = self.core
        if core is None:
            return
        now = self.clock.now
        self._check_results(core)
        core.end_turn(now)
        actions = core.take()
        self._check_assigns(core, actions)
        self._check_limits(core)
        self._check_bounds(core)
        self._check_updates(core)
        self._carry_out(core, actions)
        woken, self._woken = self._woken, []
        if self.core is core and self.up:
            self._check_kept(core)
            if self.leading:
                for task_id, w in woken:
                    self.ledger.woke(task_id, w)

    def _check_updates(self, core: QueenCore) -> None:
        """An attempt's progress reports and partial results are taken in the order its
        handler made them, none skipped: each number (``n``) the queen takes is the one
        after the last it holds (after a restart, the last the journal holds)."""
        marks = self._marks
        for w in core.out.work:
            if not isinstance(w, Deliver) or "n" not in w.body:
                continue
            key = (w.task.id, w.body.get("attempt"))
            last = marks.get(key, self._restored_n.get(key, 0))
            n = w.body["n"]
            if n != last + 1:
                self.ledger.fail("update-order", f"{self.life} took update {n} of task "
                                 f"{key[0]}'s attempt {key[1]} after {last}")
            marks[key] = n

    def _check_kept(self, core: QueenCore) -> None:
        """What the queen keeps for a name not connected is in the journal once the
        turn's records are written (a crash then loses none of it)."""
        ib = core.conversations.inboxes
        if self.journal is None or not ib.boxes or not core.conversations.journaled:
            return
        hold, store = self.hold, self.store
        if not self.leading or (hold is not None and store is not None and (
                not hold.valid(self.clock.now) or store.term != hold.term)):
            return  # (a deposed queen's memory is nobody's: the journal is the leader's)
        kept = {k.id for box in ib.boxes.values() for k in box}
        if not kept:
            return
        on_disk = {r["id"] for r in self.journal.conversation.kept()}
        missing = kept - on_disk
        if missing:
            self.ledger.fail("inbox-journaled", f"{self.life} keeps messages "
                             f"{sorted(missing)} for names not connected, and its journal "
                             "does not")

    def _carry_out(self, core: QueenCore, actions: list[Action]) -> None:
        port = _SimQueenPort(self, core)
        try:
            carry_out(actions, port, core.counters)
        except _Killed:
            # Crashed mid-turn: what was left is not carried out, and of each run of the
            # turn's journal records the disk holds all or none.
            for run in outbox.grouped(actions):  # (the rule, as the outbox states it)
                if isinstance(run, Commit):
                    done = sum(1 for r in run.actions if id(r) in port.committed)
                    if 0 < done < len(run.actions):
                        self.ledger.fail("turn-atomic", f"{self.life} died with {done} of "
                                         f"a run of {len(run.actions)} journal records "
                                         "written")

    def _action(self, a: Any) -> None:
        """Before each action goes: the test's hook, and a crash armed mid-turn."""
        if isinstance(a, Commit):
            for r in a.actions:
                self.on_action(r)
        else:
            self.on_action(a)
        if self.crash_after is not None:
            if self.crash_after <= 0:
                self.crash_after = None
                self.kill()
                raise _Killed
            self.crash_after -= 1
        if self.crash_commits is not None and self.crash_commits < 0:
            self.crash_commits = None
            self.kill()
            raise _Killed

    def _write(self, action: Commit) -> bool:
        """A run of journal actions (one transaction), fenced by the term when queens
        share the journal."""
        store, hold = self.store, self.hold
        if store is not None and hold is not None and not store.fenced(hold.term):
            self.log(f"{self.life} is deposed: its write is fenced off (term {hold.term}, "
                     f"the store's {store.term})")
            hold.lost(hold.term)
            self._follow_lease()
            return False
        if self.journal is None:
            return True
        try:
            commit_all(self.journal, action.actions, self.wall_offset)
        except Deposed:
            return False
        self.ledger.writes += 1
        self._check_cursors(action)
        if self.durability == "process" and self.disk is not None:
            self._since_sync += 1
            if self._since_sync >= self.sync_every:
                self.synced = self.disk.serialize()
                self._since_sync = 0
        return True

    def _check_cursors(self, action: Commit) -> None:
        """Each schedule tick's task the commit journaled has its schedule's cursor at or
        past that tick in the journal by then: the two are durable together, so a queen
        that takes over never fires a tick whose task exists (the tick's key is only the
        second line of defence)."""
        ticks = [named for a in action.actions if isinstance(a, outbox.Record)
                 for t in a.tasks if t.key is not None and t.client_name.startswith("schedule:")
                 and (named := schedule_model.tick_of(t.key)) is not None]
        if not ticks or self.journal is None:
            return
        cursors = {r["name"]: r["cursor"] for r in schedule_rows(self.journal)}
        for name, tick in ticks:
            cursor = cursors.get(name)
            if cursor is not None and cursor < tick - self.ledger.delay_slack:
                self.ledger.fail("schedule-cursor", f"{self.life} journaled schedule {name}'s "
                                 f"task for its tick {schedule_model.stamp(tick)} with the "
                                 f"cursor at {cursor:.0f}, before that tick")

    def _read(self, read: Read, life: int) -> None:
        journal = self.journal

        def done() -> None:
            if not self.up or self.incarnation != life or self.core is None:
                return

            def handle() -> None:
                core = self.core
                if core is None:
                    return
                if read.what == "names":
                    core.fetched_names(answer(journal, read))
                elif self.rng.random() < self.read_fail:
                    # The database did not answer (a network journal's hiccup): the
                    # requests that waited are refused, to be sent again.
                    core.fetched(read.token, None, self.clock.now, error="simulated")
                else:
                    core.fetched(read.token, answer(journal, read), self.clock.now)
                self._turn()
            self._when_running(handle)
        self.clock.after(self.rng.uniform(*self.read_delay), done)

    # -- invariants -----------------------------------------------------------------------

    def _check_acting(self, msg: p.Message) -> None:
        """A queen acts only while it holds the term the store holds (a deposed leader
        answers only not-leader)."""
        store, hold, core = self.store, self.hold, self.core
        if store is None or hold is None or core is None or core.standby is not None:
            return  # (a standby's core answers errors only, and changes nothing)
        if store.term != hold.term or store.holder != self.name:
            self.ledger.fail("acted-while-deposed", f"{self.life} sent {msg.kind} under term "
                             f"{hold.term} while the store's term is {store.term} "
                             f"({store.holder})")

    def _check_results(self, core: QueenCore) -> None:
        """A result accepted now is the current attempt's own: a run of that attempt
        this queen assigned, or one it restored from the journal and adopted."""
        for w in core.out.work:
            if not isinstance(w, Deliver) or w.kind != "task.result":
                continue
            body = w.body
            if body.get("partial") or body.get("state") != "completed":
                continue
            result = body.get("result")
            uid = result.get("run") if isinstance(result, dict) else None
            if not isinstance(uid, int):
                continue
            run = self.ledger.runs.get(uid)
            task = w.task.id
            if run is None or run.task != task:
                self.ledger.fail("handler-own-result", f"task {task}'s result came from "
                                 f"run {uid}, not a run of it")
                continue
            if run.attempt != body.get("attempt"):
                self.ledger.fail("superseded-attempt", f"task {task} finished as attempt "
                                 f"{body.get('attempt')} with the result of attempt "
                                 f"{run.attempt} (run {uid} on {run.forager})")
            if run.life != self.life and (task, run.attempt) not in self.ledger.restored.get(
                    self.life, set()):
                self.ledger.fail("superseded-attempt", f"{self.life} accepted for task "
                                 f"{task} the result of run {uid}, assigned by {run.life}: "
                                 "an assignment this queen never made nor adopted")

    def _check_assigns(self, core: QueenCore, actions: list[Any]) -> None:
        """Ready tasks leave in priority order; a graph node runs only once everything it
        waits for completed; never more in flight than a forager's slots."""
        sched = core.scheduler
        for a in actions:
            if not isinstance(a, Send) or a.msg.kind not in ("task.assign", "task.assigns"):
                continue
            node = core.registry.by_id.get(a.identity)
            if node is None:
                continue
            bodies = a.msg.b["assigns"] if a.msg.kind == "task.assigns" else [a.msg.b]
            for b in bodies:
                task = sched.tasks.get(b["task"])
                if task is None:
                    continue
                if task.steps:
                    self.ledger.assigned_with[(task.id, int(b.get("attempt", 0)))] = (
                        self.ledger.journaled_steps(task.id))
                if task.tries >= task.max_attempts:
                    self.ledger.fail("attempts-bounded", f"{b['task']} was assigned again "
                                     f"after {task.tries} failed tries of its "
                                     f"{task.max_attempts}")
                better = _better_queued(sched.tasks.values(), task, node,
                                        _Either(sched.limits.parked, sched.rates.parked))
                if better is not None:
                    self.ledger.fail("priority-order", f"{b['task']} (priority "
                                     f"{task.priority}) went to {node.name} while {better.id}"
                                     f" (priority {better.priority}) waited for it")
                if is_graph_node(task.id):
                    self._check_graph_node(core, task.id)
                self._check_delay(core, task)
                self._check_rate(core, task)
        for node, runs in sched.running.items():
            if len(runs) > node.slots:
                self.ledger.fail("slots", f"{len(runs)} tasks in flight to {node.name}, "
                                 f"which has {node.slots} slots")

    def _check_delay(self, core: QueenCore, task: Task) -> None:
        """A delayed task never starts before its time: on the assigning queen's own wall
        clock, never before the ``not_before`` it journaled; in virtual time, never
        before its due time, less what the processes' clocks may disagree by."""
        now = self.clock.now
        if task.not_before is not None and core.state.wall(now) < task.not_before - 1e-6:
            self.ledger.fail("delay-kept", f"{task.id} was assigned at {core.state.wall(now):.3f}"
                             f" on {self.life}'s wall clock, before its not_before "
                             f"{task.not_before:.3f}")
        sub = self.ledger.submissions.get(task.id)
        virtual = self.net.clock.now
        if sub is not None and sub.due is not None and \
                virtual < sub.due - self.ledger.delay_slack:
            self.ledger.fail("delay-kept", f"{task.id} was assigned at {virtual:.3f}, before "
                             f"its time {sub.due:.3f} (less {self.ledger.delay_slack:.3f} s "
                             "the clocks may disagree by)")

    def _check_rate(self, core: QueenCore, task: Task) -> None:
        """Never more through a rate limit's bucket than it allows over any window: at
        most burst + rate x T of cost in any T seconds (of this queen's life: a queen
        that starts, or takes over, starts its buckets full)."""
        if not core.scheduler.rates.active:
            return
        rates = self._rates
        if rates is None:
            rates = self._rates = [r for r in parse_rules(self.config.limits)
                                   if isinstance(r, RateRule)]
        now = self.clock.now
        cost = task.cost if task.cost is not None else 1.0
        for r in rates:
            if r.capability not in ("*", task.capability):
                continue
            key = ""
            if r.source is not None:
                src = task.labels if r.source == "labels" else task.payload
                if not isinstance(src, dict) or src.get(r.field or "") is None:
                    continue
                key = str(src[r.field or ""])
            log = self._taken.setdefault((id(core), r.text, key), [])
            log.append((now, cost if r.by_cost else 1.0))
            total = 0.0
            for t1, c in reversed(log):
                total += c
                if total > r.burst + r.rate * (now - t1) + 1e-6:
                    self.ledger.fail("rate-window", f"{total:g} of cost went through "
                                     f"{r.text} key {key!r} in {now - t1:.3f} s on "
                                     f"{self.life}: at most {r.burst:g} + {r.rate:g}/s")
            self._check_rate_across(r, key, cost if r.by_cost else 1.0)

    def _check_rate_across(self, r: RateRule, key: str, cost: float) -> None:
        """The same bound over windows that span queen lives (a restart, a takeover): the
        new queen's buckets refill from the journal's newest event (rates.py, resume), so
        what the old queen let through just before counts. In virtual time: plus what the
        clocks may run fast by and what two queens' wall clocks disagree by (an event's
        time is one queen's wall clock, read on another's). Excused in a run that lost
        commits to a power cut (DURABLE: the journal forgot assignments)."""
        led = self.ledger
        virtual = self.net.clock.now
        log = led.rate_log.setdefault((r.text, key), [])
        log.append((virtual, cost, self.life))
        while log and virtual - log[0][0] > 2 * (r.burst / r.rate + led.delay_slack) + 60:
            log.pop(0)  # (bounded: a window that long is the refill's, not a burst's)
        total = 0.0
        for t1, c, life in reversed(log):
            total += c
            if life != self.life and total > r.burst + r.rate * (
                    (virtual - t1) * (1 + led.drift) + led.delay_slack) + 1e-6:
                led.fail("rate-takeover", f"{total:g} of cost went through {r.text} key "
                         f"{key!r} in {virtual - t1:.3f} s across queen lives (from {life} "
                         f"to {self.life}): at most {r.burst:g} + {r.rate:g}/s")
                return

    def _check_limits(self, core: QueenCore) -> None:
        """Never more tasks running than a concurrency limit allows (counted here from the
        rules and the tasks, not from the limiter's books), and no task held back at a
        limit that has room (a key starved)."""
        sched = core.scheduler
        lim = sched.limits
        if not lim.active:
            return
        rules = self._rules
        if rules is None:
            rules = self._rules = [r for r in parse_rules(self.config.limits)
                                   if isinstance(r, Rule)]
        running: dict[tuple[str, str], int] = {}
        most: dict[tuple[str, str], int] = {}
        # (Every running task has a current attempt: on its forager, or held for it.)
        live = {att.task.id: att.task for runs in sched.running.values()
                for att in runs.values()}
        live.update((att.task.id, att.task) for att in sched.held.values())
        for t in live.values():
            if t.state not in _RUNNING or t.id not in sched.tasks:
                continue
            for name, key, n in _limits_of(rules, t):
                running[(name, key)] = running.get((name, key), 0) + 1
                most[(name, key)] = n
        for (name, key), n in running.items():
            if n > most[(name, key)]:
                self.ledger.fail("limit-running", f"{n} tasks of {name} key {key!r} run at "
                                 f"once on {self.life}, over its {most[(name, key)]}")
        for task_id, slot in lim.parked.items():
            if lim.taken.get(slot, 0) < lim.max_of(slot):
                self.ledger.fail("limit-fair", f"{task_id} waits at {lim.slot_text(slot)}, "
                                 f"which has room ({lim.taken.get(slot, 0)} of "
                                 f"{lim.max_of(slot)} taken)")

    def _check_graph_node(self, core: QueenCore, task_id: str) -> None:
        where = graph_node_of(task_id)
        if where is None:
            return
        gid, name = where
        g = core.graphs.graphs.get(gid)
        if g is None or name not in g.nodes:
            return
        n = g.nodes[name]
        deps = list(n.spec.after)
        for dep in n.spec.after_spawned:
            deps.append(dep)
            todo = list(g.nodes[dep].children) if dep in g.nodes else []
            while todo:
                c = todo.pop()
                deps.append(c)
                todo.extend(g.nodes[c].children)
        for dep in deps:
            d = g.nodes.get(dep)
            if d is not None and d.state != "completed":
                self.ledger.fail("graph-dependants", f"graph {gid}: node {name} runs while "
                                 f"{dep}, which it waits for, is {d.state}")

    def _check_bounds(self, core: QueenCore) -> None:
        logs = core.conversations.update_logs
        if logs.bytes > logs.total_bytes:
            self.ledger.fail("bounded", f"update logs hold {logs.bytes} bytes")
        ib = core.conversations.inboxes
        for name, size in ib.sizes.items():
            if size > ib.max_bytes:
                self.ledger.fail("bounded", f"the inbox of {name} holds {size} bytes")
        if core.scheduler.queued > self.config.max_queue:
            self.ledger.fail("bounded", f"{core.scheduler.queued} tasks queued")


class _Killed(Exception):
    """The queen died in the middle of carrying out a turn's actions."""


class _SimQueenPort:
    """The core's actions on the simulated network and disk."""

    __slots__ = ("committed", "core", "life", "queen")

    def __init__(self, queen: SimQueen, core: QueenCore) -> None:
        self.queen = queen
        self.core = core
        self.life = queen.incarnation
        self.committed: set[int] = set()  # the journal actions written, by id()

    def send(self, identity: bytes, frames: list[bytes], msg: p.Message) -> bool:
        q = self.queen
        q._action(Send(identity, "", msg))
        q._check_acting(msg)
        return q.net.send_down(q.name, identity, frames)

    def publish(self, topic: bytes, frames: list[bytes]) -> None:
        q = self.queen
        q._action(Publish(topic, frames))
        q.net.publish(q.name, topic, frames)

    def read(self, read: Read) -> None:
        self.queen._action(read)
        self.queen._read(read, self.life)

    def commit(self, commit: Commit) -> bool:
        q = self.queen
        q._action(commit)
        ok = q._write(commit)
        if ok:
            self.committed.update(id(r) for r in commit.actions)
        if q.crash_commits is not None and (q.crash_kind is None or any(
                isinstance(r, q.crash_kind) for r in commit.actions)):
            q.crash_commits -= 1  # (below 0: the next action does not leave)
        return ok

    def unencodable(self, msg: p.Message, error: p.ProtocolError) -> None:
        pass


class _Either:
    """Task ids held back by a concurrency limit or a rate limit."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[str], b: Container[str]) -> None:
        self.a, self.b = a, b

    def __contains__(self, x: object) -> bool:
        return x in self.a or x in self.b


_RUNNING = frozenset({TaskState.ASSIGNED, TaskState.ACCEPTED, TaskState.INPUT_REQUIRED})


def _limits_of(rules: list[Rule], t: Task) -> list[tuple[str, str, int]]:
    """(limit, key, max) of each concurrency limit a task falls under, read afresh."""
    out: list[tuple[str, str, int]] = []
    if t.concurrency is not None:
        out.append(("concurrency", t.concurrency[0], t.concurrency[1]))
    for r in rules:
        if r.capability not in ("*", t.capability):
            continue
        if r.source is None:
            out.append((r.text, "", r.max))
            continue
        src = t.labels if r.source == "labels" else t.payload
        if isinstance(src, dict) and src.get(r.field or "") is not None:
            out.append((r.text, str(src[r.field or ""]), r.max))
    return out


def _better_queued(tasks: Iterable[Task], task: Task, node: Node,
                   held: Container[str] = ()) -> Task | None:
    """A task still queued for ``node`` that should have left before ``task`` (``held``:
    those a concurrency limit holds back)."""
    for u in tasks:
        if (u.state != QUEUED or u.capability != task.capability or u.retry_timer
                or (u.priority, u.order) >= (task.priority, task.order) or u.id in held):
            continue
        if u.to is not None and u.to != node.name:
            continue
        if u.labels and any(node.labels.get(k) != v for k, v in u.labels.items()):
            continue
        if u.avoid and node.identity in u.avoid:
            continue
        if node.stale and f"{u.id}.{u.attempt + 1}" in node.stale:
            continue
        return u
    return None


__all__ = ["WALL", "LeaseStore", "SimQueen"]
