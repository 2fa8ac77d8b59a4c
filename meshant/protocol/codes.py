"""Every error code meshant uses, in one place: ``Code``, a ``StrEnum``.

Codes are stable strings that peers, scripts and the journal match on; a member compares
equal to (and encodes as) its string, so ``Code.QUEUE_FULL == "queue-full"``. Grouped
by who says it.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    # A malformed message (``ProtocolError``, and the queen's answer to one).
    BAD_MAGIC = "bad-magic"
    TRUNCATED = "truncated"
    BAD_VERSION = "bad-version"
    UNKNOWN_KIND = "unknown-kind"
    BAD_MSGPACK = "bad-msgpack"
    BAD_JSON = "bad-json"
    BAD_TYPE = "bad-type"
    MISSING_FIELD = "missing-field"
    TOO_LARGE = "too-large"
    TOO_MANY_FRAMES = "too-many-frames"
    BAD_BLOB = "bad-blob"
    BAD_FLAGS = "bad-flags"
    BAD_VALUE = "bad-value"

    # The queen refuses a message (an ``error`` reply).
    NOT_REGISTERED = "not-registered"
    NAME_TAKEN = "name-taken"
    BAD_NAME = "bad-name"
    BAD_HELLO = "bad-hello"
    NOT_ALLOWED = "not-allowed"
    RATE_LIMITED = "rate-limited"
    QUEUE_FULL = "queue-full"
    DUPLICATE_TASK = "duplicate-task"
    UNKNOWN_RECIPIENT = "unknown-recipient"
    UNKNOWN_TASK = "unknown-task"
    NOT_YOURS = "not-yours"
    BAD_FROM = "bad-from"
    WRONG_ROLE = "wrong-role"
    TOO_MANY_PEERS = "too-many-peers"
    UNSUPPORTED = "unsupported"
    BAD_TOPIC = "bad-topic"
    NOT_LEADER = "not-leader"  # a standby queen: ``leader`` names the leader's endpoint
    FORBIDDEN = "forbidden"  # the key's role may not do this operation
    UNKNOWN_QUESTION = "unknown-question"
    ALREADY_ANSWERED = "already-answered"
    CURSOR_EXPIRED = "cursor-expired"
    INBOX_FULL = "inbox-full"
    # Task graphs: a graph refused whole (a cycle, a missing or duplicate name...), one
    # over --max-graph-nodes, a graph id the queen does not know.
    BAD_GRAPH = "bad-graph"
    GRAPH_TOO_LARGE = "graph-too-large"
    UNKNOWN_GRAPH = "unknown-graph"
    # Schedules: a name the queen has no schedule of; an add of a name in use.
    UNKNOWN_SCHEDULE = "unknown-schedule"
    SCHEDULE_EXISTS = "schedule-exists"

    # A task's final error (``code``), stable for scripts. TOO_LARGE above also ends one.
    HANDLER_ERROR = "handler-error"
    REJECTED = "rejected"
    ATTEMPTS_EXHAUSTED = "attempts-exhausted"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    NO_FORAGER = "no-forager"
    CANCELLED = "cancelled"
    ASK_TIMEOUT = "ask-timeout"  # a question's timeout passed without an answer (handler)
    # A re-run asked for another step than the one recorded at a position (durable
    # agents): never retried, a re-run would diverge again.
    NONDETERMINISTIC = "nondeterministic"
    UPSTREAM_FAILED = "upstream-failed"  # a graph node a failed node's failure cancelled
    GRAPH_FAILED = "graph-failed"  # a graph's end, raised in the client (GraphFailed)
    # Why its last attempt failed (the error's ``cause``: the dead-letter classification),
    # besides HANDLER_ERROR, REJECTED, DEADLINE_EXCEEDED, NO_FORAGER and TOO_LARGE.
    ASSIGN_TIMEOUT = "assign-timeout"
    FORAGER_LOST = "forager-lost"

    # Raised in this process, never sent (``MeshantError.code``).
    ERROR = "error"
    BAD_CONFIG = "bad-config"
    QUEEN_UNREACHABLE = "queen-unreachable"
    QUEEN_LOST = "queen-lost"
    REFUSED = "refused"
    CLOSED = "closed"
    TIMEOUT = "timeout"
    BAD_KEY = "bad-key"
    WRONG_QUEEN_KEY = "wrong-queen-key"
    IO_FAILED = "io-failed"
    BAD_JOURNAL = "bad-journal"
    AMBIGUOUS = "ambiguous"
