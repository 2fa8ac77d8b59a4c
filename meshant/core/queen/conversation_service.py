"""The queen core's conversations: tasks that ask for input and are answered, streams any
peer with the right may attach to from a cursor, and durable inboxes for names that are
not connected.

A service of the queen core (:mod:`meshant.core.queen.router`). The data structures are
:mod:`meshant.core.conversations.model` and :mod:`meshant.core.conversations.inbox`; what
the journal must keep leaves as :class:`~meshant.core.queen.outbox.Remember` actions, each
before what depends on it is sent.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from meshant import protocol as p
from meshant.core.conversations.inbox import Inboxes, Kept
from meshant.core.conversations.model import (
    MAX_QUESTIONS,
    CursorExpired,
    Question,
    Questions,
    UpdateLogs,
    size_of,
)
from meshant.core.journal.archive import Restored
from meshant.core.nodes.registry import Node
from meshant.core.queen.outbox import Remember
from meshant.core.queen.reads import ReadKey, Reads
from meshant.core.queen.state import QueenState, Request
from meshant.core.queen.task_service import TaskService
from meshant.core.tasks.model import SUSPENDED, Task
from meshant.core.tasks.scheduler import Scheduler
from meshant.core.tasks.work import Deliver, Work
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code

_UPDATE_KINDS = frozenset({"task.progress", "task.result", "task.ask"})
MAX_ATTACHED = 10_000  # attachments to live tasks, all together
PROMPT_NOTE = 60  # characters of a prompt the timeline keeps


class ConversationService:
    """Questions and answers, attachable update logs, durable inboxes."""

    def __init__(self, state: QueenState, scheduler: Scheduler, tasks: TaskService,
                 reads: Reads, restored: Restored | None) -> None:
        self.state = state
        self.scheduler = scheduler
        self.tasks = tasks
        self.reads = reads
        self.journaled = restored is not None
        self.questions = Questions()
        self.update_logs = UpdateLogs()
        self.inboxes = Inboxes()
        # Who follows each live task: its connection and the cursor it attached from (it
        # is sent only what comes after it).
        self.attached: dict[str, dict[bytes, int]] = {}
        self._n_attached = 0
        self._next_expiry = 0.0
        scheduler.on_suspend = self._suspended
        if restored is not None:
            self._restore(restored)

    def _suspended(self, task: Task, now: float) -> None:
        """A task suspends on a durable ask: the question comes with the suspension (one
        message: a queen that takes one takes the other), asked now unless known (a
        re-run asking it again). Answered already, it is recorded and the task wakes."""
        wake = task.wake or {}
        request = wake.get("request")
        if not isinstance(request, str):
            return
        prompt, data = wake.pop("prompt", None), wake.pop("data", None)
        q = self.questions.get(task.id, request)
        if q is None:
            q = Question(task=task.id, request=request, attempt="", prompt=prompt, data=data,
                         asked=self.state.wall(now))
            self.questions.add(q)
            self._remember(questions=[q.row()])
            body: dict[str, Any] = {"request": request, "prompt": prompt}
            if data is not None:
                body["data"] = data
            self.scheduler.note(task, now, "asked", f"{request}: "
                                f"{prompt[:PROMPT_NOTE] if isinstance(prompt, str) else '(input)'}")
            self.scheduler.deliver(task, "task.ask", body)
            return
        if not q.answered:
            return
        record = {"position": wake["position"], "kind": "ask", "name": wake["name"],
                  "occurrence": wake["occurrence"], "request": q.request, "value": q.answer}
        rec = self.scheduler.answer_step(task, record, now)
        if rec is not None:
            self._remember(steps=[(task.id, task.attempt, 0, rec)])

    def _restore(self, r: Restored) -> None:
        """Take back the questions, inboxes and update cursors that belong with the tasks
        the scheduler restored."""
        tasks = self.scheduler.tasks
        for row in r.questions:
            if row["task"] in tasks:
                self.questions.add(Question(**row))
        ib = self.inboxes
        for row in r.kept:
            # As kept before the restart, even past a bound lowered since.
            k = Kept(id=row["id"], to=row["to"], kind=row["kind"], frm=row["from"],
                     body=row["body"], sent=row["sent"], expires=row["expires"],
                     size=row["size"], receipt=row["receipt"], ord=row["ord"])
            ib.boxes.setdefault(k.to, deque()).append(k)
            ib.sizes[k.to] = ib.sizes.get(k.to, 0) + k.size
            ib.next_ord = max(ib.next_ord, k.ord + 1)
        # Sequence numbers go on from the last journaled update, so a watcher's cursor
        # (and a submitter's dedup) still means the same after a restart.
        for task_id, seq in r.last_seqs.items():
            if task_id in tasks:
                tasks[task_id].seq = max(tasks[task_id].seq, seq)
        # What the forager of a held attempt need not send again (the welcome says it).
        for task_id, (attempt, n) in r.marks.items():
            task = tasks.get(task_id)
            att = task.current if task is not None else None
            if att is not None and att.number == attempt:
                att.n = max(att.n, n)

    def _remember(self, **what: Any) -> None:
        if self.journaled:
            self.state.out.actions.append(Remember(**what))

    # -- questions ------------------------------------------------------------------------

    def ask(self, req: Request) -> None:
        att = self.tasks.attempt(req, req.msg.ref)
        if att is None:
            return
        st, node, now = self.state, req.node, req.now
        task: Task = att.task
        b = req.msg.b
        request = b["request"]
        sched = self.scheduler
        q = self.questions.get(task.id, request)
        if b.get("withdraw"):
            if q is not None and not (q.answered or q.withdrawn):
                q.withdrawn = True
                self._remember(questions=[q.row()])
                sched.note(task, now, "withdrawn", f"{request}: the handler stopped waiting")
                self._resume(task, now)
                sched.deliver(task, "task.ask", {"request": request, "withdraw": True})
            return
        if q is not None:
            if q.answered and q.attempt == att.id:
                # Asked again (the forager reconnected, or the queen restarted): the
                # answer it may have missed goes again; its handler takes the first.
                st.later(node, self._answer_msg(task, q, att.id))
            return
        if len(self.questions.pending(task.id)) >= MAX_QUESTIONS:
            st.refuse(req, Code.QUEUE_FULL, f"task {task.id} already waits on "
                      f"{MAX_QUESTIONS} questions: answer or withdraw some")
            return
        size = size_of(b.get("prompt")) + size_of(b.get("data"))
        limit = st.config.mem_max_value
        if size > limit:
            st.refuse(req, Code.TOO_LARGE, f"a question's prompt and data are {size:,} "
                      f"bytes, over {limit:,} (--mem-max-value): send large data as the "
                      "task's result")
            return
        q = Question(task=task.id, request=request, attempt=att.id, prompt=b.get("prompt"),
                     data=b.get("data"), asked=st.wall(now))
        self.questions.add(q)
        self._remember(questions=[q.row()])
        prompt = q.prompt if isinstance(q.prompt, str) else "(input)"
        sched.asked(att, now, f"{request}: {prompt[:PROMPT_NOTE]}")
        body = {"request": request, "prompt": q.prompt}
        if q.data is not None:
            body["data"] = q.data
        if "timeout" in b:
            body["timeout"] = b["timeout"]
        sched.deliver(task, "task.ask", body)

    def _waiting(self, task: Task) -> list[Question]:
        """The task's questions its current attempt still waits on, oldest first."""
        current = task.current.id if task.current is not None else None
        return [q for q in self.questions.pending(task.id) if q.attempt == current]

    def _resume(self, task: Task, now: float) -> None:
        if not self._waiting(task):
            self.scheduler.input_received(task, now)

    @staticmethod
    def _answer_msg(task: Task, q: Question, ref: str) -> p.Message:
        return p.Message("task.answer", {"task": task.id, "request": q.request,
                                         "value": q.answer, "by": q.by}, ref=ref)

    def answer(self, req: Request) -> None:
        st, node, now = self.state, req.node, req.now
        b = req.msg.b
        task_id = b["task"]
        task = self.scheduler.tasks.get(task_id)
        if task is None:
            done = self.tasks.find(req, task_id)
            st.refuse(req, Code.UNKNOWN_TASK, f"task {task_id!r} has finished: it takes no "
                      "answers" if done is not None else f"no task {task_id!r}")
            return
        if st.forbidden(req, "task.answer", owner=task.client_name == node.name):
            return
        request = b.get("request")
        current = task.current.id if task.current is not None else None
        if request is None and task.state == SUSPENDED and task.wake is not None:
            request = task.wake.get("request")  # (a durable ask's: no attempt runs)
        if request is None:
            pending = self._waiting(task)
            request = pending[0].request if pending else None
        q = self.questions.get(task.id, request) if request is not None else None
        if q is None:
            st.refuse(req, Code.UNKNOWN_QUESTION, f"task {task_id!r} is not waiting for input"
                      if request is None else f"task {task_id!r} asked no question {request!r}")
            return
        if q.answered:
            st.refuse(req, Code.ALREADY_ANSWERED, f"question {q.request!r} of task "
                      f"{task_id!r} was answered already (by {q.by})")
            return
        wake = task.wake
        if task.state == SUSPENDED and wake is not None and wake.get("request") == q.request:
            self._answer_suspended(req, task, q, wake)
            return
        if q.withdrawn or q.attempt != current:
            st.refuse(req, Code.UNKNOWN_QUESTION, f"question {q.request!r} of task "
                      f"{task_id!r} is closed: its handler stopped waiting (timeout, or the "
                      "attempt ended)")
            return
        q.answered = True
        q.answer = b.get("value")
        q.by = node.name
        self._remember(questions=[q.row()])  # durable before the forager acts on it
        self.scheduler.note(task, now, "answered", f"{q.request} by {node.name}")
        self._resume(task, now)
        att = task.current
        if att is not None and att.node.identity:
            st.later(att.node, self._answer_msg(task, q, att.id))
        # Otherwise its forager is away (or the queen restarted): it asks again on its
        # return, and is answered then.
        st.send(node, p.Message("task.answered", {"task": task.id, "request": q.request},
                                ref=req.msg.id))

    def _answer_suspended(self, req: Request, task: Task, q: Question,
                          wake: dict[str, Any]) -> None:
        """The answer a suspended task (a durable ask) waits for: it becomes the record
        of the step that asked, durable before the task runs again to read it."""
        st, node, now = self.state, req.node, req.now
        q.answered = True
        q.answer = req.msg.b.get("value")
        q.by = node.name
        record = {"position": wake["position"], "kind": "ask", "name": wake["name"],
                  "occurrence": wake["occurrence"], "request": q.request, "value": q.answer}
        self.scheduler.note(task, now, "answered", f"{q.request} by {node.name}")
        rec = self.scheduler.answer_step(task, record, now)
        self._remember(questions=[q.row()],
                       steps=[(task.id, task.attempt, 0, rec)] if rec is not None else [])
        st.send(node, p.Message("task.answered", {"task": task.id, "request": q.request},
                                ref=req.msg.id))

    # -- attachable streams ---------------------------------------------------------------

    def needs_answer(self, req: Request) -> list[ReadKey]:
        """An answer to a task no longer running: whether it ever was (what to say)."""
        if req.msg.b["task"] in self.scheduler.tasks:
            return []
        return self.tasks.needs_task(req)

    def needs_attach(self, req: Request) -> list[ReadKey]:
        """The task attached to (from the journal, if finished and gone from memory),
        then its updates after the cursor, if the journal has more than memory."""
        wanted = self.tasks.needs_task(req)
        if wanted and (req.fetched is None or wanted[0] not in req.fetched):
            return wanted
        task = self.tasks.find(req, req.msg.b["task"])
        after = req.msg.b.get("after", 0)
        if task is not None and after >= 0:
            read = self._updates_read(task, after)
            if read is not None:
                wanted.append(read)
        return wanted

    def attach(self, req: Request) -> None:
        st, node = self.state, req.node
        b = req.msg.b
        task = self.tasks.find(req, b["task"])
        if task is None:
            st.refuse(req, Code.UNKNOWN_TASK, f"no task {b['task']!r}")
            return
        if st.forbidden(req, "task.attach", owner=task.client_name == node.name):
            return
        after = b.get("after", 0)
        if after < 0:
            st.refuse(req, Code.BAD_VALUE, "after is a sequence number >= 0")
            return
        try:
            items = self._updates_since(req, task, after)
        except CursorExpired as e:
            st.refuse(req, Code.CURSOR_EXPIRED, str(e), cursor=e.cursor)
            return
        final = task.final
        if final is None and self._n_attached >= MAX_ATTACHED:
            st.refuse(req, Code.QUEUE_FULL, f"the queen follows at most {MAX_ATTACHED} "
                      "attachments: try again later")
            return
        last = final["seq"] if final is not None else task.seq
        replies = [p.Message("task.attached", {"task": task.id, "state": task.state,
                                               "after": after, "last": last}, ref=req.msg.id)]
        replies += [self._update_msg(task.id, seq, kind, body) for seq, kind, body in items]
        if final is not None:
            if final.get("seq", 0) > after:
                replies.append(self._update_msg(task.id, final["seq"], "task.result", final))
            # After this turn's record: the task may have finished in this very turn.
            for r in replies:
                st.later(node, r)
            return
        for r in replies:
            st.send(node, r)
        watchers = self.attached.setdefault(task.id, {})
        if req.identity not in watchers:
            self._n_attached += 1
        watchers[req.identity] = after

    @staticmethod
    def _update_msg(task_id: str, seq: int, kind: str, body: dict[str, Any]) -> p.Message:
        return p.Message("task.update", {"task": task_id, "seq": seq, "kind": kind,
                                         "body": body}, ref=task_id)

    def _updates_read(self, task: Task, after: int) -> ReadKey | None:
        """The read of a task's journaled updates, when memory may not hold all those
        after ``after`` (taken back from the journal, or its log evicted)."""
        log = self.update_logs.logs.get(task.id)
        if self.journaled and (log is None or (log.behind and after < log.dropped)):
            return ("updates", task.id)
        return None

    def _updates_since(self, req: Request, task: Task,
                       after: int) -> list[tuple[int, str, dict[str, Any]]]:
        logs = self.update_logs
        read = self._updates_read(task, after)
        if read is not None:
            rows = self.reads.value(req, *read)
            log = logs.logs.get(task.id)
            if rows and (log is None or log.behind):
                logs.load(task.id, rows, dropped=rows[0][0] - 1)
        if task.id not in logs.logs:
            last = (task.final or {}).get("seq", task.seq + 1) - 1
            if after < last:
                raise CursorExpired(f"updates {after + 1}-{last} of task {task.id} are no "
                                    f"longer kept: attach with after >= {last}", last)
            return []
        return logs.since(task.id, after)

    def turn(self, work: list[Work]) -> None:
        """Before this turn's deliveries leave: keep each update in its task's log (and
        the journal), copy it to the task's watchers, close what a final result ends."""
        journal: list[tuple[str, int, str, dict[str, Any]]] = []
        st = self.state
        for w in work:
            match w:
                case Deliver(task=task, kind=kind, body=body) if kind in _UPDATE_KINDS:
                    pass
                case _:
                    continue
            final = kind == "task.result" and not body.get("partial")
            if not final:
                if self.journaled:  # taken back, or its log evicted: the journal has more
                    self.update_logs.begin_behind(task.id, body["seq"])
                self.update_logs.add(task.id, body["seq"], kind, body)
                journal.append((task.id, body["seq"], kind, body))
            watchers = self.attached.get(task.id)
            if watchers:
                seq = body["seq"]
                msg = self._update_msg(task.id, seq, kind, body)
                for identity, after in watchers.items():
                    if seq > after:
                        st.send_to(identity, BINARY, msg)
            if final:
                if watchers is not None:
                    self._n_attached -= len(watchers)
                    del self.attached[task.id]
                self.questions.drop(task.id)
        if journal:
            self._remember(updates=journal)

    # -- durable inboxes ------------------------------------------------------------------

    def keep(self, req: Request, missing: list[str]) -> bool:
        """Keep a directed message for the names not connected; False (and an error
        sent, nothing kept) when an inbox is full."""
        st, msg, now = self.state, req.msg, req.now
        size = sum(len(f) for f in p.binary.encode(msg))
        wall = st.wall(now)
        ttl = msg.extra.get("ttl") if msg.extra else None
        ttl = min(float(ttl), self.inboxes.ttl) if isinstance(ttl, int | float) and (
            ttl > 0) else self.inboxes.ttl
        ib = self.inboxes
        for name in missing:
            if not ib.fits(name, size):
                st.refuse(req, Code.INBOX_FULL,
                          f"{name!r} is not connected and its inbox is full (at most "
                          f"{ib.max_count} messages, {ib.max_bytes:,} bytes, for at most "
                          f"{ib.max_names} names): nothing was sent")
                return False
        receipt = bool(msg.extra and msg.extra.get("receipt"))
        kept = [Kept(msg.id, name, msg.kind, req.node.name, msg.body, wall, wall + ttl, size,
                     receipt) for name in missing]
        for k in kept:
            ib.put(k)
        self._remember(kept=[k.row() for k in kept])
        return True

    def _receipt(self, k: Kept, status: str, now: float) -> None:
        st = self.state
        at = st.wall(now)
        body = {"message": k.id, "to": k.to, "status": status, "at": at}
        sender = st.registry.by_name.get(k.frm)
        msg = p.Message("msg.receipt", body, to=k.frm)
        if sender is not None:
            st.send(sender, msg)
            return
        if self.inboxes.fits(k.frm, 256):  # its sender is away too: it waits for it
            r = Kept(msg.id, k.frm, "msg.receipt", st.name, body, at, at + self.inboxes.ttl,
                     256)
            self.inboxes.put(r)
            self._remember(kept=[r.row()])

    def greet(self, node: Node, now: float) -> None:
        """A name registered: hand it what was kept for it, oldest first, once."""
        if node.name not in self.inboxes.boxes:
            return
        kept = self.inboxes.take(node.name)
        # Forgotten durably before it leaves: delivered at most once; a crash in between
        # loses it rather than delivering it twice.
        self._remember(unkept=[k.id for k in kept], to=node.name)
        for k in kept:
            out = p.Message(k.kind, k.body, id=k.id, frm=k.frm, to=node.name, ts=k.sent,
                            extra={"kept": True})
            self.state.later(node, out)
            if k.receipt:
                self._receipt(k, "delivered", now)

    def tick(self, now: float) -> None:
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        gone = self.inboxes.expire(self.state.wall(now))
        for k in gone:
            self._remember(unkept=[k.id], to=k.to)
            if k.receipt:
                self._receipt(k, "expired", now)

    def inbox(self, req: Request) -> None:
        st, node = self.state, req.node
        op, name = req.msg.b["op"], req.msg.b["name"]
        if op == "list":
            items = [{"id": k.id, "kind": k.kind, "from": k.frm, "body": k.body,
                      "sent": k.sent, "expires": k.expires, "size": k.size,
                      "receipt": k.receipt} for k in self.inboxes.peek(name)]
            st.send(node, p.Message("inbox.reply", {"op": op, "name": name,
                                                    "items": items}, ref=req.msg.id))
        elif op == "purge":
            if st.forbidden(req, "inbox.purge"):
                return
            kept = self.inboxes.take(name)
            if kept:
                self._remember(unkept=[k.id for k in kept], to=name)
            st.send(node, p.Message("inbox.reply", {"op": op, "name": name,
                                                    "purged": len(kept)}, ref=req.msg.id))
        else:
            st.refuse(req, Code.BAD_VALUE, "inbox op must be list or purge")


__all__ = ["MAX_ATTACHED", "ConversationService"]
