"""Tasks, as the queen core handles them: submissions (validation, idempotency keys,
re-sent ids), foragers' accepts, rejects, progress and results (fenced by attempt),
cancels and status queries.

A service of the queen core (:mod:`meshant.core.queen.router`) over the scheduler. Whether an
id, a key or a finished task is in the journal is the archive index's to say, or a read's
(:mod:`meshant.core.queen.reads`): a handler that may need one has a ``needs_*`` beside it
that declares it, and runs once its answer is in.
"""

from __future__ import annotations

from typing import Any

from meshant import protocol as p
from meshant.core.journal.archive import ArchiveIndex
from meshant.core.journal.defer import Deferral
from meshant.core.queen.outbox import Remember
from meshant.core.queen.reads import ReadKey, Reads
from meshant.core.queen.state import QueenState, Request
from meshant.core.tasks import delays
from meshant.core.tasks.checks import options_problem, progress_problem, result_problem
from meshant.core.tasks.rates import cost_problem
from meshant.core.tasks.scheduler import Attempt, QueueFull, Scheduler, Task, Verdict, revive
from meshant.core.tasks.steps import INLINE_BYTES, child_id, record_problem, size_of
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code

_RESULT = p.BY_NAME["task.result"]


class _Held:
    """What holds a submission back, as checked (``TaskService._held``)."""

    __slots__ = ("cost", "keys", "not_before", "own")

    def __init__(self) -> None:
        self.not_before: float | None = None
        self.own: tuple[str, int] | None = None
        self.keys: list[tuple[int, str]] | None = None
        self.cost: float | None = None
_PROGRESS = p.BY_NAME["task.progress"]
_STEP = p.BY_NAME["task.step"]


class TaskService:
    """Submissions, results and the rest of a task's messages."""

    def __init__(self, state: QueenState, scheduler: Scheduler, index: ArchiveIndex | None,
                 reads: Reads, deferral: Deferral) -> None:
        self.state = state
        self.scheduler = scheduler
        self.index = index  # None: no journal, nothing outside memory
        self.reads = reads
        self.deferral = deferral
        self.journaled = index is not None  # (a queen with a journal has an archive index)
        # Tasks submitted with a W3C traceparent (envelope extension): forwarded on their
        # assignments, forgotten when they finish.
        self.traces: dict[str, str] = {}

    # -- finding tasks --------------------------------------------------------------------

    def task_read(self, task_id: str) -> ReadKey | None:
        """The read that finds task ``task_id`` (None: memory has it, or the journal
        surely has not)."""
        if (self.scheduler.find_live(task_id) is not None or self.index is None
                or not self.index.maybe("t", task_id)):
            return None
        return ("task", task_id)

    def _key_read(self, key: str) -> ReadKey | None:
        if key in self.scheduler.by_key or self.index is None or not self.index.maybe("k", key):
            return None
        return ("key", key)

    def find(self, req: Request, task_id: str) -> Task | None:
        """A task the scheduler holds, else a final one from the journal (a transient
        copy: changing it changes nothing; ``task_read`` declared the read)."""
        task = self.scheduler.find_live(task_id)  # (task_read's test, without repeating it)
        if task is not None or self.index is None or not self.index.maybe("t", task_id):
            return task
        row = self.reads.value(req, "task", task_id)
        if row is None or row["final"] is None:
            return None
        return revive(row, self.scheduler.to_wall)

    def _find_key(self, req: Request, key: str) -> str | None:
        """The id of the task submitted with idempotency key ``key``."""
        read = self._key_read(key)
        if read is None:
            return self.scheduler.by_key.get(key)
        row = self.reads.value(req, *read)
        return row["id"] if row is not None else None

    @staticmethod
    def _answered(req: Request, read: ReadKey) -> bool:
        return req.fetched is not None and read in req.fetched

    def needs_submit(self, req: Request) -> list[ReadKey]:
        """What a submission reads before it is decided: whether its id is a task the
        journal holds (a re-sent submission), else, with a key, the task that key names."""
        msg = req.msg
        read = self.task_read(msg.id)
        if read is not None:
            if not self._answered(req, read):
                return [read]
            row = self.reads.value(req, *read)
            if row is not None and row["final"] is not None:
                return [read]  # the same task, finished: nothing more to read
        key = msg.b.get("key")
        if not isinstance(key, str) or not 0 < len(key) <= 200:
            return [read] if read is not None else []
        wanted = [read] if read is not None else []
        kread = self._key_read(key)
        if kread is not None:
            wanted.append(kread)
            if not self._answered(req, kread):
                return wanted
            row = self.reads.value(req, *kread)
            first = row["id"] if row is not None else None
        else:
            first = self.scheduler.by_key.get(key)
        tread = self.task_read(first) if first is not None else None
        if tread is not None:
            wanted.append(tread)
        return wanted

    def needs_task(self, req: Request) -> list[ReadKey]:
        """The task a request names (``task``, else ``ref``): status, an attach."""
        read = self.task_read(str(req.msg.b.get("task") or req.msg.ref))
        return [read] if read is not None else []

    def needs_cancel(self, req: Request) -> list[ReadKey]:
        """A cancel waiting for its verdict of a task no longer running: its state."""
        b = req.msg.b
        task_id = b.get("task") or req.msg.ref
        if b.get("ack") is not True or (isinstance(task_id, str)
                                        and task_id in self.scheduler.tasks):
            return []
        return self.needs_task(req)

    def taken(self, task_id: str) -> bool:
        """Whether a task id may exist (in memory, or perhaps in the journal)."""
        return self.scheduler.find_live(task_id) is not None or (
            self.index is not None and self.index.maybe("t", task_id))

    # -- submissions ----------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        st, msg, node, now = self.state, req.msg, req.node, req.now
        slow = st.rates.wait(req.identity, now, st.config.submit_rate)
        if slow:
            st.counters["rate_limited"] += 1
            st.refuse(req, Code.RATE_LIMITED,
                      f"more than {st.config.submit_rate:g} submissions per second from "
                      "this peer: slow down", retry_after=round(slow, 4))
            return
        body = msg.b
        known = self.find(req, msg.id)
        if known is not None:
            self._resubmitted(req, known)
            return
        problem = options_problem(body)
        held: _Held | None = None
        sched = self.scheduler
        if problem is None and (sched.limits.rules or sched.rates.rules or "at" in body
                                or "after" in body or "concurrency" in body
                                or "cost" in body):
            held = _Held()  # (the plain path pays for none of this: #32)
            problem = self._held(body, st.wall(now), held)
        if problem is not None:
            st.refuse(req, Code.BAD_VALUE, problem)
            return
        key = body.get("key")
        if key is not None:
            if not isinstance(key, str) or not 0 < len(key) <= 200:
                st.refuse(req, Code.BAD_VALUE,
                          "an idempotency key is a string of 1-200 characters")
                return
            first = self._find_key(req, key)  # in memory, else in the journal
            if first is not None and self._attach(req, first):
                return
        task = self._task(msg.id, body["capability"], body.get("payload"), body, req.identity,
                          node.name)
        task.key = key
        task.defer = (key is None and req.codec == BINARY and node.role == "client"
                      and not body.get("ack"))
        if held is not None:
            task.not_before = held.not_before
            task.concurrency = held.own
            task.limit_keys = held.keys
            task.cost = held.cost
            if held.not_before is not None:
                task.defer = False  # a delayed task is journaled at once
        try:
            self.scheduler.submit(task, now)
        except QueueFull as e:
            st.refuse(req, Code.QUEUE_FULL, f"queue full: {e}")
            return
        if self.index is not None:
            self.index.add("t", task.id)
            if key is not None:
                self.index.add("k", key)
        tp = msg.extra.get("traceparent") if msg.extra else None
        if isinstance(tp, str) and len(tp) <= 128:
            self.traces[task.id] = tp
        if body.get("ack"):
            # Sent after this turn's assignments go out: the assign is on the critical
            # path of the task, the acknowledgement is not.
            st.later(node, p.Message("task.submitted", {"task": task.id}, ref=msg.id))

    def scheduled(self, task_id: str, capability: str, payload: Any, options: dict[str, Any],
                  key: str, client_name: str, now: float) -> Task | str:
        """A task a schedule's tick submits (core/schedules): journaled at once, with the
        tick's idempotency key; no peer follows it (its result is the journal's). The
        task, or why it could not be submitted."""
        held = _Held()
        problem = self.options_refused(capability, payload, options, held)
        if problem is not None:
            return problem
        task = self._task(task_id, capability, payload, options, b"", client_name)
        task.key = key
        task.concurrency, task.limit_keys, task.cost = held.own, held.keys, held.cost
        try:
            self.scheduler.submit(task, now)
        except QueueFull as e:
            return f"queue full: {e}"
        if self.index is not None:
            self.index.add("t", task.id)
            self.index.add("k", key)
        return task

    def options_refused(self, capability: str, payload: Any, options: dict[str, Any],
                        held: _Held | None = None) -> str | None:
        """Why a task of ``capability`` with ``payload`` and submission ``options`` (no
        delay among them) would be refused, or None (``held``: what holds it back)."""
        body = {"capability": capability, **options}
        problem = options_problem(body)
        if problem is None:
            problem = self._held({**body, "payload": payload}, 0.0, held or _Held())
        return problem

    def _held(self, body: dict[str, Any], wall: float, out: _Held) -> str | None:
        """What holds a submission back — its delay (core/tasks/delays.py), its limits'
        keys (limits.py), its cost for the rate limits (rates.py) — into ``out``; or
        what is wrong with them."""
        if "at" in body or "after" in body:
            problem = delays.delay_problem(body)
            if problem is not None:
                return problem
            out.not_before = delays.not_before(body, wall)
            if out.not_before is not None:
                problem = delays.too_far(out.not_before, wall)
                if problem is not None:
                    return problem
        own = body.get("concurrency")
        limits = self.scheduler.limits
        if limits.rules or own is not None:
            # (a key its limits draw from must be there)
            keys: list[tuple[int, str]] = []
            problem = limits.problem(body["capability"], body.get("labels") or {},
                                     body.get("payload"), own, keys)
            if problem is not None:
                return problem
            if own is not None:
                out.own = (own["key"], own["max"])
            else:
                out.keys = keys
        if "cost" in body:
            problem = cost_problem(body["cost"])
            if problem is not None:
                return problem
            out.cost = float(body["cost"])
        if self.scheduler.rates.rules:
            return self.scheduler.rates.problem(body["capability"], body.get("labels") or {},
                                                body.get("payload"))
        return None

    def _task(self, task_id: str, capability: str, payload: Any, o: dict[str, Any],
              client: bytes, client_name: str) -> Task:
        """A new task with submission options ``o`` (checked: ``options_problem``)."""
        retry_on = o.get("retry_on")
        return Task(id=task_id, capability=capability, payload=payload, client=client,
                    client_name=client_name, priority=o.get("priority", 50),
                    timeout=o.get("timeout"), to=o.get("to"),
                    labels=dict(o.get("labels") or {}), max_attempts=o.get("max_attempts", 3),
                    wait=o.get("wait", self.state.config.no_forager_wait),
                    retry_base=o.get("retry_base"), retry_cap=o.get("retry_cap"),
                    retry_on=tuple(retry_on) if retry_on else None)

    def _resubmitted(self, req: Request, task: Task) -> None:
        """A submission whose id the queen holds: its client sending it again after a
        reconnect. The same task, not a new one: its results go to the client's current
        connection, and a result it may have missed is sent now."""
        st, msg, node = self.state, req.msg, req.node
        if task.client_name != node.name:
            st.refuse(req, Code.DUPLICATE_TASK, f"a task with id {msg.id!r} was submitted by "
                      "another client: task ids must be unique in the colony")
            return
        st.counters["resubmitted"] += 1
        self.scheduler.follow(task, req.identity)
        if task.final is not None:
            # After this turn's record: the task may have finished in this very turn.
            st.later(node, p.Message("task.result", task.final, ref=task.id))
        elif msg.b.get("ack"):
            # Perhaps still waiting for its first journal write (core/journal/defer.py):
            # an acknowledgement promises durability, so the task is written this turn.
            self.scheduler.journal_now(task)
            st.later(node, p.Message("task.submitted", {"task": task.id}, ref=msg.id))

    def _attach(self, req: Request, task_id: str) -> bool:
        """A submission repeating an idempotency key: attach it to the task it names (or
        answer with its result) instead of running the work again. False: no such task."""
        st, msg, node = self.state, req.msg, req.node
        task = self.find(req, task_id)
        if task is None:
            return False
        if task.final is not None:
            st.later(node, p.Message("task.result", {
                **task.final, "task": msg.id, "original": task.id}, ref=msg.id))
        else:
            task.watchers.append((req.identity, node.name, msg.id))
            if msg.b.get("ack"):
                st.later(node, p.Message("task.submitted", {"task": msg.id,
                                                            "original": task.id}, ref=msg.id))
        st.counters["idempotent_hits"] += 1
        return True

    # -- foragers' answers ----------------------------------------------------------------

    def attempt(self, req: Request, ref: str | None) -> Attempt | None:
        """The attempt a forager's message is about, if it is the current one; else
        None, and the forager is told (unless it is a duplicate: that is expected)."""
        st = self.state
        verdict, att = self.scheduler.lookup(req.node, ref)
        if verdict is Verdict.OK:
            return att
        if verdict is Verdict.DUPLICATE:
            return None
        if verdict is Verdict.FOREIGN:
            st.counters["protocol_errors"] += 1
            st.refuse(req, Code.NOT_YOURS, f"assign {ref!r} belongs to another forager")
        else:
            self.scheduler.counters["unknown_results"] += 1
            st.refuse(req, Code.UNKNOWN_TASK, f"no assign {ref!r} is known for this forager",
                      **({"assign": ref} if ref is not None else {}))
        return None

    def accept(self, req: Request) -> None:
        att = self.attempt(req, req.msg.ref)
        if att is not None:
            self.scheduler.accept(att, req.now)

    def reject(self, req: Request) -> None:
        att = self.attempt(req, req.msg.ref)
        if att is not None:
            self.scheduler.reject(att, req.msg.b["reason"], req.now)
        else:
            self._release(req, req.msg.ref)

    # -- durable agents -------------------------------------------------------------------

    def step(self, req: Request) -> None:
        """A handler's step ran: its record is kept with the task (journaled before
        anything that follows it leaves)."""
        self._step(req, req.msg.ref, req.msg.b)

    def _step(self, req: Request, ref: str | None, body: dict[str, Any]) -> None:
        if self._refused(req, None, ref, "steps"):
            return
        att = self.attempt(req, ref)
        if att is None:
            return
        if self._refused(req, record_problem(body, att.task.steps), ref):
            return
        rec = self.scheduler.record_step(att, body, req.now)
        if rec is not None and self.journaled:
            self.state.out.actions.append(Remember(steps=[(att.task.id, att.number,
                                                           body.get("n", 0), rec)]))

    def steps(self, req: Request) -> None:
        """A re-run asks its task's recorded steps (too many to go with its
        assignment): they go in slices of at most INLINE_BYTES."""
        ref = req.msg.ref
        if self._refused(req, None, ref, "steps"):
            return
        att = self.attempt(req, ref)
        if att is None:
            return
        recs = att.task.steps or []
        total = len(recs)
        st = self.state
        start, size = 0, 0
        for i, rec in enumerate(recs):
            n = size_of(rec)
            if i > start and size + n > INLINE_BYTES:
                st.send(req.node, p.Message("task.steps", {"task": att.task.id, "total": total,
                                                           "from": start,
                                                           "steps": recs[start:i]}, ref=ref))
                start, size = i, 0
            size += n
        st.send(req.node, p.Message("task.steps", {"task": att.task.id, "total": total,
                                                   "from": start, "steps": recs[start:]},
                                    ref=ref))

    def needs_call(self, req: Request) -> list[ReadKey]:
        """A sub-task called again (by a re-run) may have ended long ago: its row."""
        att = self.scheduler.attempts.get(req.msg.ref or "")
        pos = req.msg.b.get("position")
        if att is None or pos.__class__ is not int:
            return []
        read = self.task_read(child_id(att.task.id, pos))
        return [read] if read is not None else []

    def call(self, req: Request) -> None:
        """A handler calls a sub-task at a step position: one child per (parent,
        position). Called again by a later run, the same child: its result at once if it
        ended, else it goes on, its result to this run."""
        st, msg, now = self.state, req.msg, req.now
        ref, body = msg.ref, msg.b
        if self._refused(req, None, ref, "steps"):
            return
        att = self.attempt(req, ref)
        if att is None:
            return
        parent = att.task
        options = body.get("options") or {}
        problem = ("options is a map" if not isinstance(options, dict)
                   else options_problem(options))
        if problem is not None or body["position"] < 0:
            self._refused(req, problem or "a call's position is >= 0", ref)
            return
        cid = child_id(parent.id, body["position"])
        known = self.find(req, cid)
        if known is not None and known.parent != parent.id:
            # (a submission that took the id first: not this task's sub-task)
            self._refused(req, f"task id {cid} is taken by a task that is not a sub-task "
                          f"of {parent.id}", ref)
            return
        if known is not None:
            reply: dict[str, Any] = {"child": cid, "state": known.state}
            if known.final is not None:
                reply["final"] = known.final
            # After this turn's record: the child may have ended in this very turn.
            st.later(req.node, p.Message("task.called", reply, ref=msg.id))
            return
        capability = body["capability"]
        if not st.registry.serving(capability):
            served = sorted(st.registry.by_tool)
            st.counters["protocol_errors"] += 1
            st.refuse(req, Code.NO_FORAGER, f"no forager offers capability {capability!r} "
                      "for a sub-task" + (f" (offered now: {', '.join(served)})" if served
                                           else ""), assign=ref)
            return
        child = self._task(cid, capability, body.get("payload"), options, req.identity,
                           parent.client_name)
        child.parent = parent.id
        try:
            self.scheduler.add_child(parent, child, now)
        except QueueFull as e:
            st.refuse(req, Code.QUEUE_FULL, f"queue full: {e}", assign=ref)
            return
        if self.index is not None:
            self.index.add("t", cid)
        tp = self.traces.get(parent.id)
        if tp is not None:
            self.traces[cid] = tp  # the sub-task's spans beside its parent's
        st.later(req.node, p.Message("task.called", {"child": cid, "state": child.state},
                                     ref=msg.id))

    def _refused(self, req: Request, problem: str | None, ref: str | None,
                 feature: str | None = None) -> bool:
        """Answer a forager's malformed (or not negotiated) answer; True if it was one.
        It changes nothing: the attempt stays current, its lease is not renewed."""
        st, msg = self.state, req.msg
        if feature is not None and feature not in req.node.features:
            st.counters["protocol_errors"] += 1
            st.refuse(req, Code.UNSUPPORTED,
                      f"this peer did not negotiate {feature!r}: no {msg.kind}"
                      + (" with partial: true" if msg.kind == "task.result" else ""),
                      **({"assign": ref} if ref is not None else {}))
            return True
        if problem is None:
            return False
        st.counters["protocol_errors"] += 1
        st.refuse(req, Code.BAD_VALUE, problem, **({"assign": ref} if ref is not None else {}))
        return True

    def progress(self, req: Request) -> None:
        self._progress(req, req.msg.ref, req.msg.b)

    def _progress(self, req: Request, ref: str | None, body: dict[str, Any]) -> None:
        if self._refused(req, progress_problem(body), ref, "progress"):
            return
        att = self.attempt(req, ref)
        if att is not None:
            self.scheduler.progress(att, body, req.now)

    def result(self, req: Request) -> None:
        self._result(req, req.msg.ref, req.msg.b)

    def _result(self, req: Request, ref: str | None, body: dict[str, Any]) -> None:
        problem = result_problem(body, req.codec)
        partial = body.get("partial")
        status = body.get("status")
        # (A well-formed final one, nearly every result, needs no feature: no call.)
        if (problem is not None or partial or status == "suspended") and self._refused(
                req, problem, ref, "progress" if partial else "steps"
                if status == "suspended" else None):
            return
        stale = req.node.stale
        if stale and ref in stale:
            # An old run's answer (see Node.stale): dropped, as a duplicate.
            if not partial and ref is not None:
                self.scheduler.stale_final(req.node, ref)
            return
        att = self.attempt(req, ref)
        if att is not None:
            self.scheduler.result(att, body, req.now)
        elif not partial:
            self._release(req, ref)

    def _release(self, req: Request, ref: str | None) -> None:
        sched = self.scheduler
        att = sched.attempts.get(ref) if ref is not None else None
        if att is None or att.node.name != req.node.name or att.live:
            return
        sched.late_final(att)  # a final answer for an abandoned attempt

    def batch(self, req: Request) -> None:
        st = self.state
        if self._refused(req, None, None, "batch"):
            return
        for item in req.msg.b["results"]:
            if not isinstance(item, dict) or not isinstance(item.get("ref"), str):
                st.counters["protocol_errors"] += 1
                st.refuse(req, Code.BAD_TYPE, "each batched result must be a map with a 'ref'")
                continue
            kind = item.get("kind", "task.result")
            if kind == "task.progress" and "batch.progress" in req.node.features:
                spec = _PROGRESS
            elif kind == "task.step" and "steps" in req.node.features:
                spec = _STEP
                # (a record's own kind travels as "step": "kind" names the item's, §2.4)
                item = {**item, "kind": item.get("step")}
            elif kind == "task.result":
                spec = _RESULT
            else:
                st.counters["protocol_errors"] += 1
                st.refuse(req, Code.UNSUPPORTED if kind in ("task.progress", "task.step")
                          else Code.BAD_VALUE,
                          f"a batched item of kind {kind!r}: items are task.result bodies, "
                          "task.progress ones with batch.progress negotiated, task.step "
                          "ones with steps (§2.4)",
                          assign=item["ref"])
                continue
            try:
                p.validate_body(spec, item)  # an item is a full body of its kind (§2.4)
            except p.ProtocolError as e:
                st.counters["protocol_errors"] += 1
                st.refuse(req, e.code, e.message, assign=item["ref"])
                continue
            if spec is _PROGRESS:
                self._progress(req, item["ref"], item)
            elif spec is _STEP:
                self._step(req, item["ref"], item)
            else:
                self._result(req, item["ref"], item)

    def oversized(self, identity: bytes, frames: list[bytes], now: float) -> None:
        """A forager's result over the limit (libzmq let it through, just): the task
        fails at once with too-large, rather than wait out its lease and run again."""
        node = self.state.registry.by_id.get(identity)
        if node is None or node.role != "forager":
            return
        limit = self.state.config.max_message
        try:
            msg = p.decode_any(frames, max_frame=limit + 65536)[0]
        except p.ProtocolError:
            return
        size = max(len(f) for f in frames)
        if msg.kind == "task.result" and not msg.b.get("partial"):
            refs = [msg.ref]
        elif msg.kind == "task.batch":
            refs = [i.get("ref") for i in msg.b["results"] if isinstance(i, dict)
                    and not i.get("partial") and "kind" not in i]
        else:
            return
        for ref in refs:
            verdict, att = self.scheduler.lookup(node, ref if isinstance(ref, str) else None)
            if verdict is Verdict.OK and att is not None:
                self.scheduler.too_large(att, f"the result from {node.name} is {size:,} bytes, "
                                         f"over the queen's limit of {limit:,} (--max-message)",
                                         now)

    # -- clients' requests ----------------------------------------------------------------

    def cancel(self, req: Request) -> None:
        msg = req.msg
        task_id = msg.b.get("task") or msg.ref
        task = self.scheduler.tasks.get(task_id) if isinstance(task_id, str) else None
        ack = msg.b.get("ack") is True
        if task is None or (ack and task.final is not None):
            if ack:  # an ended task (or none): its state says so, or unknown-task
                self.status(req)
            else:
                self.state.refuse(req, Code.UNKNOWN_TASK, f"no running task {task_id!r}")
            return
        # Anyone's task, as rights allow (core/rights.py: with CURVE, its submitter or an
        # admin): `meshant cancel` is a client of its own.
        if task.client != req.identity and self.state.forbidden(
                req, "task.cancel", task.client_name == req.node.name):
            return
        self.scheduler.cancel(task.id, req.now)
        if ack:
            self.status(req)  # the verdict: what the task became (cancelled)

    def status(self, req: Request) -> None:
        st, node, now = self.state, req.node, req.now
        task_id = str(req.msg.b.get("task") or req.msg.ref)
        task = self.find(req, task_id)
        if task is None:
            st.refuse(req, Code.UNKNOWN_TASK, f"no task {task_id!r}")
            return
        if task.client_name == node.name and task.client != req.identity and task.final is None:
            # Its submitter reconnected: results go to the new link.
            self.scheduler.follow(task, req.identity)
        body: dict[str, Any] = {
            "task": task.id, "state": task.state, "attempt": task.attempt,
            "capability": task.capability, "priority": task.priority,
            "forager": task.current.node.name if task.current else None,
            "age": round(now - task.submitted, 3),
            "history": [[round(t - task.submitted, 6), s, w] for t, s, w in task.history],
        }
        if task.steps:
            body["steps"] = [{k: v for k, v in r.items() if k in ("position", "kind", "name",
                                                                   "occurrence", "child")}
                             | ({"error": r["error"].get("type")} if r.get("error") else {})
                             for r in task.steps]
        if task.children:
            body["children"] = list(task.children)
        if task.parent is not None:
            body["parent"] = task.parent
        if task.wake is not None:
            body["waiting"] = task.wake
        if task.not_before is not None:
            body["not_before"] = task.not_before  # (wall clock; delayed until then)
        held = (self.scheduler.limits.why(task) or self.scheduler.rates.why(task, now)
                ) if task.state == "queued" else None
        if held is not None:
            body["held"] = held  # which limit it waits for, and how full it is
        reply = p.Message("task.state", body, ref=req.msg.id)
        if task.final is not None and task.client_name == node.name:
            body["final"] = task.final  # lets a reconnected submitter collect a result it missed
            # After this turn's record: the task may have finished in this very turn.
            st.later(node, reply)
            return
        st.send(node, reply)


__all__ = ["TaskService"]
