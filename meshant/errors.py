"""Exceptions users of meshant see. Every one is a :class:`MeshantError` with a stable
``code`` (a :class:`meshant.protocol.codes.Code` value) and a ``message``.

By what the caller can do about them:

* retry later — :class:`QueueFull`, :class:`RateLimited`, :class:`QueenUnreachable`;
* fix the input — :class:`TooLarge`, :class:`ConfigError`,
  :class:`meshant.protocol.ProtocolError` (anything malformed on the wire), and
  :class:`Refused` (a name, role or key the queen does not accept);
* the task's own outcome — :class:`TaskFailed`, :class:`TaskCancelled`,
  :class:`DeadlineExceeded`, :class:`NoForager`.

The codes are literals here (this module imports nothing of meshant, so every layer may
import it); ``tests/test_layout.py`` checks each is a ``Code``.
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


class ConfigError(MeshantError, ValueError):
    """A setting that cannot work (a malformed endpoint, contradictory options): fix the
    call or the command line. Also a ``ValueError``."""

    code = "bad-config"


class QueenUnreachable(MeshantError):
    """No answer from the queen within the timeout: check the endpoint and that it runs."""

    code = "queen-unreachable"


class Refused(MeshantError):
    """The queen refused this peer (hello refused, name taken, bad input)."""

    code = "refused"


class QueueFull(MeshantError):
    """The queen's queue is full: back off and submit again."""

    code = "queue-full"


class TooLarge(MeshantError):
    """A message over the queen's size limit (``--max-message``): send less, or raise the
    limit. The message names the size and the limit."""

    code = "too-large"


class RateLimited(MeshantError):
    """The queen kept refusing a submission as too fast for longer than the client's
    ``submit_timeout``: submit more slowly, or raise the queen's ``--submit-rate``."""

    code = "rate-limited"


class NoForager(MeshantError):
    """No forager offering the capability joined within the wait."""

    code = "no-forager"


class DeadlineExceeded(MeshantError):
    """The task ran past its timeout."""

    code = "deadline-exceeded"


class TaskCancelled(MeshantError):
    """The task was cancelled before it finished."""

    code = "cancelled"


class TaskFailed(MeshantError):
    """The task failed: ``remote_type`` and ``message`` come from the handler's exception."""

    code = "handler-error"

    def __init__(self, message: str, *, code: str | None = None, remote_type: str = "",
                 **detail: Any) -> None:
        super().__init__(message, code=code, **detail)
        self.remote_type = remote_type

    def __str__(self) -> str:
        return f"{self.remote_type}: {self.message}" if self.remote_type else self.message


class AskTimeout(MeshantError):
    """``ctx.ask`` waited its ``timeout`` and no answer came: the handler may fail the
    task (let it propagate) or go on without the input."""

    code = "ask-timeout"


class Forbidden(MeshantError):
    """The queen refused an operation this key's role may not do (``detail["operation"]``
    names it): use an admin key, or act on your own tasks."""

    code = "forbidden"
class GraphFailed(MeshantError):
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


# Errors a failed result or an ``error`` message may carry, by code; any other code is
# the task's own failure (TaskFailed).
_BY_CODE: dict[str, type[MeshantError]] = {
    cls.code: cls
    for cls in (QueueFull, NoForager, DeadlineExceeded, TaskCancelled, TooLarge, RateLimited,
                Forbidden)
}


def from_error_body(err: dict[str, Any]) -> MeshantError:
    """Turn the ``error`` map of a failed result (or an ``error`` message) into an exception."""
    code = str(err.get("code", "error"))
    message = str(err.get("message", ""))
    detail = {k: v for k, v in err.items() if k not in ("code", "message", "type")}
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, code=code, **detail)
    return TaskFailed(message, code=code, remote_type=str(err.get("type", "")), **detail)
