"""The kind table: every message kind, its wire code, and the body fields it must carry.

Everything that decides whether a body is valid for a kind lives in this table, so a new
kind or field is one row, not a new branch somewhere in a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshant.protocol.errors import BAD_TYPE, BAD_VALUE, MISSING_FIELD, UNKNOWN_KIND, ProtocolError

NOTE_MAX = 80

_NUM = (int, float)
_ANY = object


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    types: type | tuple[type, ...]
    required: bool = False


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    code: int
    meaning: str
    fields: tuple[Field, ...] = ()


def _f(name: str, types: type | tuple[type, ...], required: bool = False) -> Field:
    return Field(name, types, required)


_ERR = (_f("code", str, True), _f("message", str, True), _f("retry_after", _NUM),
        _f("assign", str), _f("operation", str), _f("cursor", int))

KINDS: tuple[Kind, ...] = (
    # Negotiation and errors
    Kind("hello", 1, "peer introduces itself: role, name, versions, features, slots, tools",
         (_f("role", str, True), _f("versions", list, True), _f("name", str),
          _f("codecs", list), _f("features", list), _f("slots", int), _f("tools", list),
          _f("labels", dict), _f("host", str), _f("pid", int), _f("running", list),
          _f("session", str), _f("describe", dict))),
    Kind("welcome", 2, "queen accepts a hello and states the negotiated terms",
         (_f("version", int, True), _f("features", list, True), _f("hb_interval", _NUM, True),
          _f("hb_misses", int, True), _f("assign_timeout", _NUM, True), _f("epoch", str, True),
          _f("pub", str), _f("queen", str), _f("name", str), _f("max_message", int),
          _f("max_broadcast", int), _f("updates", dict))),
    Kind("error", 3, "refusal or error: machine-readable code and a sentence", _ERR),
    # Task lifecycle (IACP 1.1 kinds keep their meaning)
    Kind("task.submit", 10, "client submits a task",
         (_f("capability", str, True), _f("payload", _ANY), _f("priority", int),
          _f("timeout", _NUM), _f("to", str), _f("labels", dict), _f("max_attempts", int),
          _f("wait", _NUM), _f("ack", bool), _f("key", str), _f("retry_base", _NUM),
          _f("retry_cap", _NUM), _f("retry_on", list), _f("at", _NUM), _f("after", _NUM),
          _f("concurrency", dict), _f("cost", _NUM))),
    Kind("task.submitted", 11, "queen acknowledges a submission",
         (_f("task", str, True), _f("original", str))),
    Kind("task.assign", 12, "queen assigns a task graph node to a forager",
         (_f("node", str), _f("task", str), _f("attempt", int), _f("capability", str),
          _f("payload", _ANY), _f("deadline", _NUM), _f("timeout", _NUM),
          _f("steps", list), _f("steps_total", int), _f("parent", str))),
    Kind("task.accept", 13, "forager accepts an assign (ref = assign id)"),
    Kind("task.reject", 14, "forager rejects an assign; reason required",
         (_f("reason", str, True),)),
    Kind("task.result", 15, "a result; partial results carry partial: true",
         (_f("partial", bool), _f("value", _ANY), _f("status", str), _f("result", _ANY),
          _f("error", dict), _f("task", str), _f("seq", int), _f("state", str),
          _f("attempt", int), _f("original", str), _f("n", int), _f("wait", dict))),
    Kind("task.cancel", 16, "cancel a task (client → queen) or an attempt (queen → forager)",
         (_f("task", str), _f("ack", bool))),
    Kind("task.progress", 17, "progress of a running task; renews its lease",
         (_f("fraction", _NUM), _f("note", str), _f("task", str), _f("seq", int),
          _f("attempt", int), _f("n", int), _f("charge", _NUM))),
    Kind("task.status", 18, "ask for the state of one task", (_f("task", str, True),)),
    Kind("task.state", 19, "the state of one task",
         (_f("task", str, True), _f("state", str, True), _f("not_before", _NUM),
          _f("held", str))),
    Kind("task.batch", 20, "several task.result bodies (and task.progress ones, negotiated: "
         "batch.progress) in one message (negotiated: batch)",
         (_f("results", list, True),)),
    Kind("task.assigns", 21, "several task.assign bodies, each with its id (negotiated: batch)",
         (_f("assigns", list, True),)),
    # Liveness, memory, tools, control
    Kind("hb", 30, "heartbeat; body is the sender's registry record",
         (_f("slots", int), _f("tools", list), _f("running", list), _f("in_flight", int),
          _f("state", str), _f("epoch", str), _f("mem_seq", int), _f("queen", str),
          _f("interval", _NUM))),
    Kind("mem.sync", 31, "colony memory: set, delete, snapshot, update, ok",
         (_f("op", str, True), _f("key", str), _f("value", _ANY), _f("ttl", _NUM),
          _f("seq", int), _f("items", dict), _f("deleted", bool))),
    Kind("tool.query", 32, "which live foragers serve a tool", (_f("tool", str, True),)),
    Kind("tool.reply", 33, "answer to tool.query",
         (_f("tool", str, True), _f("foragers", list, True))),
    Kind("ctl.drain", 34, "finish current tasks, accept nothing new"),
    Kind("ctl.halt", 35, "stop immediately"),
    Kind("status.query", 36, "ask the queen for its registry and queue depths"),
    Kind("status.reply", 37, "registry and queue depths",
         (_f("foragers", list, True), _f("queues", dict, True))),
    Kind("dlq", 38, "dead-letter queue: list, show, retry or purge",
         (_f("op", str, True), _f("task", str), _f("all", bool))),
    Kind("dlq.reply", 39, "answer to dlq",
         (_f("op", str, True), _f("items", list), _f("tasks", list))),
    # Peer-to-peer
    Kind("broadcast", 40, "fan out to subscribers of a topic",
         (_f("topic", str, True), _f("data", _ANY))),
    Kind("msg", 41, "directed agent message, routed by name"),
    Kind("note", 42, "one-line note, at most 80 characters", (_f("text", str, True),)),
    # Agents in conversation: questions, attachable streams, durable inboxes
    Kind("task.ask", 60, "a running task asks for input (forager → queen → watchers); "
         "withdraw: the handler stopped waiting",
         (_f("request", str, True), _f("prompt", _ANY), _f("data", _ANY), _f("task", str),
          _f("seq", int), _f("timeout", _NUM), _f("withdraw", bool))),
    Kind("task.answer", 61, "the answer to a question (client → queen → forager)",
         (_f("task", str, True), _f("value", _ANY), _f("request", str), _f("by", str))),
    Kind("task.answered", 62, "queen confirms an answer was taken",
         (_f("task", str, True), _f("request", str, True))),
    Kind("task.attach", 63, "follow a task's updates after a sequence cursor",
         (_f("task", str, True), _f("after", int))),
    Kind("task.attached", 64, "queen confirms an attach: what is kept, the task's state",
         (_f("task", str, True), _f("state", str, True), _f("after", int), _f("last", int))),
    Kind("task.update", 65, "one update of an attached task: progress, partial, ask, result",
         (_f("task", str, True), _f("seq", int, True), _f("kind", str, True),
          _f("body", dict, True))),
    Kind("inbox", 66, "a name's durable inbox: list or purge",
         (_f("op", str, True), _f("name", str, True))),
    Kind("inbox.reply", 67, "answer to inbox",
         (_f("op", str, True), _f("name", str, True), _f("items", list), _f("purged", int))),
    Kind("msg.receipt", 68, "a kept message was delivered, or expired (asked with receipt)",
         (_f("message", str, True), _f("to", str, True), _f("status", str, True),
          _f("at", _NUM))),
    # Durable agents: a handler's steps, sub-tasks and waits (negotiated: steps)
    Kind("task.step", 70, "a handler's step ran: its record (forager → queen, ref = assign "
         "id; numbered n with the run's updates)",
         (_f("position", int, True), _f("kind", str, True), _f("name", str, True),
          _f("occurrence", int, True), _f("value", _ANY), _f("error", dict), _f("child", str),
          _f("until", _NUM), _f("request", str), _f("seconds", _NUM), _f("n", int))),
    Kind("task.steps", 71, "a re-run asks its task's recorded steps (forager → queen, ref = "
         "assign id); the queen answers with them",
         (_f("task", str), _f("steps", list), _f("total", int), _f("from", int))),
    Kind("task.call", 72, "a handler starts a sub-task at a step position (forager → queen, "
         "ref = assign id); its result comes as the child's task.result",
         (_f("position", int, True), _f("capability", str, True), _f("payload", _ANY),
          _f("options", dict), _f("task", str))),
    Kind("task.called", 73, "queen answers a task.call: the sub-task's state, and its final "
         "result if it ended (ref = the call's id)",
         (_f("child", str, True), _f("state", str, True), _f("final", dict))),
    # Schedules: tasks submitted at the ticks of a cron expression, kept by the queen
    Kind("schedule", 80, "schedules: add, list, show, pause, resume, remove or trigger",
         (_f("op", str, True), _f("name", str), _f("cron", str), _f("tz", str),
          _f("capability", str), _f("payload", _ANY), _f("overlap", str),
          _f("catch_up", str), _f("options", dict), _f("paused", bool), _f("replace", bool))),
    Kind("schedule.reply", 81, "answer to schedule",
         (_f("op", str, True), _f("items", list), _f("schedule", dict), _f("task", str))),
    # Task graphs (id = the graph's id; its nodes run as tasks "tg:<graph>/<node>")
    Kind("graph.submit", 50, "client submits a graph of named, dependent nodes",
         (_f("nodes", list, True), _f("updates", bool))),
    Kind("graph.submitted", 51, "queen accepted a whole graph (else an error: nothing ran)",
         (_f("graph", str, True), _f("nodes", int))),
    Kind("graph.status", 52, "ask for the state of a graph and its nodes",
         (_f("graph", str, True),)),
    Kind("graph.state", 53, "a graph's state, with each node's",
         (_f("graph", str, True), _f("state", str, True), _f("client", str),
          _f("nodes", int), _f("counts", dict), _f("node_states", list), _f("failed", str))),
    Kind("graph.cancel", 54, "cancel a graph: its pending and running nodes",
         (_f("graph", str, True),)),
    Kind("graph.node", 55, "a node's state changed outside its task (started, cancelled)",
         (_f("graph", str, True), _f("node", str, True), _f("state", str, True),
          _f("task", str), _f("error", dict))),
    Kind("graph.result", 56, "a graph ended: its state, counts and the failed node",
         (_f("graph", str, True), _f("state", str, True), _f("client", str),
          _f("nodes", int), _f("counts", dict), _f("failed", str))),
    Kind("graph.spawn", 57, "a running node adds nodes to its graph (ref = its assign id)",
         (_f("nodes", list, True),)),
    Kind("graph.spawned", 58, "queen added the spawned nodes",
         (_f("graph", str, True), _f("nodes", list, True))),
)

BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
BY_CODE: dict[int, Kind] = {k.code: k for k in KINDS}


def kind_by_name(name: str) -> Kind:
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ProtocolError(UNKNOWN_KIND, f"unknown message kind {name!r}") from None


def kind_by_code(code: int) -> Kind:
    try:
        return BY_CODE[code]
    except KeyError:
        raise ProtocolError(UNKNOWN_KIND, f"unknown kind code {code}") from None


def _compile(kind: Kind) -> tuple[tuple[str, ...], dict[str, tuple[tuple[type, ...], bool]]]:
    required = tuple(f.name for f in kind.fields if f.required)
    typed = {f.name: (_as_tuple(f.types), bool in _as_tuple(f.types))
             for f in kind.fields if f.types is not _ANY}
    return required, typed


def validate_body(kind: Kind, body: object) -> None:
    """Check ``body`` against the kind's row. Unknown fields are ignored, never rejected."""
    if body is None:
        body = {}
    elif body.__class__ is not dict:
        raise ProtocolError(BAD_TYPE, f"{kind.name} body must be a map, not {type(body).__name__}")
    required, typed = _CHECKS[kind.code]
    for name in required:
        if name not in body:
            raise ProtocolError(MISSING_FIELD, f"{kind.name} body needs field {name!r}")
    # Walk the body (usually a few keys) rather than the kind's field list.
    get = typed.get
    for name, value in body.items():
        spec = get(name)
        if spec is None:
            continue  # an unknown or untyped field
        types, bool_ok = spec
        # bool is an int in Python; a flag must not pass as a count or the other way round.
        if not isinstance(value, types) or (value.__class__ is bool and not bool_ok):
            raise ProtocolError(BAD_TYPE, f"{kind.name} body field {name!r} has the wrong "
                                f"type ({type(value).__name__})")
    if kind.code == _NOTE_CODE:
        text = body["text"]
        if len(text) > NOTE_MAX or "\n" in text or "\r" in text:
            raise ProtocolError(BAD_VALUE, f"a note is one line of at most {NOTE_MAX} characters")


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


_CHECKS = {k.code: _compile(k) for k in KINDS}
_NOTE_CODE = BY_NAME["note"].code
