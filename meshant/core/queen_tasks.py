"""The queen core's task messages: submissions (validation, idempotency, re-sent ids),
foragers' accepts, rejects, progress and results (fenced by attempt), cancels, status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshant import protocol as p
from meshant.core.answers import progress_problem, result_problem
from meshant.core.queen_state import (
    DUPLICATE_TASK,
    NOT_YOURS,
    QUEUE_FULL,
    RATE_LIMITED,
    UNKNOWN_TASK,
    QueenState,
)
from meshant.core.registry import Node
from meshant.core.scheduler import DuplicateTask, QueueFull, Task
from meshant.protocol.codec import BINARY
from meshant.protocol.codes import Code

_RESULT = p.BY_NAME["task.result"]


class TaskHandlers(QueenState):
    """The queen core's task messages: submissions (validation, idempotency, re-sent ids),"""

    if TYPE_CHECKING:  # rights are queen_converse's
        def _forbidden(self, identity: bytes, node: Node, codec: str, operation: str,
                       msg: p.Message, owner: bool = False) -> bool: ...

    def _oversized_result(self, identity: bytes, frames: list[bytes], now: float) -> None:
        """A forager's result over the limit (libzmq let it through, just): the task
        fails at once with too-large, rather than wait out its lease and run again."""
        node = self.registry.by_id.get(identity)
        if node is None or node.role != "forager":
            return
        try:
            msg = p.decode_any(frames, max_frame=self.config.max_message + 65536)[0]
        except p.ProtocolError:
            return
        size = max(len(f) for f in frames)
        if msg.kind == "task.result" and not msg.b.get("partial"):
            refs = [msg.ref]
        elif msg.kind == "task.batch":
            refs = [i.get("ref") for i in msg.b["results"] if isinstance(i, dict)]
        else:
            return
        for ref in refs:
            verdict, att = self.scheduler.lookup(node, ref if isinstance(ref, str) else None)
            if verdict == "ok" and att is not None:
                self.scheduler.too_large(att, f"the result from {node.name} is {size:,} bytes, "
                                         f"over the queen's limit of {self.config.max_message:,} "
                                         "(--max-message)", now)

    def _on_submit(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        assert node is not None
        rate = self.config.submit_rate
        slow = self._allow(identity, now, rate)
        if slow:
            self.counters["rate_limited"] += 1
            self._error_to(identity, codec, RATE_LIMITED,
                           f"more than {rate:g} submissions per second from this "
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
            self._error_to(identity, codec, Code.BAD_VALUE,
                           "priority must be 0-99 and max_attempts 1-100", msg.id)
            return
        timeout = body.get("timeout")
        wait = body.get("wait", self.config.no_forager_wait)
        if any(not 0 <= body.get(k, 0) <= 3600 for k in ("retry_base", "retry_cap")):
            self._error_to(identity, codec, Code.BAD_VALUE,
                           "retry_base and retry_cap are seconds between 0 and 3600", msg.id)
            return
        if (timeout is not None and timeout <= 0) or wait < 0:
            self._error_to(identity, codec, Code.BAD_VALUE, "timeout must be > 0 and wait >= 0",
                           msg.id)
            return
        key = body.get("key")
        if key is not None:
            if not isinstance(key, str) or not 0 < len(key) <= 200:
                self._error_to(identity, codec, Code.BAD_VALUE,
                               "an idempotency key is a string of 1-200 characters", msg.id)
                return
            first = self.scheduler.find_key(key)  # in memory, else in the journal
            if first is not None and self._attach(identity, node, msg, first):
                return
        task = Task(id=msg.id, capability=body["capability"], payload=body.get("payload"),
                    client=identity, client_name=node.name, priority=priority,
                    timeout=timeout, to=body.get("to"), labels=dict(body.get("labels") or {}),
                    max_attempts=max_attempts, wait=wait, key=key,
                    retry_base=body.get("retry_base"), retry_cap=body.get("retry_cap"),
                    defer=(key is None and codec == BINARY and node.role == "client"
                           and not body.get("ack")))
        try:
            self.scheduler.submit(task, now, unknown=True)
        except QueueFull as e:
            self._error_to(identity, codec, QUEUE_FULL, f"queue full: {e}", msg.id)
            return
        except DuplicateTask:
            self._error_to(identity, codec, DUPLICATE_TASK,
                           f"a task with id {msg.id!r} already exists", msg.id)
            return
        tp = msg.extra.get("traceparent") if msg.extra else None
        if isinstance(tp, str) and len(tp) <= 128:
            self.traces[task.id] = tp
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
            # After this turn's record: the task may have finished in this very turn.
            self._later.append((node, p.Message("task.result", task.final, ref=task.id)))
        elif msg.b.get("ack"):
            if task.logged == 0 and self.scheduler.track_changes:
                # Still waiting for its first journal write (core/journal_defer.py): an
                # acknowledgement promises durability, so the task is written this turn.
                task.defer = False
                self.scheduler.changed[task.id] = task
            self._later.append((node, p.Message("task.submitted", {"task": task.id},
                                                ref=msg.id)))

    def _attach(self, identity: bytes, node: Node, msg: p.Message, task_id: str) -> bool:
        """A submission repeating an idempotency key: attach it to the task it names (or
        answer with its result) instead of running the work again."""
        task = self.scheduler.find(task_id)
        if task is None:
            return False
        if task.final is not None:
            self._later.append((node, p.Message("task.result", {
                **task.final, "task": msg.id, "original": task.id}, ref=msg.id)))
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
        if verdict == "foreign":
            self.counters["protocol_errors"] += 1
            self._error_to(identity, codec, NOT_YOURS,
                           f"assign {ref!r} belongs to another forager", msg.id)
        else:
            self.scheduler.counters["unknown_results"] += 1
            self._error_to(identity, codec, UNKNOWN_TASK,
                           f"no assign {ref!r} is known for this forager", msg.id,
                           **({"assign": ref} if ref is not None else {}))
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

    def _refused(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                 problem: str | None, ref: str | None, feature: str | None = None) -> bool:
        """Answer a forager's malformed (or not negotiated) answer; True if it was one.
        It changes nothing: the attempt stays current, its lease is not renewed."""
        if feature is not None and node is not None and feature not in node.features:
            self.counters["protocol_errors"] += 1
            self._error_to(identity, codec, Code.UNSUPPORTED,
                           f"this peer did not negotiate {feature!r}: no {msg.kind}"
                           + (" with partial: true" if msg.kind == "task.result" else ""),
                           msg.id, **({"assign": ref} if ref is not None else {}))
            return True
        if problem is None:
            return False
        self.counters["protocol_errors"] += 1
        self._error_to(identity, codec, Code.BAD_VALUE, problem, msg.id,
                       **({"assign": ref} if ref is not None else {}))
        return True

    def _on_progress(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                     now: float) -> None:
        if self._refused(identity, node, msg, codec, progress_problem(msg.b), msg.ref,
                         "progress"):
            return
        att = self._attempt(identity, node, msg, codec, msg.ref)
        if att is not None:
            self.scheduler.progress(att, msg.b, now)

    def _on_result(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        self._result(identity, node, msg, codec, msg.ref, msg.b, now)

    def _result(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                ref: str | None, body: dict[str, Any], now: float) -> None:
        if self._refused(identity, node, msg, codec, result_problem(body, codec), ref,
                         "progress" if body.get("partial") else None):
            return
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
        if self._refused(identity, node, msg, codec, None, None, "batch"):
            return
        for item in msg.b["results"]:
            if not isinstance(item, dict) or not isinstance(item.get("ref"), str):
                self.counters["protocol_errors"] += 1
                self._error_to(identity, codec, Code.BAD_TYPE,
                               "each batched result must be a map with a 'ref'", msg.id)
                continue
            try:
                p.validate_body(_RESULT, item)  # an item is a full task.result body (§2.4)
            except p.ProtocolError as e:
                self.counters["protocol_errors"] += 1
                self._error_to(identity, codec, e.code, e.message, msg.id, assign=item["ref"])
                continue
            self._result(identity, node, msg, codec, item["ref"], item, now)

    def _on_cancel(self, identity: bytes, node: Node | None, msg: p.Message, codec: str,
                   now: float) -> None:
        task_id = msg.b.get("task") or msg.ref
        task = self.scheduler.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            self._error_to(identity, codec, UNKNOWN_TASK, f"no running task {task_id!r}",
                           msg.id)
            return
        # Anyone's task, as rights allow (core/rights.py: with CURVE, its submitter or an
        # admin): `meshant cancel` is a client of its own.
        assert node is not None
        if task.client != identity and self._forbidden(
                identity, node, codec, "task.cancel", msg, task.client_name == node.name):
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
        reply = p.Message("task.state", body, ref=msg.id)
        if task.final is not None and task.client_name == node.name:
            body["final"] = task.final  # lets a reconnected submitter collect a result it missed
            # After this turn's record: the task may have finished in this very turn.
            self._later.append((node, reply))
            return
        self._send(node, reply)

