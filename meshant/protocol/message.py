"""The IACP envelope as a small slotted object, message ids, and raw blobs."""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from meshant.protocol.kinds import kind_by_name, validate_body

# Byte payloads from this size on travel as raw frames; smaller ones are cheaper inline
# as msgpack bin (a copy of a few KB costs less than an extra frame per hop).
BLOB_MIN = 64 * 1024


class Blob:
    """A raw payload that travels as its own ZeroMQ frame, never re-encoded.

    Wraps anything with the buffer protocol (``bytes``, ``memoryview``, a ``zmq.Frame``).
    A body may hold ``Blob`` values anywhere; the binary codec moves their bytes into
    trailing frames and leaves a reference in the body.
    """

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __bytes__(self) -> bytes:
        return bytes(self.data)

    def __len__(self) -> int:
        return memoryview(self.data).nbytes

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Blob):
            return bytes(self) == bytes(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(bytes(self))

    def __repr__(self) -> str:
        return f"Blob({len(self)} bytes)"


def wrap_blob(value: Any) -> Any:
    """A value as sent (a payload or a result): bytes of ``BLOB_MIN`` or more travel as a
    :class:`Blob`, their own raw frame; anything else as it is."""
    return Blob(value) if isinstance(value, bytes | bytearray | memoryview) and (
        len(value) >= BLOB_MIN) else value


def unwrap_blob(value: Any) -> Any:
    """A value as received: a :class:`Blob`'s bytes, anything else as it is."""
    return value.data if isinstance(value, Blob) else value


def inline_blobs(value: Any) -> Any:
    """``value`` with every :class:`Blob` in it turned into ``bytes`` (sent inline as msgpack
    ``bin``), for a peer that did not negotiate ``blobs``. Unchanged (the same object) when
    it holds none, so the common case copies nothing."""
    if isinstance(value, Blob):
        return bytes(value)
    if isinstance(value, dict):
        new = {k: inline_blobs(v) for k, v in value.items()}
        return value if all(new[k] is v for k, v in value.items()) else new
    if isinstance(value, list):
        items = [inline_blobs(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


class IdMaker:
    """Unique message ids without coordination: a random per-process prefix and a counter."""

    __slots__ = ("_next", "prefix")

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix if prefix is not None else secrets.token_hex(6) + "-"
        self._next = itertools.count(1).__next__

    def __call__(self) -> str:
        return f"{self.prefix}{self._next():x}"

    def reset(self, prefix: str) -> None:
        """Start again from 1 under ``prefix`` (the simulator: the same ids in a replay)."""
        self.prefix = prefix
        self._next = itertools.count(1).__next__


new_id = IdMaker()
_new = object.__new__


class Message:
    """One IACP message: ``v id from to kind ts ref body`` plus unknown envelope fields.

    ``frm`` holds the ``from`` field (a Python keyword). ``to`` is a name or a list of
    names. ``extra`` keeps envelope fields this version does not know, so they survive a
    decode/encode round trip.
    """

    __slots__ = ("body", "extra", "frm", "id", "kind", "ref", "to", "ts", "v")

    def __init__(
        self,
        kind: str,
        body: dict[str, Any] | None = None,
        *,
        id: str | None = None,
        frm: str = "",
        to: str | list[str] = "",
        ts: float = 0,
        ref: str | None = None,
        v: str = "2",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.v = v
        self.id = id if id is not None else new_id()
        self.frm = frm
        self.to = to
        self.kind = kind
        self.ts = ts
        self.ref = ref
        self.body = body
        self.extra = extra

    @classmethod
    def _make(cls, kind: str, body: Any, id: str, frm: str, to: Any, ts: float,
              ref: str | None, v: str, extra: dict[str, Any] | None) -> Message:
        """Positional constructor for decoders: no defaults to fill, no id to mint."""
        m = _new(cls)
        m.kind = kind
        m.body = body
        m.id = id
        m.frm = frm
        m.to = to
        m.ts = ts
        m.ref = ref
        m.v = v
        m.extra = extra
        return m

    def validate(self) -> Message:
        """Check the kind is known and the body carries its required fields."""
        validate_body(kind_by_name(self.kind), self.body)
        return self

    @property
    def b(self) -> dict[str, Any]:
        """The body, or an empty map when the message has none."""
        return self.body if self.body is not None else {}

    @property
    def recipients(self) -> list[str]:
        to = self.to
        return list(to) if isinstance(to, list) else [to] if to else []

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Message({self.kind!r}, id={self.id!r}, frm={self.frm!r}, to={self.to!r}, "
                f"ref={self.ref!r}, body={self.body!r})")
