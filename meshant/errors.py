"""Exceptions users of meshant see. Every one is a :class:`MeshantError` with a stable
``code`` (a :class:`meshant.protocol.codes.Code` value) and a ``message``, and each
belongs to one group, named for what the caller can do about it (as h11 and httpcore
group theirs):

* :class:`RetryLater` — nothing is wrong with the request; try again later:
  :class:`QueueFull`, :class:`RateLimited`, :class:`NotLeader`;
* :class:`BadInput` — fix the request (also a ``ValueError``): a protocol error
  (:class:`meshant.protocol.ProtocolError`: :class:`~meshant.protocol.LocalProtocolError`
  for what this side would send, :class:`~meshant.protocol.RemoteProtocolError` for what
  the other side sent), :class:`Refused` (a name, role or key the queen does not accept),
  :class:`Forbidden` (an operation the key's role may not do);
* :class:`TaskOutcome` — the task's own end: :class:`TaskFailed`,
  :class:`TaskCancelled`, :class:`TooLarge`, :class:`NoForager`,
  :class:`DeadlineExceeded`, :class:`GraphFailed`;
* :class:`Timeout` — a wait ran out (also a ``TimeoutError``): :class:`QueenUnreachable`,
  :class:`AskTimeout`;
* :class:`ConfigError` — a setting that cannot work (also a ``ValueError``);
* :class:`JournalError` — the journal cannot be used (:class:`Deposed`: another queen
  leads now).

Errors from the wire are made here, in one place (:func:`from_error_body`); ZeroMQ's
own errors are translated at the actors' boundary (``meshant.actors._boundary``) and
never reach a caller. The codes are literals here (this module imports nothing of
meshant, so every layer may import it); ``tests/test_layout.py`` checks each is a
``Code``.
"""

from __future__ import annotations

from typing import Any


class MeshantError(Exception):
    """Base of every error meshant raises to its users."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.detail = detail


# -- retry later ------------------------------------------------------------------------


class RetryLater(MeshantError):
    """Nothing is wrong with the request: the colony cannot take it now. Try again."""


class QueueFull(RetryLater):
    """The queen's queue is full (or this client holds as much as it may): back off and
    submit again."""

    code = "queue-full"


class RateLimited(RetryLater):
    """The queen kept refusing a submission as too fast for longer than the client's
    ``submit_timeout``: submit more slowly, or raise the queen's ``--submit-rate``."""

    code = "rate-limited"


class NotLeader(RetryLater):
    """The queen asked is a standby: ``detail["leader"]`` names the leader's endpoint
    when known (a peer that follows leaders goes there by itself)."""

    code = "not-leader"


# -- bad input --------------------------------------------------------------------------


class BadInput(MeshantError, ValueError):
    """The request cannot be done as it is: fix it. Also a ``ValueError``."""

    code = "bad-value"


class Refused(BadInput):
    """The queen refused this peer (name taken, a key not allowed, a refused hello)."""

    code = "refused"


class Forbidden(BadInput):
    """The queen refused an operation this key's role may not do (``detail["operation"]``
    names it): use an admin key, or act on your own tasks."""

    code = "forbidden"


# -- the task's own outcome -------------------------------------------------------------


class TaskOutcome(MeshantError):
    """The task ended without a result: its own outcome, not the colony's fault."""


class TaskFailed(TaskOutcome):
    """The task failed: ``remote_type`` and ``message`` come from the handler's exception,
    ``remote_traceback`` is where it was raised (on the forager), as Python prints it.
    Printed unhandled, the exception shows that traceback after its own."""

    code = "handler-error"

    def __init__(self, message: str, *, code: str | None = None, remote_type: str = "",
                 **detail: Any) -> None:
        super().__init__(message, code=code, **detail)
        self.remote_type = remote_type
        lines = format_frames(detail.get("traceback"))
        self.remote_traceback = "\n".join(lines)
        if lines:
            where = detail.get("forager")
            self.add_note(f"The handler's traceback{f' on {where}' if where else ''} "
                          "(most recent call last):\n" + self.remote_traceback)

    def __str__(self) -> str:
        return f"{self.remote_type}: {self.message}" if self.remote_type else self.message


class StepFailed(TaskFailed):
    """A durable step's recorded exception, raised again when a re-run replays the step
    (its type was not a built-in one this process could raise as itself)."""


class NonDeterministic(TaskOutcome):
    """A re-run of a durable handler asked for another step than the one recorded at a
    position: the task fails at once (docs/durable.md)."""

    code = "nondeterministic"


def format_frames(tb: Any) -> list[str]:
    """A failed result's ``traceback`` (a list of ``{file, line, function, source}``,
    innermost last) as the lines Python prints for one; malformed entries are skipped."""
    lines: list[str] = []
    if not isinstance(tb, list):
        return lines
    for f in tb:
        if not isinstance(f, dict):
            continue
        lines.append(f'  File "{f.get("file", "?")}", line {f.get("line", "?")}, '
                     f'in {f.get("function", "?")}')
        if f.get("source"):
            lines.append(f"    {f['source']}")
    return lines


class TaskCancelled(TaskOutcome):
    """The task was cancelled before it finished."""

    code = "cancelled"


class TooLarge(TaskOutcome):
    """A message over the queen's size limit (``--max-message``), a task's result or a
    submission: send less, or raise the limit. The message names the size and the limit."""

    code = "too-large"


class NoForager(TaskOutcome):
    """No forager offering the capability joined within the wait."""

    code = "no-forager"


class DeadlineExceeded(TaskOutcome):
    """The task ran past its timeout."""

    code = "deadline-exceeded"


class GraphFailed(TaskOutcome):
    """A task graph ended failed (``failed`` names the node) or cancelled. ``results``
    holds what its completed nodes returned, ``errors`` the other nodes' errors."""

    code = "graph-failed"

    def __init__(self, message: str, *, code: str | None = None, failed: str | None = None,
                 results: dict[str, Any] | None = None,
                 errors: dict[str, MeshantError] | None = None, **detail: Any) -> None:
        super().__init__(message, code=code, **detail)
        self.failed = failed
        self.results = results or {}
        self.errors = errors or {}


# -- timeouts ---------------------------------------------------------------------------


class Timeout(MeshantError, TimeoutError):
    """A wait ran out (an answer, an update, the queen). Also a ``TimeoutError``."""

    code = "timeout"


class QueenUnreachable(Timeout):
    """No answer from the queen within the timeout: check the endpoint and that it runs."""

    code = "queen-unreachable"


class AskTimeout(Timeout):
    """``ctx.ask`` waited its ``timeout`` and no answer came: the handler may fail the
    task (let it propagate) or go on without the input."""

    code = "ask-timeout"


# -- configuration and the journal ------------------------------------------------------


class ConfigError(MeshantError, ValueError):
    """A setting that cannot work (a malformed endpoint, contradictory options, an
    unknown setting): fix the call or the command line. Also a ``ValueError``."""

    code = "bad-config"


class JournalError(MeshantError):
    """The journal cannot be used (corrupt, foreign, a newer schema, unreachable)."""

    code = "bad-journal"


class Deposed(JournalError):
    """This queen's term is over: another queen leads. Nothing was written."""

    code = "not-leader"


# Errors a failed result or an ``error`` message may carry, by code; the codes of a
# request the queen refused as it is (``_BAD_INPUT``, ``_RETRY``); any other code is the
# task's own failure (TaskFailed).
_BY_CODE: dict[str, type[MeshantError]] = {
    cls.code: cls
    for cls in (QueueFull, NoForager, DeadlineExceeded, TaskCancelled, TooLarge, RateLimited,
                Forbidden, NotLeader, AskTimeout, NonDeterministic)
}
_BY_CODE["queen-lost"] = QueenUnreachable  # (a request its queen was lost before answering)
_BAD_INPUT = frozenset({
    "bad-magic", "truncated", "bad-version", "unknown-kind", "bad-msgpack", "bad-json",
    "bad-type", "missing-field", "too-many-frames", "bad-blob", "bad-flags", "bad-value",
    "not-registered", "name-taken", "bad-name", "bad-hello", "not-allowed", "duplicate-task",
    "unknown-recipient", "unknown-task", "not-yours", "bad-from", "wrong-role", "unsupported",
    "bad-topic", "unknown-question", "already-answered", "cursor-expired", "bad-graph",
    "graph-too-large", "unknown-graph", "unknown-schedule", "schedule-exists"})
_RETRY = frozenset({"inbox-full", "too-many-peers"})


def from_error_body(err: dict[str, Any]) -> MeshantError:
    """Turn the ``error`` map of a failed result (or an ``error`` message) into an exception."""
    code = str(err.get("code", "error"))
    message = str(err.get("message", ""))
    detail = {k: v for k, v in err.items() if k not in ("code", "message", "type")}
    cls = _BY_CODE.get(code)
    if cls is None and code in _BAD_INPUT:
        cls = BadInput
    elif cls is None and code in _RETRY:
        cls = RetryLater
    if cls is not None:
        return cls(message, code=code, **detail)
    return TaskFailed(message, code=code, remote_type=str(err.get("type", "")), **detail)


__all__ = ["AskTimeout", "BadInput", "ConfigError", "DeadlineExceeded", "Deposed", "Forbidden",
           "GraphFailed", "JournalError", "MeshantError", "NoForager", "NonDeterministic",
           "NotLeader",
           "QueenUnreachable", "QueueFull", "RateLimited", "Refused", "RetryLater",
           "StepFailed", "TaskCancelled", "TaskFailed", "TaskOutcome", "Timeout", "TooLarge",
           "format_frames", "from_error_body"]
