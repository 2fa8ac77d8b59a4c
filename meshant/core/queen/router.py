"""The queen's logic, sans-IO: peers' messages in, what to do out.

``QueenCore`` is composed of services that own their state — :class:`AdmissionService` (who
joins), :class:`TaskService` (tasks, over the :class:`Scheduler`), :class:`ConversationService`
(questions, attachable streams, inboxes), :class:`GraphService` (task graphs),
:class:`MemoryService` (colony memory) and :class:`OperationsService` (queries, messages, dead
letters, drain and halt) — and one router: a message becomes a request (the peer's
identity, its node once it has said hello, the message, codec, key and time), and the
request goes to the service that handles its kind, through a handler table per phase of
the peer's session (before hello, after). Every service writes to one typed outbox
(:mod:`meshant.core.queen.outbox`).

A driver (the :class:`~meshant.actors.queen.Queen` actor, the simulator, a test) feeds
it what arrives — ``receive(frames, key, now)`` — the passing of time — ``tick(now)``,
``beat(now)`` — the journal's answers to its reads — ``fetched(token, answer, now)`` —
and closes each loop turn with ``end_turn(now)``; then it takes the actions to carry
out, in order, with ``take()``. It reads no clock and touches no socket or database.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from meshant import protocol as p
from meshant.core.graphs.book import GraphBook
from meshant.core.journal.archive import ArchiveIndex, Restored
from meshant.core.journal.defer import Deferral
from meshant.core.memory.model import MemoryStore
from meshant.core.nodes.registry import Registry
from meshant.core.policy import Backoff
from meshant.core.queen.admission_service import AdmissionService
from meshant.core.queen.conversation_service import ConversationService
from meshant.core.queen.delivery import flush
from meshant.core.queen.graph_service import GraphService
from meshant.core.queen.memory_service import MemoryService
from meshant.core.queen.operations_service import OperationsService
from meshant.core.queen.outbox import (
    Action,
    GraphRecord,
    Publish,
    Read,
    Record,
    RecordMemory,
    Remember,
    ScheduleRecord,
    Send,
)
from meshant.core.queen.reads import ReadKey, Reads
from meshant.core.queen.schedule_service import ScheduleService
from meshant.core.queen.state import Arrival, Grants, QueenConfig, QueenState, Request
from meshant.core.queen.task_service import TaskService
from meshant.core.schedules.book import ScheduleBook
from meshant.core.tasks.limits import parse_rules
from meshant.core.tasks.scheduler import Scheduler
from meshant.protocol.codec import BINARY, JSON
from meshant.protocol.codes import Code
from meshant.protocol.topics import HB_TOPIC

BeforeHello = Callable[[Arrival], None]
AfterHello = Callable[[Request], None]
Needs = Callable[[Request], list[ReadKey]]


class QueenCore:
    """The queen's decisions, driven by method calls and a clock argument.

    ``restored``: what the journal holds (a queen with a journal, restarted or not);
    None: no journal (nothing is recorded, nothing read). ``rng``: the randomness of
    retry delays (the simulator seeds it)."""

    def __init__(self, config: QueenConfig, *, epoch: str, wall_offset: float = 0.0,
                 authorized: Grants | None = None, restored: Restored | None = None,
                 now: float = 0.0, rng: random.Random | None = None) -> None:
        c = self.config = config
        self.registry = Registry(c.hb_interval, c.hb_misses, c.max_peers)
        st = self.state = QueenState(c, self.registry, epoch=epoch, wall_offset=wall_offset,
                                     authorized=authorized, now=now)
        self.out = st.out
        backoff = Backoff(c.retry_base, c.retry_cap, rng or random.Random())
        sched = self.scheduler = Scheduler(
            self.registry, st.out.work, assign_timeout=c.assign_timeout, max_queue=c.max_queue,
            default_wait=c.no_forager_wait, backoff=backoff,
            breaker_threshold=c.breaker_threshold, breaker_cooldown=c.breaker_cooldown,
            counters=st.counters)
        sched.to_wall = wall_offset  # (restore sets it again, the same)
        rules = parse_rules(c.limits)  # (checked by the driver: Queen)
        sched.limits.configure(rules)
        sched.rates.configure(rules)
        self.graphs = GraphBook(sched, c.max_graph_nodes, c.max_message, notify=st.later_to,
                                counters=st.counters)
        self.index = ArchiveIndex(restored.names) if restored is not None else None
        self.reads = Reads(st.out)
        # Tasks whose first journal write may wait for their end (core/journal/defer.py).
        self.deferral = Deferral(c.journal_defer)
        self.restored = 0
        if restored is not None:
            sched.track_changes = True
            index = self.index
            assert index is not None
            sched.archived = lambda task_id: index.maybe("t", task_id)
            self.restored = sched.restore(restored.tasks, now, now + wall_offset,
                                          grace=self.registry.timeout * 2)
            sched.restore_steps(restored.steps, now)
            if restored.last_event is not None:
                # The rate limits' buckets refill from the journal's newest event, not
                # full: what the last queen let through just before counts (rates.py). A
                # deferred first write may leave an assignment unjournaled journal_defer.
                sched.rates.resume(restored.last_event - sched.to_wall + c.journal_defer)
            self.graphs.track_changes = True  # graphs: journaled, and carried on
            self.graphs.restore(restored.graphs, restored.graph_tasks, now)
        self.tasks = TaskService(st, sched, self.index, self.reads, self.deferral)
        self.conversations = ConversationService(st, sched, self.tasks, self.reads, restored)
        self.memory_service = MemoryService(st, restored is not None,
                                            restored.memory if restored else [], now)
        self.admission = AdmissionService(st, self.registry, sched, self.graphs,
                                   self.conversations.greet)
        self.graph_service = GraphService(st, self.graphs, sched, self.index, self.reads)
        self.schedules = ScheduleService(st, sched, self.tasks,
                                         ScheduleBook(c.max_schedules,
                                                      c.schedule_grace))
        if restored is not None:
            self.schedules.book.track_changes = True
            self.schedules.restore(restored.schedules)
        self.operations = OperationsService(st, sched, self.conversations, self.admission,
                                     self.status)
        t, cv, g, ops = self.tasks, self.conversations, self.graph_service, self.operations
        # Before hello, a peer may only say hello (or, an IACP 1.1 forager, beat).
        self._before: dict[str, BeforeHello] = {
            "hello": self.admission.hello,
        }
        self._after: dict[str, AfterHello] = {
            "hello": self.admission.rehello,
            "hb": self.admission.hb,
            "task.submit": t.submit,
            "task.accept": t.accept,
            "task.reject": t.reject,
            "task.progress": t.progress,
            "task.result": t.result,
            "task.batch": t.batch,
            "task.cancel": t.cancel,
            "task.step": t.step,
            "task.steps": t.steps,
            "task.call": t.call,
            "task.status": t.status,
            "status.query": ops.status,
            "tool.query": ops.tool_query,
            "msg": ops.directed,
            "note": ops.directed,
            "mem.sync": self.memory_service.request,
            "broadcast": ops.broadcast,
            "dlq": ops.dlq,
            "ctl.drain": ops.control,
            "ctl.halt": ops.control,
            "task.ask": cv.ask,
            "task.answer": cv.answer,
            "task.attach": cv.attach,
            "inbox": cv.inbox,
            "graph.submit": g.submit,
            "graph.status": g.status,
            "graph.cancel": g.cancel,
            "graph.spawn": g.spawn,
            "schedule": self.schedules.request,
        }
        # The handlers that may read the journal declare what, given the request, before
        # they run (core/queen/reads.py): the request waits for the answers, then its
        # handler runs once.
        self._needs: dict[str, Needs] = {
            "task.submit": t.needs_submit,
            "task.status": t.needs_task,
            "task.cancel": t.needs_cancel,
            "task.call": t.needs_call,
            "task.answer": cv.needs_answer,
            "task.attach": cv.needs_attach,
            "graph.submit": g.needs_graph,
            "graph.status": g.needs_graph,
        }

    # -- what the driver and observers read -----------------------------------------------

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def epoch(self) -> str:
        return self.state.epoch

    @property
    def counters(self) -> dict[str, int]:
        return self.state.counters

    @property
    def info(self) -> Any:
        return self.state.info

    @info.setter
    def info(self, value: Any) -> None:
        self.state.info = value

    @property
    def terms(self) -> p.QueenTerms:
        return self.state.terms

    @terms.setter
    def terms(self, value: p.QueenTerms) -> None:
        self.state.terms = value

    @property
    def standby(self) -> dict[str, Any] | None:
        """What a standby tells every peer (None: this core leads)."""
        return self.state.standby

    @property
    def term(self) -> int:
        return self.state.term

    def lead(self, term: int, standby: dict[str, Any] | None = None) -> None:
        """The leadership this core serves: ``term`` (0: no shared journal), as the
        leader, or as a standby answering every peer ``not-leader`` with ``standby``'s
        fields (the leader's endpoint when known, the term, a message)."""
        self.state.term = term
        self.state.standby = standby

    @property
    def memory(self) -> MemoryStore:
        return self.memory_service.store

    @property
    def traces(self) -> dict[str, str]:
        return self.tasks.traces

    # -- driving --------------------------------------------------------------------------

    def take(self) -> list[Action]:
        """The actions decided since the last call, in the order to carry them out."""
        return self.out.take()

    def receive(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        """One message from the ROUTER: ``frames[0]`` is the peer's identity; ``key`` the
        CURVE key its connection authenticated with (or None)."""
        st = self.state
        st.now = now
        st.counters["messages"] += 1
        identity = frames[0]
        reads = self.reads
        if reads.peers and reads.held(identity):
            # Behind one of its requests that waits for the journal: in order, after it.
            if not reads.hold(identity, frames, key):
                st.error_to(identity, BINARY, Code.RATE_LIMITED, "too many messages wait "
                            "behind a journal read: slow down", None, retry_after=1.0)
            return
        self._handle(frames, key, now)

    def fetched(self, token: int, answer: Any, now: float, error: str | None = None) -> None:
        """The journal's answer to :class:`Read` ``token`` (``error``: it could not be
        read): the requests that waited for it are handled now, in order, and then what
        their peers sent meanwhile."""
        st = self.state
        st.now = now
        if error is not None:
            for req in self.reads.answer(token, None):
                st.refuse(req, Code.RATE_LIMITED, f"the queen cannot read its journal right "
                          f"now ({error}): try again", retry_after=1.0)
                self._release(req.identity, now)
            return
        for req in self.reads.answer(token, answer):
            if self.registry.by_id.get(req.identity) is req.node and self._dispatch(req):
                continue  # (it waits for one more read: its peer stays held)
            self._release(req.identity, now)

    def _dispatch(self, req: Request) -> bool:
        """Handle a registered peer's request, once every read its handler declares is
        answered; True if it was parked for one more (its handler has not run)."""
        kind = req.msg.kind
        needs = self._needs.get(kind)
        if needs is not None:
            wanted = needs(req)
            if wanted and self.reads.wait_for(req, wanted):
                return True
        self._after[kind](req)
        return False

    def _release(self, identity: bytes, now: float) -> None:
        reads = self.reads
        waiting = reads.release(identity)
        while waiting:
            frames, key = waiting.popleft()
            self._handle(frames, key, now)
            if reads.held(identity):
                reads.peers[identity].extendleft(reversed(waiting))
                return

    def fetched_names(self, names: list[str]) -> None:
        """The journal's names, for the archive index's rebuild."""
        if self.index is not None:
            self.index.rebuild(names)

    def tick(self, now: float) -> None:
        """Liveness, leases, deadlines, retries and memory expiry (every few ms)."""
        self.state.now = now
        self.admission.expire(now)
        self.scheduler.tick(now)
        self.memory_service.tick(now)
        self.conversations.tick(now)
        self.schedules.tick(now)
        index = self.index
        if index is not None and index.crowded:
            index.rebuilding = True
            self.out.actions.append(Read(0, "names", ""))

    def end_turn(self, now: float) -> None:
        """Close a loop turn: assign what can be, journal what changed, then what to send."""
        st = self.state
        st.now = now
        out = self.out
        sched = self.scheduler
        if sched.dirty:
            sched.dispatch(now)
            if sched.dirty and self.graphs.graphs:
                sched.dispatch(now)  # graph nodes that what dispatch ended unblocked
        if sched.changed or self.deferral.waiting:
            # Durable before anything about it leaves: one record per turn. A young
            # task's first write may wait for its end (core/journal/defer.py).
            write = self.deferral.split(sched.changed.values(), now)
            sched.changed.clear()
            if write:
                out.actions.append(Record(write))
        book = self.schedules.book
        if book.changed:
            # Right after the tasks its ticks fired: one transaction holds both.
            out.actions.append(ScheduleRecord(book.take_changes()))
        graphs = self.graphs
        if graphs.changed or graphs.changed_nodes:
            out.actions.append(GraphRecord(*graphs.take_changes()))
        if out.work:
            work = out.work[:]  # (the scheduler holds this list: emptied, not replaced)
            out.work.clear()
            self.conversations.turn(work)  # update logs and watchers, before the sends
            flush(st, work, self.tasks.traces)
        if out.after:
            # After the turn's task results: a graph's end follows its last node's.
            out.actions.extend(out.after)
            out.after = []

    def revoke(self, grants: Iterable[bytes], now: float) -> int:
        """Authorized keys changed: drop the live peers whose key is no longer granted."""
        self.state.now = now
        return self.admission.revoke(grants, now)

    def beat(self, now: float) -> None:
        """The queen's heartbeat on PUB (every ``hb_interval``)."""
        st = self.state
        st.now = now
        hb = p.Message("hb", {"epoch": st.epoch, "queen": st.name,
                              "interval": self.registry.hb_interval,
                              "mem_seq": self.memory.seq},
                       frm=st.name, ts=st.wall(now))
        self.out.actions.append(Publish(HB_TOPIC, p.binary.encode(hb)))

    def farewell(self, now: float) -> None:
        """A last heartbeat as the queen stops cleanly: under an epoch of its own, so
        every peer takes the queen for gone at once (and goes to another queen of its
        list, or waits for this one's return) instead of after its heartbeat timeout."""
        st = self.state
        st.now = now
        waiting = self.deferral.flush()
        if waiting:  # a clean stop leaves every task it knows in the journal
            self.out.actions.append(Record(waiting))
        hb = p.Message("hb", {"epoch": f"{st.epoch}.stopped", "queen": st.name,
                              "state": "stopping"}, frm=st.name, ts=st.wall(now))
        self.out.actions.append(Publish(HB_TOPIC, p.binary.encode(hb)))
        # And to each peer directly: a subscription made a moment ago may not have reached
        # the PUB socket yet (a slow joiner), and a peer would wait out its heartbeat
        # timeout to hear what the farewell says.
        for node in list(self.registry.by_id.values()):
            if node.codec != JSON:
                st.send(node, hb)

    def status(self, now: float) -> dict[str, Any]:
        """Registry, queue depths and counters (what ``meshant status`` shows).

        Safe to call from another thread: it reads snapshots (``list()`` of a dict is
        atomic under the GIL) and changes nothing.
        """
        st = self.state
        peers = list(self.registry.by_id.values())
        foragers = [n.record(now) for n in peers if n.role == "forager"]
        info = st.info
        sched = self.scheduler
        return {
            "queen": {"name": st.name, "colony": self.config.colony, "epoch": st.epoch,
                      "advertised": info.advertised, "endpoint": info.endpoint,
                      "pub": info.pub, "pid": info.pid, "host": info.host,
                      "uptime": round(now - info.started, 3),
                      "assign_timeout": sched.assign_timeout,
                      "hb_interval": self.registry.hb_interval,
                      "hb_misses": self.registry.hb_misses},
            "foragers": foragers,
            "clients": sum(1 for n in peers if n.role == "client"),
            "queues": sched.depths(),
            "queued": sched.queued,
            "delayed": sched.delayed,  # (core/tasks/delays.py: not in "queued")
            "limits": sched.limits.state() if sched.limits.active else [],
            "rates": sched.rates.state(now) if sched.rates.active else [],
            "running": sum(f["in_flight"] for f in foragers),
            # Durable tasks waiting with no slot held (a time, an answer, a sub-task).
            "suspended": len(sched.suspended),
            "counters": dict(st.counters),
            "role": "standby" if st.standby is not None else "leader",
            "term": st.term,
            "dead_letters": len(sched.dlq),
            "breakers": sched.breakers.states(),
            "recently_gone": list(self.registry.gone)[-10:],
            "graphs": [g.summary() for g in list(self.graphs.graphs.values())[:100]],
            # The schedules, the soonest to fire first (core/schedules).
            "schedules": len(self.schedules.book),
            "next_schedules": self.schedules.views(20),
            "journal": journal_location(self.config.journal),
        }

    # -- the router -----------------------------------------------------------------------

    def _handle(self, frames: list[bytes], key: bytes | None, now: float) -> None:
        st = self.state
        identity = frames[0]
        try:
            msg, codec = p.decode_any(frames[1:], max_frame=self.config.max_message)
        except p.ProtocolError as e:
            st.counters["protocol_errors"] += 1
            codec = JSON if len(frames) == 2 and frames[1][:1] == b"{" else BINARY
            ref = p.binary.peek_id(frames[1:]) if codec == BINARY else None
            st.error_to(identity, codec, e.code, e.message, ref)
            if e.code == p.errors.TOO_LARGE:
                self.tasks.oversized(identity, frames[1:], now)
            return
        if st.standby is not None:
            if msg.kind != "error":
                # Not this queen's colony now: say so, and where the leader is.
                hint = st.standby
                st.error_to(identity, codec, Code.NOT_LEADER,
                            hint.get("message", "this queen is a standby"), msg.id,
                            **{k: v for k, v in hint.items() if k != "message"})
            return
        node = self.registry.by_id.get(identity)
        if node is not None:
            self.registry.touch(node, now)
            if msg.frm and msg.frm != node.name:
                st.error_to(identity, codec, Code.BAD_FROM,
                            f"'from' is {msg.frm!r} but this peer registered as "
                            f"{node.name!r}", msg.id)
                return
            if len(frames) > 2 and "blobs" not in node.features:
                st.error_to(identity, codec, Code.UNSUPPORTED, "this peer did not negotiate "
                            "'blobs' in its hello: send bytes inline, with no blob frames",
                            msg.id)
                return
            if msg.kind in self._after:
                self._dispatch(Request(identity, node, msg, codec, key, now))
                return
        else:
            before = self._before.get(msg.kind)
            if before is not None:
                before(Arrival(identity, None, msg, codec, key, now))
                return
            if codec == JSON and msg.kind == "hb":
                self.admission.legacy(Arrival(identity, None, msg, codec, key, now))
                return
            if msg.kind in self._after:
                self._unregistered(identity, msg, codec)
                return
        if msg.kind == "error":
            return  # an error is never answered (spec §9): two peers could loop
        st.error_to(identity, codec, Code.UNSUPPORTED,
                    f"the queen does not accept {msg.kind!r} messages", msg.id)

    def _unregistered(self, identity: bytes, msg: p.Message, codec: str) -> None:
        """A message that needs a hello first: expected after a restart or a silence
        (the peer says hello again)."""
        st = self.state
        st.counters["unregistered"] += 1
        if msg.kind == "task.result" and not msg.b.get("partial"):
            # A forager we declared offline sends the result of an attempt we already
            # moved on from: count it as the duplicate it is.
            att = self.scheduler.attempts.get(msg.ref or "")
            if att is not None and not att.live:
                self.scheduler.counters["duplicates"] += 1
        st.error_to(identity, codec, Code.NOT_REGISTERED,
                    "say hello first: this peer is not registered with the queen", msg.id)


__all__ = ["Action", "GraphRecord", "Publish", "QueenConfig", "QueenCore", "Read", "Record",
           "RecordMemory", "Remember", "ScheduleRecord", "Send"]


def journal_location(journal: str | None) -> str | None:
    """The journal as ``status`` names it, for `meshant tasks` and the other readers: a
    file's absolute path, a database URL without its password; None for none."""
    if journal is None or journal == ":memory:":
        return None
    if "://" not in journal:
        return os.path.abspath(journal)
    u = urlsplit(journal)
    if u.password is None:
        return journal
    return urlunsplit(u._replace(netloc=u.netloc.replace(f":{u.password}@", "@", 1)))
