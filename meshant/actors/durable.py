"""A handler's durable steps, on the forager's side: what ``ctx.step``, ``ctx.call``,
``ctx.sleep`` and a durable ``ctx.ask`` do (the rules are the sans-IO
:mod:`meshant.core.tasks.steps`; the queen journals the records).

Each of those calls takes the run's next step position. Replayed (a later run of the task
reached a position an earlier run recorded), it gives the record back without running
anything; new, it runs the step and sends its record to the queen — numbered with the
run's updates, so a reconnect sends again what the queen had not taken — before the
handler goes on. A wait (a sleep, a durable ask, see :class:`Suspend`) ends the run: the
slot is free, and the queen runs the task again when what it waits for comes.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Protocol

import msgpack

from meshant import protocol as p
from meshant.actors.failures import error_body
from meshant.core.tasks.steps import (
    INLINE_BYTES,
    NAME_MAX,
    STEPS_BYTES,
    STEPS_MAX,
    Divergence,
    Replay,
    child_id,
)
from meshant.errors import (
    ConfigError,
    MeshantError,
    StepFailed,
    TooLarge,
    from_error_body,
)
from meshant.protocol.codes import Code


class Suspend(BaseException):
    """Raised inside a handler to end its run as *suspended*: the task waits for
    ``wait`` (``until`` a wall-clock time, an answer to ``request``). A BaseException,
    so the handler's own ``except Exception`` does not swallow it."""

    def __init__(self, wait: dict[str, Any]) -> None:
        super().__init__(wait)
        self.wait = wait


class Diverged(BaseException):
    """A re-run asked for another step than the one recorded: the task fails at once
    (``nondeterministic``), whatever the handler catches."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def diverged_body(e: Diverged) -> dict[str, Any]:
    """The failed result of a run that diverged from its record."""
    return {"status": "error", "error": {"type": "NonDeterministic",
                                         "code": Code.NONDETERMINISTIC,
                                         "message": e.message}}


class Link(Protocol):
    """What the steps need of their forager (or of a test's recorder)."""

    def send_message(self, msg: p.Message) -> None: ...

    @property
    def features(self) -> frozenset[str]: ...


def _plain(value: Any) -> tuple[Any, int]:
    """``value`` as the journal will give it back (a tuple becomes a list, a Blob its
    bytes), and its size; raises TypeError/ValueError if msgpack cannot carry it."""
    packed = msgpack.packb(value, default=blob_bytes)
    return msgpack.unpackb(packed, raw=False, strict_map_key=False), len(packed)


def blob_bytes(value: Any) -> Any:
    data = getattr(value, "data", None)
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"a {type(value).__name__} cannot be recorded")


def error_record(e: BaseException) -> dict[str, Any]:
    """What a step's exception leaves in its record: type, message, traceback."""
    err: dict[str, Any] = error_body(e)["error"]
    err.pop("retry", None)
    if isinstance(e, MeshantError) and e.code != Code.ERROR:
        err["code"] = e.code  # (raised again as its class: QueueFull, Timeout...)
    if e.args and all(isinstance(a, str | int | float | bool) for a in e.args):
        err["args"] = list(e.args)  # (a built-in raised again as it was: KeyError('k'))
    return err


def raise_recorded(err: dict[str, Any]) -> None:
    """Raise again the exception a step's record holds: a built-in type as itself (a
    ``except ValueError`` in the handler works on the replay as on the first run), a
    meshant error as its class, any other as :class:`~meshant.errors.StepFailed`."""
    name, message = str(err.get("type", "")), str(err.get("message", ""))
    if "code" in err and err.get("code") != Code.HANDLER_ERROR:
        raise from_error_body(err)
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        args = err.get("args")
        try:
            e = cls(*args) if isinstance(args, list) else cls(message)
        except Exception:  # (a built-in that takes other arguments)
            e = None
        if e is not None:
            raise e
    raise StepFailed(message, remote_type=name, traceback=err.get("traceback"))


class Steps:
    """One run's durable steps (on its handler's thread or loop)."""

    __slots__ = ("_link", "bytes", "ref", "replay", "retry_on", "task_id", "wall", "watch")

    def __init__(self, link: Link, ref: str, task_id: str,
                 recorded: list[dict[str, Any]] | None,
                 wall: Callable[[], float] = time.time) -> None:
        """``wall``: the wall clock a sleep's end is reckoned on (the simulator's own)."""
        self._link = link
        self.wall = wall
        self.ref = ref
        self.task_id = task_id
        self.replay = Replay(list(recorded or ()))
        # Told of each step as the run reaches it (``meshant replay``): its position,
        # kind, name, occurrence and what the record holds there (None: nothing).
        self.watch: Callable[[int, str, str, int, dict[str, Any] | Divergence | None],
                             None] | None = None
        # Exceptions the handler's retry_on names: a step raising one is not recorded
        # (the retry runs it again, as Temporal retries an activity).
        self.retry_on: tuple[type[BaseException], ...] = ()
        self.bytes = 0  # of the records this run made

    @property
    def durable(self) -> bool:
        """Whether the queen keeps records (it negotiated ``steps``): without, steps run
        every time, as plain calls."""
        return "steps" in self._link.features

    def next(self, kind: str, name: str) -> tuple[int, int, dict[str, Any] | None]:
        if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
            raise ConfigError(f"a step's name is a string of 1-{NAME_MAX} characters, not "
                              f"{name!r}")
        pos, occ, rec = self.replay.next(kind, name)
        if self.watch is not None:
            self.watch(pos, kind, name, occ, rec)
        if isinstance(rec, Divergence):
            raise Diverged(rec.message())
        return pos, occ, rec

    def record(self, pos: int, kind: str, name: str, occ: int, **fields: Any) -> Any:
        """Send the record of the step at ``pos``; returns its value as a replay will
        give it back. A value the journal cannot carry fails the step (TooLarge, or
        ConfigError for a type msgpack cannot encode)."""
        rec: dict[str, Any] = {"position": pos, "kind": kind, "name": name,
                               "occurrence": occ, **fields}
        try:
            plain, size = _plain(rec)
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"step {name!r} returned a value the journal cannot record "
                              f"({e}): return JSON-like data (dict, list, str, number, "
                              "bytes)") from None
        if pos >= STEPS_MAX or self.bytes + size > STEPS_BYTES:
            raise TooLarge(f"task {self.task_id} records at most {STEPS_MAX:,} steps and "
                           f"{STEPS_BYTES:,} bytes of them: a loop of steps this long "
                           "belongs in sub-tasks (ctx.call) or a fresh task",
                           code=Code.TOO_LARGE)
        if size > INLINE_BYTES:
            raise TooLarge(f"step {name!r}'s record is {size:,} bytes, over {INLINE_BYTES:,}: "
                           "keep large values out of step results (colony memory, a blob "
                           "store) and return a reference", code=Code.TOO_LARGE)
        if self.durable:
            self._link.send_message(p.Message("task.step", rec, ref=self.ref, to="queen"))
        self.bytes += size
        self.replay.recorded(plain)
        return p.unwrap_blob(plain.get("value"))

    # -- the steps ----------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        pos, occ, rec = self.next("step", name)
        if rec is not None:
            return replayed(rec)
        try:
            value = fn(*args, **kwargs)
        except Exception as e:
            self._failed(pos, name, occ, e)
            raise
        return self.record(pos, "step", name, occ, value=value)

    def _failed(self, pos: int, name: str, occ: int, e: Exception) -> None:
        if self.retry_on and isinstance(e, self.retry_on):
            return  # (not recorded: the retry runs the step again)
        self.record(pos, "step", name, occ, error=error_record(e))

    async def step_async(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
        pos, occ, rec = self.next("step", name)
        if rec is not None:
            return replayed(rec)
        try:
            value = fn(*args, **kwargs)
            if isinstance(value, Awaitable):
                value = await value
        except Exception as e:
            self._failed(pos, name, occ, e)
            raise
        return self.record(pos, "step", name, occ, value=value)

    def sleep(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                0 <= seconds < 10 * 365 * 86400):
            raise ConfigError(f"ctx.sleep takes seconds >= 0, not {seconds!r}")
        pos, occ, rec = self.next("sleep", "sleep")
        if rec is not None:
            # Slept: the queen runs the task again once the sleep is over on its clock
            # (the record's end; a run that comes back early is put to sleep again by
            # the queen, not here, where the clock may be another machine's).
            return
        until = self.wall() + seconds
        self.record(pos, "sleep", "sleep", occ, seconds=float(seconds))
        if not self.durable:
            time.sleep(seconds)
            return
        raise Suspend({"until": until, "position": pos})

    def ask(self, prompt: Any, data: Any) -> Any:
        """A durable question: the run ends, the queen keeps the question and wakes the
        task with its answer recorded as this step."""
        pos, occ, rec = self.next("ask", "ask")
        if rec is not None:
            if "error" in rec:
                raise_recorded(rec["error"])
            return p.unwrap_blob(rec.get("value"))
        # The question goes with the suspension itself (one message: the queen that takes
        # the one has the other).
        wait: dict[str, Any] = {"request": f"{self.task_id}.s{pos}", "position": pos,
                                "name": "ask", "occurrence": occ, "prompt": p.wrap_blob(prompt)}
        if data is not None:
            wait["data"] = p.wrap_blob(data)
        raise Suspend(wait)

    def call(self, capability: Any, payload: Any, options: dict[str, Any],
             caller: Callable[[str, str, dict[str, Any]], Future[dict[str, Any]]]
             ) -> tuple[int, int, str, Any, Future[dict[str, Any]] | None]:
        """Start (or find again) the sub-task at the next position: (position,
        occurrence, capability name, the recorded outcome or None, the future of the
        queen's answer, ``task.called``, when it was not recorded)."""
        name = getattr(capability, "name", capability)
        if not isinstance(name, str):
            raise ConfigError(f"ctx.call takes a capability's name or a Capability, not "
                              f"{capability!r}")
        pos, occ, rec = self.next("call", name)
        if rec is not None:
            return pos, occ, name, rec, None
        if not self.durable:
            raise ConfigError("ctx.call needs a queen with durable steps (meshant 0.9+): "
                              "this queen did not negotiate 'steps'")
        body = {"position": pos, "capability": name, "payload": p.wrap_blob(payload),
                "options": {k: v for k, v in options.items() if v is not None},
                "task": child_id(self.task_id, pos)}
        return pos, occ, name, None, caller(self.ref, child_id(self.task_id, pos), body)

    def answered(self, pos: int, occ: int, name: str, child: str,
                 reply: dict[str, Any]) -> Any:
        """The queen's ``task.called`` for the call at ``pos``: the child's outcome
        (recorded) if it ended; while it runs, the run suspends on it (its slot freed:
        the queen runs the task again once the child ended)."""
        final = reply.get("final")
        if not isinstance(final, dict):
            raise Suspend({"child": child, "position": pos})
        return self.called(pos, occ, name, child, final)

    def called(self, pos: int, occ: int, name: str, child: str,
               final: dict[str, Any]) -> Any:
        """A sub-task ended with ``final`` (a result body): recorded, then its value
        returned or its error raised."""
        state = final.get("state")
        if state == "completed" or (state is None and final.get("status") == "ok"):
            result = p.unwrap_blob(final.get("result"))
            self.record(pos, "call", name, occ, child=child, value=result)
            return result
        err = final.get("error") or {"code": Code.CANCELLED, "message":
                                     f"sub-task {child} was cancelled"}
        if state == "cancelled" or final.get("status") == "cancelled":
            err = {"code": Code.CANCELLED, "message": f"sub-task {child} was cancelled"}
        self.record(pos, "call", name, occ, child=child, error=dict(err))
        raise from_error_body(err)


def replayed(rec: dict[str, Any]) -> Any:
    """A recorded step's outcome: its value, or its exception raised again (a sub-task's
    failure as ``client.run`` raises it, on every run alike)."""
    if "error" in rec:
        if rec.get("kind") == "call":
            raise from_error_body(rec["error"])
        raise_recorded(rec["error"])
    return p.unwrap_blob(rec.get("value"))


__all__ = ["Diverged", "Link", "Steps", "Suspend", "diverged_body",
           "error_record", "raise_recorded", "replayed"]
