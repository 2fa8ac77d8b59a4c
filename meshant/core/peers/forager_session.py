"""A forager's side of the protocol, sans-IO: what it runs, what it tells the queen, and
when. It sits beside the :class:`~meshant.core.peers.peer_session.PeerSession` (hello, welcome,
liveness); the driver (:class:`meshant.actors.forager.Forager`) runs handlers in threads,
moves bytes and reads the clock, and carries out what this decides:

* an assignment it can take becomes :class:`Start` (run the handler); one it cannot
  (draining, no handler for the capability) is rejected at once, with the reason;
* a task that finishes within ``accept_delay`` sends only its result, which implies its
  acceptance (one message fewer per short task); a longer one sends ``task.accept``;
* results, progress and questions go to the queen in the order the handlers made them;
  final results travel batched when the queen negotiated batching;
* final results sent lately are kept for a heartbeat timeout: a connection that dies
  takes what it had not delivered with it, so they go again after a reconnect (the queen
  drops any it already had); questions still waiting are asked again after a welcome;
* durable steps (negotiated ``steps``): a run's step records are numbered with its
  updates and kept to send again until the run ends (the queen journals each, and a
  later run gets them with its assignment, or asks them with ``task.steps`` when they
  are many); a sub-task's call waits for ``task.called`` and is asked again after a
  welcome;
* a cancel, or the queen saying it no longer knows an assignment, stops the handler
  (:class:`Stop`), and the run's end is reported as cancelled;
* draining: nothing new is taken, the running tasks finish, then :class:`Leave`; with
  results still unsent and the queen gone, it waits one heartbeat timeout, not longer.

Time is passed in; nothing here reads a clock, a socket or a thread.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from meshant import protocol as p
from meshant.core.peers.link import FLUSH_MAX, Item
from meshant.protocol.codes import Code

ACCEPT_DELAY = 0.002  # seconds: a task that ends sooner sends only its result
RESENT_MAX = 10_000  # final results kept for re-sending, at most
ORPHANS_MAX = 10_000
# A run's progress reports and partial results kept for sending again (after a reconnect
# or a queen's takeover, the welcome says which the queen has), at most; the oldest go
# first beyond (as the queen's own update log keeps a task's newest 1,000).
UPDATES_KEPT = 1000
UPDATES_KEPT_BYTES = 1 << 20
_NUMBERED = frozenset({"task.progress", "task.result"})
# About how many bytes of values one task.batch carries at most (less under a small
# --max-message: see ``negotiated``); a batch that cannot be sent all the same goes
# again one by one.
BATCH_BYTES = 256 * 1024


@dataclass(slots=True)
class Start:
    """Run the handler of ``capability`` for assignment ``ref`` (``run`` identifies this
    run: report its end with it)."""

    ref: str
    run: int
    task_id: str
    attempt: int
    capability: str
    payload: Any
    timeout: float | None
    trace: str | None
    steps: list[dict[str, Any]] | None = None  # what earlier runs recorded (durable)


@dataclass(slots=True)
class Stop:
    """Tell the handler of ``ref`` to stop (the task was cancelled, or is nobody's)."""

    ref: str
    why: str


@dataclass(slots=True)
class Answered:
    """The answer to the question ``request`` that the handler of ``ref`` asked."""

    ref: str
    request: str
    value: Any


@dataclass(slots=True)
class Leave:
    """Stop the forager: drained, or given up on a queen that is gone (``warning``)."""

    warning: str | None = None


@dataclass(slots=True)
class Reply:
    """The queen's answer to a message a handler sent and waits on (``ctx.spawn``):
    ``error`` set when it was refused."""

    ref: str
    body: dict[str, Any]
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class Delivered:
    """A directed message (``msg`` or ``note``) for this forager's callbacks."""

    msg: p.Message


Action = Start | Stop | Answered | Leave | Reply | Delivered


@dataclass(slots=True)
class Run:
    """A task this forager runs."""

    ref: str
    run: int
    task_id: str
    cancelled: bool = False
    # Questions its handler waits on: request id -> the task.ask message.
    asks: dict[str, p.Message] = field(default_factory=dict)
    # Its progress reports and partial results, numbered (``n``) and kept to send again.
    n: int = 0
    updates: deque[tuple[p.Message, int]] = field(default_factory=deque)
    updates_bytes: int = 0
    # Its step records (numbered with the updates), all kept until it ends: bounded by
    # what one task may record (core/tasks/steps.py), and never dropped, since a record
    # the queen missed would make a later run do its step again.
    steps: list[p.Message] = field(default_factory=list)
    # Sub-task calls waiting for their task.called, by message id (asked again after a
    # welcome).
    calls: dict[str, p.Message] = field(default_factory=dict)
    # A re-run whose records are fetched (task.steps) before it starts: what it waits
    # to start with, and the records so far.
    start: Start | None = None
    fetched: list[dict[str, Any]] = field(default_factory=list)

    def numbered(self) -> list[p.Message]:
        """Its numbered messages kept to send again, in order."""
        kept = [m for m, _ in self.updates]
        if self.steps:
            kept = sorted(kept + self.steps, key=lambda m: m.b["n"])
        return kept


def _size(value: Any) -> int:
    """About how many bytes a partial result's value takes (what matters: big ones)."""
    if value is None or value.__class__ is dict:
        return 64  # (a plain task's result, tested first: the most, and the cheapest)
    if isinstance(value, bytes | str):
        return 64 + len(value)
    data = getattr(value, "data", None)  # a Blob
    return 64 + (len(data) if isinstance(data, bytes | bytearray | memoryview) else 0)


def _unbatched(item: dict[str, Any]) -> p.Message:
    """A task.batch item as the message of its own it stands for."""
    kind = item.get("kind", "task.result")
    body = {k: v for k, v in item.items() if k != "ref" and k != "kind"}
    if kind == "task.step":
        body["kind"] = body.pop("step", None)
    return p.Message(kind, body, ref=item["ref"], to="queen")


class ForagerSession:
    """One forager's tasks and its messages to the queen (the role a
    :class:`~meshant.core.peers.link.PeerLink` drives)."""

    role = "forager"

    def __init__(self, tools: list[str], slots: int, labels: dict[str, Any] | None = None,
                 *, accept_delay: float = ACCEPT_DELAY,
                 serves: Container[str] | None = None,
                 describe: dict[str, dict[str, Any]] | None = None) -> None:
        """``tools``: the capabilities the hello announces; ``serves``: those it has a
        handler for when an assignment comes (default: ``tools``); ``describe``: what the
        hello says of each (description, payload and result schemas)."""
        self.tools = sorted(tools)
        self._serves: Container[str] = frozenset(tools) if serves is None else serves
        self.slots = slots
        self.labels = dict(labels or {})
        self.describe = dict(describe or {})
        self.accept_delay = accept_delay
        self.features: frozenset[str] = frozenset()
        self.running: dict[str, Run] = {}
        self.draining = False
        self.out: list[Action] = []
        self.beat_now = False  # a drain began: the queen hears it with a heartbeat at once
        # How many of the outbox's first messages go one by one (from a batch that could
        # not be sent), and the bytes of values a batch may carry (see ``flush``).
        self._singles = 0
        self.batch_bytes = BATCH_BYTES
        self.outbox: deque[p.Message] = deque()  # to the queen, in order
        self._accepts: dict[str, float] = {}
        # Final results sent lately: (when, ref, message or batch item).
        self._sent: deque[tuple[float, str, Any]] = deque()
        # Refs whose final result is kept (waiting in the outbox, or sent lately and kept
        # for re-sending), with how many: what a new assignment of the same id forgets.
        self._kept: dict[str, int] = {}
        self._orphans: set[str] = set()
        self._orphaned_since: float | None = None
        self._waiting_replies: set[str] = set()
        self._runs = itertools.count(1)
        # The numbered updates of runs that ended, until their final result is surely
        # taken (kept as long as the result is kept for re-sending).
        self._ended_updates: OrderedDict[str, deque[tuple[p.Message, int]]] = OrderedDict()

    def take(self) -> list[Action]:
        out, self.out = self.out, []
        return out

    # -- what the hello and heartbeats say ------------------------------------------------

    def _held(self) -> list[str]:
        """Assignments it runs, and those whose final result waits to be sent."""
        return list(self.running) + [m.ref for m in self.outbox
                                     if m.kind == "task.result" and m.ref
                                     and not m.b.get("partial")]

    def hello_fields(self) -> dict[str, Any]:
        """The forager's part of its hello: tasks still running, and finished ones whose
        results wait to be sent (a queen that knows them adopts them instead of running
        them again; one that does not takes their answers for an old run's)."""
        body: dict[str, Any] = {"slots": self.slots, "tools": self.tools,
                                "labels": self.labels, "running": self._held()}
        if self.describe:  # a queen that does not know the field ignores it
            body["describe"] = self.describe
        return body

    def hb_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"slots": self.slots, "in_flight": len(self.running),
                                "running": self._held(), "tools": self.tools}
        if self.draining:
            body["state"] = "draining"
        return body

    @property
    def busy(self) -> bool:
        """Tasks run: the heartbeat, which renews their leases, goes every interval."""
        return bool(self.running)

    @property
    def pending(self) -> bool:
        return bool(self.outbox)

    def negotiated(self, features: frozenset[str], max_message: int) -> None:
        self.features = features
        self.batch_bytes = min(BATCH_BYTES, max_message // 2)

    # -- the link's events ----------------------------------------------------------------

    def on_message(self, msg: p.Message, now: float) -> str | None:
        """A message from the queen for this forager; returns a line to log, if any."""
        kind, b = msg.kind, msg.b
        if kind == "task.assign":
            self.assign(msg.id, b, msg.extra.get("traceparent") if msg.extra else None, now)
        elif kind == "task.assigns":
            bad = self.assigns(b["assigns"], now)
            if bad:
                return f"malformed entries in task.assigns: {', '.join(bad)}"
        elif kind == "task.cancel":
            self.cancel(msg.ref)
        elif kind == "task.answer":
            self.answer(msg.ref, b.get("request"), b.get("value"))
        elif kind == "graph.spawned" or kind == "task.called":
            self.reply(msg.ref, b)
        elif kind == "task.steps":
            self.fetched(msg.ref, b)
        elif kind == "ctl.drain":
            if self.drain():
                self.beat_now = True  # tell the queen now, so it assigns nothing more
        elif kind == "ctl.halt":
            self.out.append(Leave())
        elif kind in ("msg", "note"):
            self.out.append(Delivered(msg))
        return None

    def on_error(self, msg: p.Message, now: float) -> str | None:
        return self.error(msg.ref, msg.b)

    def on_welcome(self, first: bool, welcome: dict[str, Any]) -> None:
        self.welcomed(first, welcome.get("updates"))

    def on_lost(self, now: float, why: str) -> None:
        self.queen_lost()

    def on_forgotten(self, ref: str | None) -> None:
        pass  # (what it sent goes again after the welcome: results, questions, updates)

    # -- from the queen -------------------------------------------------------------------

    def assign(self, ref: str, body: dict[str, Any], trace: Any, now: float) -> None:
        """A ``task.assign`` (or an item of ``task.assigns``)."""
        cap = body.get("capability") or body.get("node") or ""
        if cap not in self._serves or self.draining:
            reason = "draining" if self.draining else (
                f"no handler for capability {cap!r} (this forager serves "
                f"{', '.join(self.tools)})")
            self.outbox.append(p.Message("task.reject", {"reason": reason}, ref=ref,
                                         to="queen"))
            return
        if ref in self.running or ref in self._kept or ref in self._ended_updates:
            self._forget(ref)
        # (Each option is tested against None first: a plain assignment carries none of
        # them, and an isinstance of a union costs more than the comparison.)
        task_id = body.get("task", ref)
        run = Run(ref, next(self._runs), task_id if task_id.__class__ is str else str(task_id))
        self.running[ref] = run
        self._accepts[ref] = now + self.accept_delay
        timeout = body.get("timeout")
        if timeout is not None:
            timeout = float(timeout) if isinstance(timeout, int | float) else None
        steps = body.get("steps")
        if steps is not None and not isinstance(steps, list):
            steps = None
        attempt = body.get("attempt", 1)
        payload = body.get("payload")
        start = Start(ref, run.run, run.task_id, attempt if attempt.__class__ is int
                      else int(attempt), cap,
                      p.unwrap_blob(payload), timeout,
                      trace if trace is None or trace.__class__ is str else None, steps)
        total = body.get("steps_total")
        if total is not None and "steps" in self.features and isinstance(total, int) and (
                total > 0):
            # Too many records to come with the assignment: fetched before it starts.
            run.start = start
            self.outbox.append(p.Message("task.steps", {"task": run.task_id}, ref=ref,
                                         to="queen"))
            return
        self.out.append(start)

    def fetched(self, ref: str | None, body: dict[str, Any]) -> None:
        """A slice of the records a re-run waits for (``task.steps``): it starts once it
        has them all."""
        run = self.running.get(ref or "")
        if run is None or run.start is None:
            return
        steps, first, total = body.get("steps"), body.get("from"), body.get("total")
        if not isinstance(steps, list) or first != len(run.fetched) or not isinstance(
                total, int):
            return
        run.fetched.extend(steps)
        if len(run.fetched) >= total:
            start, run.start = run.start, None
            start.steps, run.fetched = run.fetched, []
            self.out.append(start)

    def _forget(self, ref: str) -> None:
        """A queen assigns an id this forager ran before: it restarted without knowing
        that run (a task whose first journal write never happened is given attempt 1
        again), so nothing of the old run may go to it as the new one's — not its
        updates (their numbers would stand for the new run's), not its result when it
        is sent again after a reconnect. The old run, if it still runs, is stopped."""
        old = self.running.pop(ref, None)
        if old is not None and not old.cancelled:
            old.cancelled = True
            self.out.append(Stop(ref, "assigned again"))
        self.outbox = deque(m for m in self.outbox if m.ref != ref)
        self._sent = deque(e for e in self._sent if e[1] != ref)
        self._kept.pop(ref, None)
        self._ended_updates.pop(ref, None)
        self._accepts.pop(ref, None)
        self._singles = 0  # (what a batch split back left first: gone or sent singly)

    def assigns(self, items: list[Any], now: float) -> list[str]:
        """A ``task.assigns`` batch; returns what was malformed in it (to log)."""
        bad = []
        for body in items:
            if isinstance(body, dict) and isinstance(body.get("id"), str):
                self.assign(body["id"], body, body.get("traceparent"), now)
            else:
                bad.append(repr(body)[:80])
        return bad

    def cancel(self, ref: str | None) -> None:
        run = self.running.get(ref or "")
        if run is not None:
            run.cancelled = True
            self.out.append(Stop(run.ref, "cancelled"))

    def answer(self, ref: str | None, request: Any, value: Any) -> None:
        run = self.running.get(ref or "")
        if run is not None and isinstance(request, str) and (
                run.asks.pop(request, None) is not None):
            self.out.append(Answered(run.ref, request, value))

    def drain(self) -> bool:
        """Finish the running tasks, take nothing new, then leave. True the first time
        (the queen is told at once, with a heartbeat)."""
        if self.draining:
            return False
        self.draining = True
        return True

    def reply(self, ref: str | None, body: dict[str, Any]) -> None:
        """The queen answered a message a handler waits on (``graph.spawned``)."""
        if ref is not None and ref in self._waiting_replies:
            self._waiting_replies.discard(ref)
            self._called(ref)
            self.out.append(Reply(ref, body))

    def _called(self, ref: str) -> None:
        for run in self.running.values():
            if run.calls and run.calls.pop(ref, None) is not None:
                return

    def error(self, ref: str | None, body: dict[str, Any]) -> str | None:
        """An ``error`` from the queen about something this forager sent. Returns a line
        to log for the person, if any."""
        if ref is not None:
            if ref in self._waiting_replies:
                self._waiting_replies.discard(ref)
                self._called(ref)
                self.out.append(Reply(ref, {}, body))
                return None
            for run in self.running.values():
                for request, m in list(run.asks.items()):
                    if m.id == ref:  # a question refused: its ask raises
                        del run.asks[request]
                        self.out.append(Reply(ref, {}, body))
                        return None
        assign = body.get("assign")
        if body.get("code") == Code.UNKNOWN_TASK and isinstance(assign, str):
            if assign in self._orphans:
                return None  # said once already
            self._orphans.add(assign)
            if len(self._orphans) > ORPHANS_MAX:
                self._orphans.clear()
            orphan = self.running.get(assign)
            if orphan is None:
                return None
            run = orphan
            # The queen no longer knows this assignment (it restarted without it): the
            # work has no one to go to. Stop it as if cancelled, and say so once.
            run.cancelled = True
            self.out.append(Stop(run.ref, "unknown to the queen"))
            return (f"the queen does not know task {run.task_id} (assign {assign}) any "
                    "more; stopping its handler")
        return f"queen says {body.get('code')}: {body.get('message')}"

    # -- from the handlers ----------------------------------------------------------------

    def send(self, msg: Item) -> None:
        """A message a handler sends while it runs (progress, a partial result, a
        question, a spawn): to the queen in the order made."""
        if isinstance(msg, list):
            raise TypeError("a forager sends messages, not encoded frames")
        if msg.kind == "task.ask":
            run = self.running.get(msg.ref or "")
            if run is not None:
                request = msg.b.get("request")
                if not isinstance(request, str):
                    pass
                elif msg.b.get("withdraw"):
                    run.asks.pop(request, None)
                else:
                    run.asks[request] = msg
        elif msg.kind == "graph.spawn":
            self._waiting_replies.add(msg.id)
        elif msg.kind == "task.call":
            self._waiting_replies.add(msg.id)
            run = self.running.get(msg.ref or "")
            if run is not None:
                run.calls[msg.id] = msg
        elif msg.kind == "task.step":
            run = self.running.get(msg.ref or "")
            if run is not None:
                run.n += 1
                msg.b["n"] = run.n
                run.steps.append(msg)
        elif msg.kind in _NUMBERED and (msg.kind == "task.progress" or msg.b.get("partial")):
            run = self.running.get(msg.ref or "")
            if run is not None:
                run.n += 1
                msg.b["n"] = run.n  # (the queen takes each number once)
                size = _size(msg.b.get("value"))
                run.updates.append((msg, size))
                run.updates_bytes += size
                while run.updates and (len(run.updates) > UPDATES_KEPT
                                       or run.updates_bytes > UPDATES_KEPT_BYTES):
                    run.updates_bytes -= run.updates.popleft()[1]
        self.outbox.append(msg)

    def finished(self, ref: str, run: int, body: dict[str, Any]) -> bool:
        """The handler of run ``run`` of ``ref`` ended with result ``body``; False if
        that run is not current (a run the queen had stopped, whose assignment id a new
        assignment reuses: its outcome belongs to nobody)."""
        current = self.running.get(ref)
        if current is None or current.run != run:
            return False
        if current.cancelled:
            body = {"status": "cancelled"}
        del self.running[ref]
        if current.updates or current.steps:
            ended = self._ended_updates
            ended[ref] = deque((m, 0) for m in current.numbered()) if current.steps else (
                current.updates)
            while len(ended) > RESENT_MAX:
                ended.popitem(last=False)
        self.outbox.append(p.Message("task.result", body, ref=ref, to="queen"))
        self._kept[ref] = self._kept.get(ref, 0) + 1
        return True

    def stop_all(self) -> None:
        """The forager stops: every running task is cancelled (their ends report so)."""
        for run in self.running.values():
            if not run.cancelled:
                run.cancelled = True
                self.out.append(Stop(run.ref, "the forager is stopping"))

    # -- the session's turns --------------------------------------------------------------

    def welcomed(self, first: bool, updates: Any = None) -> None:
        """Questions still waiting go again: the queen answers one it holds the answer
        to (the answer was lost with a connection), or keeps waiting. ``updates``: the
        welcome's map of each run it took back to the number of the last progress or
        partial result it has; the later ones go again, in order, before anything new
        (a queen that sends no map takes none again)."""
        if first:
            return
        if isinstance(updates, dict):
            for ref, last in updates.items():
                run = self.running.get(ref)
                kept = run.numbered() if run is not None else [
                    m for m, _ in self._ended_updates.get(ref, ())]
                if not kept or not isinstance(last, int):
                    continue
                again = [m for m in kept if m.b["n"] > last]
                # (by number: what waits may be a copy, split back from an unsent batch)
                queued = {m.b.get("n") for m in self.outbox
                          if m.ref == ref and (m.kind in _NUMBERED or m.kind == "task.step")
                          and isinstance(m.b, dict)}
                self.outbox.extendleft(reversed([m for m in again if m.b["n"] not in queued]))
        for run in self.running.values():
            self.outbox.extend(run.asks.values())
            self.outbox.extend(run.calls.values())  # (the queen answers a call once more)
            if run.start is not None:
                run.fetched = []  # (what came on the old connection may be partial)
                self.outbox.append(p.Message("task.steps", {"task": run.task_id},
                                             ref=run.ref, to="queen"))

    def queen_lost(self) -> None:
        """Results sent lately may have died with the old connection: they go first on
        the new one (and the hello lists them, so a restarted queen adopts their tasks)."""
        again: list[p.Message] = []
        for _, _ref, item in self._sent:
            if isinstance(item, p.Message):
                again.append(item)
            else:
                body = {k: v for k, v in item.items() if k != "ref"}
                again.append(p.Message("task.result", body, ref=item["ref"], to="queen"))
        self._sent.clear()
        self.outbox.extendleft(reversed(again))

    def flush(self, now: float, limit: int = FLUSH_MAX) -> list[Item]:
        """What to send now, in order, at most ``limit`` messages of the outbox: a
        handler streaming faster than the connection takes leaves a backlog, and a full
        pipe then costs one slice put back, not the whole backlog walked every turn.
        With ``batch`` negotiated, consecutive results (partial or final) travel as one
        ``task.batch`` (spec §2.4), of at most about BATCH_BYTES of partial values."""
        outbox = self.outbox
        if not outbox:
            return []
        if len(outbox) <= limit:
            take: list[p.Message] = list(outbox)
            outbox.clear()
        else:
            take = [outbox.popleft() for _ in range(limit)]
        singles = min(self._singles, len(take))
        self._singles -= singles
        accepts = self._accepts
        if accepts:
            # Anything sent about a task implies it was accepted.
            for msg in take:
                if msg.ref in accepts:
                    del accepts[msg.ref]
        if "batch" not in self.features or len(take) - singles <= 1:
            return take  # type: ignore[return-value]
        # With batch.progress, progress reports join the run too (an item with "kind");
        # with steps, step records.
        progress = "batch.progress" in self.features
        steps = "steps" in self.features
        budget = self.batch_bytes
        out: list[Item] = list(take[:singles])  # (from a batch that could not be sent)
        results: list[dict[str, Any]] = []
        size = 0
        for msg in take[singles:]:
            kind = msg.kind
            if kind == "task.result" or (progress and kind == "task.progress") or (
                    steps and kind == "task.step"):
                b = msg.b
                v = b.get("value") if b.get("partial") or kind == "task.step" else b.get(
                    "result")
                n = _size(v)
                if results and size + n > budget:
                    out.append(self._results(results))
                    results, size = [], 0
                if kind == "task.result":
                    results.append({**b, "ref": msg.ref})
                elif kind == "task.step":  # (its own kind travels as "step", §2.4)
                    results.append({**b, "ref": msg.ref, "kind": kind, "step": b["kind"]})
                else:
                    results.append({**b, "ref": msg.ref, "kind": kind})
                size += n
                continue
            if results:
                out.append(self._results(results))
                results, size = [], 0
            out.append(msg)
        if results:
            out.append(self._results(results))
        return out

    @staticmethod
    def _results(results: list[dict[str, Any]]) -> p.Message:
        if len(results) == 1:
            return _unbatched(results[0])
        return p.Message("task.batch", {"results": results}, to="queen")

    def sent(self, msg: Item, now: float) -> None:
        """``msg`` (from ``flush``) left: a final result is kept for re-sending."""
        if isinstance(msg, list):
            return
        if msg.kind == "task.batch":
            # Partial results are kept per run (numbered), not as results to re-send.
            self._sent.extend([(now, r["ref"], r) for r in msg.b["results"]
                               if "kind" not in r and not r.get("partial")])
        elif msg.kind == "task.result" and not msg.b.get("partial"):
            self._sent.append((now, str(msg.ref), msg))

    def unsent(self, msgs: list[Item]) -> None:
        """The connection could not take these (from ``flush``): they go first next time."""
        for msg in reversed(msgs):
            if isinstance(msg, list):
                continue  # (a forager sends messages only)
            if msg.kind == "task.batch":
                for r in reversed(msg.b["results"]):
                    self.outbox.appendleft(_unbatched(r))
            else:
                self.outbox.appendleft(msg)

    def unencodable(self, msg: Item, code: str, message: str) -> str | None:
        """``msg`` cannot be sent (msgpack cannot carry it, or it is over the queen's
        limit). A final result becomes a failed one (for good when too large: a retry
        cannot make it smaller); a batch is split; anything else is dropped. Returns a
        line to log, if any."""
        if isinstance(msg, list):
            return None
        if msg.kind == "task.batch":
            # Its items go again one by one (batched again, they would fail again): each
            # that cannot go alone is then dropped or failed as below.
            for r in reversed(msg.b["results"]):
                self.outbox.appendleft(_unbatched(r))
            self._singles += len(msg.b["results"])
            return None
        if msg.kind != "task.result":
            return f"cannot send {msg.kind}: {message}"
        if msg.b.get("partial"):
            return f"dropped a partial result of {msg.ref}: {message}"
        if code == Code.TOO_LARGE:
            error = {"type": "TooLarge", "code": Code.TOO_LARGE,
                     "message": f"result of {message}"}
        else:
            error = {"type": "EncodeError", "message": f"result cannot be encoded: {message}"}
        self.outbox.appendleft(p.Message("task.result", {"status": "error", "error": error},
                                         ref=msg.ref, to="queen"))
        return None

    def tick(self, now: float, patience: float, welcomed: bool) -> None:
        """Implied accepts come due, old sent results are forgotten, a drain ends.
        ``patience``: how long a silent queen is waited for (its heartbeat timeout)."""
        sent = self._sent
        if sent:
            old = now - patience - 2.0
            kept, ended = self._kept, self._ended_updates
            while sent and (sent[0][0] < old or len(sent) > RESENT_MAX):
                ref = sent.popleft()[1]
                n = kept.pop(ref, 1)
                if n > 1:
                    kept[ref] = n - 1
                if ended:
                    ended.pop(ref, None)
        if self.draining and not self.running:
            if not self.outbox:
                self.out.append(Leave())  # drained: leave (the queen is told on the way)
            elif welcomed:
                self._orphaned_since = None
            elif self._orphaned_since is None:
                self._orphaned_since = now
            elif now - self._orphaned_since > patience:
                # Results wait for a queen that is gone (its farewell, or silence): wait
                # a heartbeat timeout for it to come back, not the whole drain timeout.
                # A queen that returns later holds those tasks and runs them again.
                self.out.append(Leave(f"leaving with {len(self.outbox)} messages unsent: "
                                      "the queen is gone"))
        if self._accepts:
            due = [ref for ref, t in self._accepts.items() if t <= now]
            if due:
                waiting = {m.ref for m in self.outbox}  # (these imply the accept)
                for ref in due:
                    del self._accepts[ref]
                    if ref not in waiting:
                        self.outbox.append(p.Message("task.accept", None, ref=ref,
                                                     to="queen"))

    def next_deadline(self) -> float:
        """When ``tick`` next has something to do (an implied accept), with nothing
        arriving meanwhile."""
        return min(self._accepts.values()) if self._accepts else float("inf")


__all__ = ["ACCEPT_DELAY", "BATCH_BYTES", "Action", "Answered", "Delivered", "ForagerSession",
           "Leave", "Reply", "Run", "Start", "Stop"]
