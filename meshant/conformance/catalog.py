"""Every check of the conformance kit, with the section of docs/protocol.md it tests.

One table, so the spec's appendix (kept equal to it by a test) and the kit's output name
each other: a reader of a MUST finds the check that tests it, and a FAIL line names the
section to read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckInfo:
    id: str
    section: str
    title: str


_F = "forager"
_Q = "queen"

CHECKS: tuple[tuple[str, CheckInfo], ...] = tuple((kit, CheckInfo(i, s, t)) for kit, i, s, t in (
    # The kit plays the queen against a forager.
    (_F, "f.decode", "§2", "every message the forager sends decodes (framing, flags, kinds)"),
    (_F, "f.hello", "§5.1", "the forager's first message is hello (or an IACP 1.1 hb)"),
    (_F, "f.hello-fields", "§5.1", "hello has role, versions with 2, msgpack, a valid name, "
     "slots 1-10000 and tool names"),
    (_F, "f.from", "§9", "after the welcome, 'from' is the registered name"),
    (_F, "f.heartbeat", "§7a", "an idle forager sends something every hb_interval"),
    (_F, "f.assign", "§6", "a task.assign is answered with a well-formed result, ref = "
     "assign id"),
    (_F, "f.assigns", "§2.4", "task.assigns (batch negotiated): one result per item, by ref"),
    (_F, "f.progress", "§6", "progress and partial results come before the final result, "
     "in order"),
    (_F, "f.lease", "§7a", "a running task's assign id is listed in hb.running every interval"),
    (_F, "f.cancel", "§6", "task.cancel stops the handler; an answer is a final result"),
    (_F, "f.stale-cancel", "§5.4", "a task.cancel for an assignment it does not hold "
     "changes nothing"),
    (_F, "f.blobs", "§2.3", "bytes of 100 KiB come back intact (as blobs when negotiated)"),
    (_F, "f.bad-input", "§9", "malformed messages from the queen do not stop the forager"),
    (_F, "f.reconnect", "§7a", "a new queen epoch on PUB makes the forager say hello again"),
    (_F, "f.rejoin", "§5.4", "after a reconnect, hello lists the running assignment, and "
     "a task.cancel for it stops it"),
    (_F, "f.no-features", "§5.2", "without progress, batch and blobs negotiated, none is used"),
    (_F, "f.legacy", "§8", "an IACP 1.1 forager answers a JSON task.assign with ref = its id"),
    # The kit plays foragers and clients against a queen.
    (_Q, "q.welcome", "§5.2", "hello is answered by welcome with the negotiated terms"),
    (_Q, "q.not-registered", "§5.1", "anything before hello is refused not-registered"),
    (_Q, "q.refusals", "§5.3", "each bad hello is refused with its code"),
    (_Q, "q.name-taken", "§5.5", "a live peer's name, without its session, is name-taken"),
    (_Q, "q.rate-limited", "§9", "hellos faster than the queen's rate are rate-limited, "
     "with retry_after"),
    (_Q, "q.decode-errors", "§9", "each malformed message is refused with its code and "
     "changes nothing"),
    (_Q, "q.queen-errors", "§9", "bad-from, unsupported, unknown-recipient, unknown-task, "
     "bad-value"),
    (_Q, "q.lifecycle", "§6", "submit, ack, assign, accept, progress, partial, result, "
     "in seq order"),
    (_Q, "q.bad-answer", "§6", "a malformed forager answer is bad-value; the attempt stays "
     "current"),
    (_Q, "q.not-yours", "§9", "an answer about another forager's assignment is not-yours"),
    (_Q, "q.duplicate-task", "§3", "a submit id another client used is duplicate-task"),
    (_Q, "q.handler-error", "§6", "an error result fails the task handler-error"),
    (_Q, "q.rejected", "§6", "a task every capable forager rejects fails rejected"),
    (_Q, "q.no-forager", "§6", "a task nobody can serve fails no-forager after wait"),
    (_Q, "q.deadline", "§6", "a task past its timeout fails deadline-exceeded"),
    (_Q, "q.cancel", "§6", "a client's cancel ends the task cancelled and cancels the "
     "assignment"),
    (_Q, "q.delayed", "§6", "a submission with after is delayed (task.state, not_before), "
     "assigned no earlier, cancellable while it waits; a bad delay is bad-value"),
    (_Q, "q.schedules", "§7e", "a schedule's ticks are assigned as tasks with the tick's "
     "idempotency key, none early; list, pause (no more ticks), remove; a bad cron is "
     "bad-value, an unknown name unknown-schedule, a second add schedule-exists"),
    (_Q, "q.exhausted", "§6", "a task whose forager leaves, with no attempts left, fails "
     "attempts-exhausted"),
    (_Q, "q.fencing", "§6", "a late result of an abandoned attempt is dropped: one final "
     "result"),
    (_Q, "q.batch", "§2.4", "task.batch from a forager delivers each item; without batch "
     "it is unsupported"),
    (_Q, "q.features", "§5.2", "progress, mem.sync and broadcast reach only peers that "
     "negotiated them"),
    (_Q, "q.services", "§7", "status.query, tool.query and mem.sync answer as specified"),
    (_Q, "q.questions", "§6a", "task.ask is relayed to the submitter (progress negotiated "
     "only), input-required, answered once, to the forager"),
    (_Q, "q.steps", "§6b", "task.step records kept in order; a suspended task wakes with "
     "them in its re-run's assign; task.call: one child per position"),
    (_Q, "q.attach", "§6a", "task.attach replays the updates after a cursor as task.update, "
     "ending with the result; unknown-task"),
    (_Q, "q.inbox", "§6a", "a msg to a name not connected is kept, listed, delivered once "
     "(kept: true), with receipts"),
    (_Q, "q.graphs", "§7d", "graph.submit runs nodes on their inputs' results; "
     "graph.state, graph.result, a re-send, bad-graph"),
    (_Q, "q.graph-cancel", "§7d", "graph.cancel cancels the running node's task and ends the "
     "pending ones cancelled"),
    (_Q, "q.legacy", "§8", "an IACP 1.1 forager registers by hb and is assigned in JSON"),
))

BY_ID: dict[str, CheckInfo] = {c.id: c for _, c in CHECKS}


def checks_of(kit: str) -> list[CheckInfo]:
    """The checks one kit (``forager`` or ``queen``) runs, in order."""
    return [c for k, c in CHECKS if k == kit]
