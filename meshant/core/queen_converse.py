"""The queen core's conversations: tasks that ask for input and are answered, streams any
peer with the right may attach to from a cursor, durable inboxes for names that are not
connected, and the rights per operation that guard them (and drain, halt, dlq, memory).

A part of :class:`meshant.core.queen.QueenCore`. The data structures are
:mod:`meshant.core.conversation` and :mod:`meshant.core.inbox`; what the journal must
keep leaves as :class:`Remember` actions, each before what depends on it is sent.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from meshant import protocol as p
from meshant.core.conversation import (
    MAX_QUESTIONS,
    CursorExpired,
    Question,
    Questions,
    UpdateLogs,
    size_of,
)
from meshant.core.inbox import Inboxes, Kept
from meshant.core.queen_state import UNKNOWN_TASK, QueenState, Remember
from meshant.core.registry import Node
from meshant.core.rights import permits
from meshant.core.tasks import ACCEPTED, ASSIGNED, INPUT_REQUIRED, Task
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code

_UPDATE_KINDS = frozenset({"task.progress", "task.result", "task.ask"})
MAX_ATTACHED = 10_000  # attachments to live tasks, all together
PROMPT_NOTE = 60  # characters of a prompt the timeline keeps


class ConverseHandlers(QueenState):
    """Questions and answers, attachable update logs, durable inboxes, rights."""

    if TYPE_CHECKING:
        def _attempt(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                     ref: str | None) -> Any: ...

    def _converse_init(self) -> None:
        """Called once the scheduler holds what the journal restored: take back the
        questions, inboxes and update cursors that belong with it."""
        self.questions = Questions()
        self.update_logs = UpdateLogs()
        self.inboxes = Inboxes()
        self.attached: dict[str, dict[bytes, str]] = {}
        self._n_attached = 0
        self._next_expiry = 0.0
        store = getattr(self.scheduler.archive, "conversation", None)
        self._store = store
        if store is None:
            return
        tasks = self.scheduler.tasks
        for row in store.questions():
            if row["task"] in tasks:
                self.questions.add(Question(**row))
        ib = self.inboxes
        for row in store.kept():
            # As kept before the restart, even past a bound lowered since.
            k = Kept(id=row["id"], to=row["to"], kind=row["kind"], frm=row["from"],
                     body=row["body"], sent=row["sent"], expires=row["expires"],
                     size=row["size"], receipt=row["receipt"], ord=row["ord"])
            ib.boxes.setdefault(k.to, deque()).append(k)
            ib.sizes[k.to] = ib.sizes.get(k.to, 0) + k.size
            ib.next_ord = max(ib.next_ord, k.ord + 1)
        # Sequence numbers go on from the last journaled update, so a watcher's cursor
        # (and a submitter's dedup) still means the same after a restart.
        for task_id, seq in store.last_seqs(list(tasks)).items():
            tasks[task_id].seq = max(tasks[task_id].seq, seq)

    # -- rights ---------------------------------------------------------------------------

    def _roles(self, node: Node) -> frozenset[str] | None:
        roles_of = getattr(self.authorized, "roles_of", None)
        if roles_of is None or node.key is None:
            return None
        return frozenset(roles_of(node.key))

    def _forbidden(self, identity: bytes, node: Node, codec: str, operation: str,
                   msg: p.Message, owner: bool = False) -> bool:
        """True (and ``forbidden`` sent) when ``node``'s key may not do ``operation``."""
        if permits(operation, self._roles(node), owner):
            return False
        self.counters["forbidden"] = self.counters.get("forbidden", 0) + 1
        who = "an admin key" + (" or the submitter" if operation.startswith(("task.", "graph."))
                                else "")
        self._error_to(identity, codec, Code.FORBIDDEN,
                       f"{operation} is allowed to {who} only; {node.name!r} is not "
                       "(meshant keys generate ... --role admin)", msg.id, operation=operation)
        return True

    def _remember(self, **what: Any) -> None:
        if self._store is not None:
            self.out.append(Remember(**what))

    # -- questions ------------------------------------------------------------------------

    def _on_ask(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                now: float) -> None:
        att = self._attempt(identity, node, msg, codec, msg.ref)
        if att is None:
            return
        assert node is not None
        task: Task = att.task
        b = msg.b
        request = b["request"]
        sched = self.scheduler
        q = self.questions.get(task.id, request)
        if b.get("withdraw"):
            if q is not None and not (q.answered or q.withdrawn):
                q.withdrawn = True
                self._remember(questions=[q.row()])
                self._note(task, now, "withdrawn", f"{request}: the handler stopped waiting")
                self._resume(task, now)
                self._deliver(task, "task.ask", {"request": request, "withdraw": True})
            return
        if q is not None:
            if q.answered and q.attempt == att.id:
                # Asked again (the forager reconnected, or the queen restarted): the
                # answer it may have missed goes again; its handler takes the first.
                self._later.append((node, self._answer_msg(task, q, att.id)))
            return
        if len(self.questions.pending(task.id)) >= MAX_QUESTIONS:
            self._error_to(identity, codec, Code.QUEUE_FULL, f"task {task.id} already waits "
                           f"on {MAX_QUESTIONS} questions: answer or withdraw some", msg.id)
            return
        size = size_of(b.get("prompt")) + size_of(b.get("data"))
        if size > self.config.mem_max_value:
            self._error_to(identity, codec, Code.TOO_LARGE, f"a question's prompt and data are "
                           f"{size:,} bytes, over {self.config.mem_max_value:,} "
                           "(--mem-max-value): send large data as the task's result", msg.id)
            return
        att.lease = now + sched.assign_timeout
        q = Question(task=task.id, request=request, attempt=att.id, prompt=b.get("prompt"),
                     data=b.get("data"), asked=self._wall(now))
        self.questions.add(q)
        self._remember(questions=[q.row()])
        if task.state == ASSIGNED:
            sched._move(task, ACCEPTED, now, f"{node.name} (implied)")
        prompt = q.prompt if isinstance(q.prompt, str) else "(input)"
        if task.state == INPUT_REQUIRED:
            self._note(task, now, "ask", f"{request}: {prompt[:PROMPT_NOTE]}")
        else:
            sched._move(task, INPUT_REQUIRED, now, f"{request}: {prompt[:PROMPT_NOTE]}")
        body = {"request": request, "prompt": q.prompt}
        if q.data is not None:
            body["data"] = q.data
        if "timeout" in b:
            body["timeout"] = b["timeout"]
        self._deliver(task, "task.ask", body)

    def _deliver(self, task: Task, kind: str, body: dict[str, Any]) -> None:
        body = {"task": task.id, "seq": task.next_seq(), **body}
        self.scheduler.out.append(("deliver", task, kind, body))

    def _note(self, task: Task, now: float, what: str, why: str) -> None:
        task.history.append((now, what, why))
        if self.scheduler.track_changes:
            self.scheduler.changed[task.id] = task

    def _waiting(self, task: Task) -> list[Question]:
        """The task's questions its current attempt still waits on, oldest first."""
        current = task.current.id if task.current is not None else None
        return [q for q in self.questions.pending(task.id) if q.attempt == current]

    def _resume(self, task: Task, now: float) -> None:
        if task.state == INPUT_REQUIRED and not self._waiting(task):
            self.scheduler._move(task, ACCEPTED, now, "input received")

    def _answer_msg(self, task: Task, q: Question, ref: str) -> p.Message:
        return p.Message("task.answer", {"task": task.id, "request": q.request,
                                         "value": q.answer, "by": q.by}, ref=ref)

    def _on_answer(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        b = msg.b
        task_id = b["task"]
        task = self.scheduler.tasks.get(task_id)
        if task is None:
            done = self.scheduler.find(task_id) is not None
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"task {task_id!r} has finished: it takes no answers" if done
                           else f"no task {task_id!r}", msg.id)
            return
        if self._forbidden(identity, node, codec, "task.answer", msg,
                           owner=task.client_name == node.name):
            return
        request = b.get("request")
        current = task.current.id if task.current is not None else None
        if request is None:
            pending = self._waiting(task)
            request = pending[0].request if pending else None
        q = self.questions.get(task.id, request) if request is not None else None
        if q is None:
            self._error_to(identity, codec, Code.UNKNOWN_QUESTION,
                           f"task {task_id!r} is not waiting for input" if request is None
                           else f"task {task_id!r} asked no question {request!r}", msg.id)
            return
        if q.answered:
            self._error_to(identity, codec, Code.ALREADY_ANSWERED,
                           f"question {q.request!r} of task {task_id!r} was answered already"
                           f" (by {q.by})", msg.id)
            return
        if q.withdrawn or q.attempt != current:
            self._error_to(identity, codec, Code.UNKNOWN_QUESTION,
                           f"question {q.request!r} of task {task_id!r} is closed: its "
                           "handler stopped waiting (timeout, or the attempt ended)", msg.id)
            return
        q.answered = True
        q.answer = b.get("value")
        q.by = node.name
        self._remember(questions=[q.row()])  # durable before the forager acts on it
        self._note(task, now, "answered", f"{q.request} by {node.name}")
        self._resume(task, now)
        att = task.current
        if att is not None and att.node.identity:
            self._later.append((att.node, self._answer_msg(task, q, att.id)))
        # Otherwise its forager is away (or the queen restarted): it asks again on its
        # return, and is answered then.
        self._send(node, p.Message("task.answered", {"task": task.id, "request": q.request},
                                   ref=msg.id))

    # -- attachable streams ---------------------------------------------------------------

    def _on_attach(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        b = msg.b
        task = self.scheduler.find(b["task"])
        if task is None:
            self._error_to(identity, codec, UNKNOWN_TASK, f"no task {b['task']!r}", msg.id)
            return
        if self._forbidden(identity, node, codec, "task.attach", msg,
                           owner=task.client_name == node.name):
            return
        after = b.get("after", 0)
        if after < 0:
            self._error_to(identity, codec, Code.BAD_VALUE, "after is a sequence number >= 0",
                           msg.id)
            return
        try:
            items = self._updates_since(task, after)
        except CursorExpired as e:
            self._error_to(identity, codec, Code.CURSOR_EXPIRED, str(e), msg.id,
                           cursor=e.cursor)
            return
        final = task.final
        if final is None and self._n_attached >= MAX_ATTACHED:
            self._error_to(identity, codec, Code.QUEUE_FULL, f"the queen follows at most "
                           f"{MAX_ATTACHED} attachments: try again later", msg.id)
            return
        last = final["seq"] if final is not None else task.seq
        replies = [p.Message("task.attached", {"task": task.id, "state": task.state,
                                               "after": after, "last": last}, ref=msg.id)]
        replies += [self._update_msg(task.id, seq, kind, body) for seq, kind, body in items]
        if final is not None:
            if final.get("seq", 0) > after:
                replies.append(self._update_msg(task.id, final["seq"], "task.result", final))
            # After this turn's record: the task may have finished in this very turn.
            self._later.extend((node, r) for r in replies)
            return
        for r in replies:
            self._send(node, r)
        watchers = self.attached.setdefault(task.id, {})
        if identity not in watchers:
            self._n_attached += 1
        watchers[identity] = node.name

    @staticmethod
    def _update_msg(task_id: str, seq: int, kind: str, body: dict[str, Any]) -> p.Message:
        return p.Message("task.update", {"task": task_id, "seq": seq, "kind": kind,
                                         "body": body}, ref=task_id)

    def _updates_since(self, task: Task, after: int) -> list[tuple[int, str, dict[str, Any]]]:
        logs = self.update_logs
        if task.id not in logs.logs and self._store is not None:
            rows = self._store.updates(task.id)
            if rows:
                logs.load(task.id, rows, dropped=rows[0][0] - 1)
        if task.id not in logs.logs:
            last = (task.final or {}).get("seq", task.seq + 1) - 1
            if after < last:
                raise CursorExpired(f"updates {after + 1}-{last} of task {task.id} are no "
                                    f"longer kept: attach with after >= {last}", last)
            return []
        return logs.since(task.id, after)

    def _converse_turn(self) -> None:
        """Before this turn's deliveries leave: keep each update in its task's log (and
        the journal), copy it to the task's watchers, close what a final result ends."""
        journal: list[tuple[str, int, str, dict[str, Any]]] = []
        for action in self.scheduler.out:
            if action[0] != "deliver" or action[2] not in _UPDATE_KINDS:
                continue
            task, kind, body = action[1], action[2], action[3]
            final = kind == "task.result" and not body.get("partial")
            if not final:
                self.update_logs.add(task.id, body["seq"], kind, body)
                journal.append((task.id, body["seq"], kind, body))
            watchers = self.attached.get(task.id)
            if watchers:
                msg = self._update_msg(task.id, body["seq"], kind, body)
                for identity in watchers:
                    self._send_to(identity, BINARY, msg)
            if final:
                if watchers is not None:
                    self._n_attached -= len(watchers)
                    del self.attached[task.id]
                self.questions.drop(task.id)
        if journal:
            self._remember(updates=journal)

    # -- durable inboxes ------------------------------------------------------------------

    def _keep(self, identity: bytes, node: Node, msg: p.Message, codec: str,
              missing: list[str], now: float) -> bool:
        """Keep a directed message for the names not connected; False (and an error
        sent, nothing kept) when an inbox is full."""
        size = sum(len(f) for f in p.binary.encode(msg))
        wall = self._wall(now)
        ttl = msg.extra.get("ttl") if msg.extra else None
        ttl = min(float(ttl), self.inboxes.ttl) if isinstance(ttl, int | float) and (
            ttl > 0) else self.inboxes.ttl
        for name in missing:
            if not self.inboxes.fits(name, size):
                ib = self.inboxes
                self._error_to(identity, codec, Code.INBOX_FULL,
                               f"{name!r} is not connected and its inbox is full (at most "
                               f"{ib.max_count} messages, {ib.max_bytes:,} bytes, for at most "
                               f"{ib.max_names} names): nothing was sent", msg.id)
                return False
        receipt = bool(msg.extra and msg.extra.get("receipt"))
        kept = [Kept(msg.id, name, msg.kind, node.name, msg.body, wall, wall + ttl, size,
                     receipt) for name in missing]
        for k in kept:
            self.inboxes.put(k)
        self._remember(kept=[k.row() for k in kept])
        return True

    def _receipt(self, k: Kept, status: str, now: float) -> None:
        at = self._wall(now)
        body = {"message": k.id, "to": k.to, "status": status, "at": at}
        sender = self.registry.by_name.get(k.frm)
        msg = p.Message("msg.receipt", body, to=k.frm)
        if sender is not None:
            self._send(sender, msg)
            return
        if self.inboxes.fits(k.frm, 256):  # its sender is away too: it waits for it
            r = Kept(msg.id, k.frm, "msg.receipt", self.name, body, at, at + self.inboxes.ttl,
                     256)
            self.inboxes.put(r)
            self._remember(kept=[r.row()])

    def _inbox_hello(self, node: Node, now: float) -> None:
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
            self._later.append((node, out))
            if k.receipt:
                self._receipt(k, "delivered", now)

    def _converse_tick(self, now: float) -> None:
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        gone = self.inboxes.expire(self._wall(now))
        for k in gone:
            self._remember(unkept=[k.id], to=k.to)
            if k.receipt:
                self._receipt(k, "expired", now)

    def _on_inbox(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                  now: float) -> None:
        assert node is not None
        op, name = msg.b["op"], msg.b["name"]
        if op == "list":
            items = [{"id": k.id, "kind": k.kind, "from": k.frm, "body": k.body,
                      "sent": k.sent, "expires": k.expires, "size": k.size,
                      "receipt": k.receipt} for k in self.inboxes.peek(name)]
            self._send(node, p.Message("inbox.reply", {"op": op, "name": name,
                                                       "items": items}, ref=msg.id))
        elif op == "purge":
            if self._forbidden(identity, node, codec, "inbox.purge", msg):
                return
            kept = self.inboxes.take(name)
            if kept:
                self._remember(unkept=[k.id for k in kept], to=name)
            self._send(node, p.Message("inbox.reply", {"op": op, "name": name,
                                                       "purged": len(kept)}, ref=msg.id))
        else:
            self._error_to(identity, codec, Code.BAD_VALUE, "inbox op must be list or purge",
                           msg.id)
