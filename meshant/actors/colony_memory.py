"""The agent-side face of colony memory: ``peer.memory.get/set/delete`` and change callbacks.

Reads are local (the replica), writes go through the queen, which orders them and
publishes them to every agent. ``set`` and ``delete`` return once the change is applied
here too, so an agent reads its own writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from meshant import protocol as p
from meshant.core.memory.model import RESYNC, MemoryError_, MemoryReplica, check_key
from meshant.errors import BadInput, MeshantError, Timeout, from_error_body
from meshant.protocol.codes import Code
from meshant.protocol.topics import MEM_TOPIC

log = logging.getLogger("meshant.memory")

ChangeCallback = Callable[[str, Any, bool], Any]
FIRST_READ_WAIT = 5.0


class Link(Protocol):
    """What the memory needs of its peer (:class:`meshant.actors._peer.Peer`)."""

    @property
    def connected(self) -> bool: ...

    @property
    def pump(self) -> Callable[[Callable[[], bool], float | None], None] | None:
        """A direct client's: drives the socket in the caller's thread (else None)."""

    def in_io_thread(self) -> bool: ...

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...

    def send_message(self, msg: p.Message) -> None: ...

    def listen(self, topic: bytes) -> None: ...


class Memory:
    """A consistent key-value map shared by the whole colony."""

    def __init__(self, peer: Link) -> None:
        self._peer = peer
        self._replica = MemoryReplica()
        self._cond = threading.Condition()
        self._callbacks: list[ChangeCallback] = []
        self._acks: dict[str, Future[int]] = {}
        self._enabled = False

    # -- public ---------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` as this agent last heard it."""
        self._ensure()
        with self._cond:
            return self._replica.items.get(key, default)

    def items(self) -> dict[str, Any]:
        """A copy of the whole map."""
        self._ensure()
        with self._cond:
            return dict(self._replica.items)

    def _ensure(self) -> None:
        # The first read waits (briefly) for the snapshot, so it does not see an empty map.
        if not self._enabled:
            self._enable()
            if self._peer.connected and not self._peer.in_io_thread():
                try:
                    self._wait(lambda: self._replica.synced, FIRST_READ_WAIT, "a snapshot")
                except MeshantError:
                    log.warning("no memory snapshot within %g s; reading what is here",
                                FIRST_READ_WAIT)

    def __contains__(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def set(self, key: str, value: Any, *, ttl: float | None = None,
            timeout: float = 10.0) -> int:
        """Set ``key`` (optionally expiring after ``ttl`` seconds); returns its sequence."""
        check_key_or_raise(key)
        body: dict[str, Any] = {"op": "set", "key": key, "value": value}
        if ttl is not None:
            body["ttl"] = ttl
        return self._write(body, timeout)

    def delete(self, key: str, *, timeout: float = 10.0) -> int:
        """Delete ``key`` (no error if it is absent)."""
        check_key_or_raise(key)
        return self._write({"op": "delete", "key": key}, timeout)

    def on_change(self, fn: ChangeCallback) -> ChangeCallback:
        """Decorator: ``fn(key, value, deleted)`` after each change (in the I/O thread)."""
        self._callbacks.append(fn)
        self._enable()
        return fn

    def wait_synced(self, timeout: float = 10.0) -> None:
        """Block until this agent holds a snapshot of the map."""
        self._enable()
        self._wait(lambda: self._replica.synced, timeout, "a memory snapshot")

    @property
    def seq(self) -> int:
        """The sequence number of the last update applied here."""
        self._ensure()
        return self._replica.seq

    @property
    def resyncs(self) -> int:
        """How many times a gap made this agent fetch a fresh snapshot."""
        return self._replica.resyncs

    # -- plumbing -------------------------------------------------------------------------

    def _enable(self) -> None:
        if not self._enabled:
            self._enabled = True
            self._peer.call_soon(self._start)

    def _start(self) -> None:
        self._peer.listen(MEM_TOPIC)
        if self._peer.connected:
            self._request_snapshot()

    def _request_snapshot(self) -> None:
        self._peer.send_message(p.Message("mem.sync", {"op": "snapshot"}, to="queen"))

    def _write(self, body: dict[str, Any], timeout: float) -> int:
        if self._peer.in_io_thread() and self._peer.pump is None:
            raise RuntimeError("memory writes wait for the queen, so they cannot run in the "
                               "I/O thread (an inline handler or a callback): use a normal "
                               "handler")
        self._enable()
        msg = p.Message("mem.sync", body, to="queen")
        fut: Future[int] = Future()
        self._acks[msg.id] = fut
        self._peer.send_message(msg)
        try:
            self._wait(fut.done, timeout, "the queen to apply a memory write")
            seq = fut.result(0)
        finally:
            self._acks.pop(msg.id, None)
        self._wait(lambda: self._replica.synced and self._replica.seq >= seq, timeout,
                   "the memory write to come back")
        return seq

    def _wait(self, pred: Callable[[], bool], timeout: float, what: str) -> None:
        pump = self._peer.pump
        try:
            if pump is not None:
                pump(pred, timeout)
                return
            with self._cond:
                if self._cond.wait_for(pred, timeout):
                    return
        except TimeoutError:
            pass
        raise Timeout(f"timed out after {timeout:g} s waiting for {what}", code=Code.TIMEOUT)

    # -- called in the I/O thread ---------------------------------------------------------

    def on_welcome(self, new_epoch: bool) -> None:
        if not self._enabled:
            return
        if new_epoch:
            with self._cond:
                self._replica.reset()
        self._request_snapshot()

    def on_update(self, update: dict[str, Any]) -> None:
        with self._cond:
            r = self._replica.apply(update)
            self._cond.notify_all()
        if r == RESYNC:
            self._request_snapshot()
        else:
            self._fire(r)  # type: ignore[arg-type]

    def on_queen_seq(self, seq: int) -> None:
        if not self._enabled:
            return
        with self._cond:
            behind = self._replica.behind(seq)
        if behind:
            self._request_snapshot()

    def on_reply(self, msg: p.Message) -> bool:
        """A mem.sync answer over the DEALER: a snapshot or a write's acknowledgement."""
        b = msg.b
        if b.get("op") == "snap":
            with self._cond:
                r = self._replica.load(b)
                self._cond.notify_all()
            if r == RESYNC:
                self._request_snapshot()
            else:
                self._fire(r)  # type: ignore[arg-type]
            return True
        fut = self._acks.get(msg.ref or "")
        if fut is not None and not fut.done():
            fut.set_result(int(b.get("seq", 0)))
            with self._cond:
                self._cond.notify_all()
            return True
        return False

    def on_error(self, msg: p.Message) -> bool:
        fut = self._acks.get(msg.ref or "")
        if fut is None:
            return False
        if not fut.done():
            fut.set_exception(from_error_body(msg.b))
            with self._cond:
                self._cond.notify_all()
        return True

    def _fire(self, changes: list[tuple[str, Any, bool]]) -> None:
        for key, value, deleted in changes:
            for fn in self._callbacks:
                try:
                    fn(key, value, deleted)
                except Exception:
                    log.exception("memory change callback failed")


def check_key_or_raise(key: object) -> None:
    try:
        check_key(key)
    except MemoryError_ as e:
        raise BadInput(e.message, code=e.code) from None


_MISSING = object()
