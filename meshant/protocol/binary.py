"""The IACP/2 binary codec: Message ⇄ list of ZeroMQ frames.

Frame 0 is an 8-byte header (see docs/protocol.md), frame 1 the msgpack envelope,
frame 2 the msgpack body, then one raw frame per blob referenced from the body.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from .errors import (
    BAD_BLOB,
    BAD_MAGIC,
    BAD_MSGPACK,
    BAD_TYPE,
    BAD_VERSION,
    TOO_LARGE,
    TOO_MANY_FRAMES,
    TRUNCATED,
    ProtocolError,
)
from .kinds import BY_CODE, BY_NAME, kind_by_code, kind_by_name, validate_body
from .message import Blob, Message

MAGIC = b"MA"
VERSION = 2
SUPPORTED_VERSIONS = (2,)
HEADER = struct.Struct("!2sBBBBH")
HEADER_SIZE = HEADER.size  # 8

FLAG_BLOBS = 0x01
FLAG_BATCH = 0x02

BLOB_EXT = 1
MAX_BLOBS = 255
DEFAULT_MAX_FRAME = 64 * 1024 * 1024

_ENV_KEYS = frozenset({"id", "from", "to", "ts", "ref"})
_BATCH_CODE = BY_NAME["task.batch"].code
_IDX = struct.Struct("!B")
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_header_cache: dict[tuple[int, int, int], bytes] = {}


def header(code: int, flags: int = 0, nblobs: int = 0) -> bytes:
    """The fixed header for a kind code; cached, since there are few distinct ones."""
    key = (code, flags, nblobs)
    h = _header_cache.get(key)
    if h is None:
        h = _header_cache[key] = HEADER.pack(MAGIC, VERSION, code, flags, nblobs, 0)
    return h


def parse_header(frame: bytes) -> tuple[int, int, int, int]:
    """Return ``(version, kind_code, flags, nblobs)``; a router can dispatch on this alone."""
    if len(frame) != HEADER_SIZE:
        raise ProtocolError(TRUNCATED, f"header must be {HEADER_SIZE} bytes, got {len(frame)}")
    magic, version, code, flags, nblobs, _ = HEADER.unpack(frame)
    if magic != MAGIC:
        raise ProtocolError(BAD_MAGIC, f"frame does not start with the IACP/2 magic {MAGIC!r}")
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(BAD_VERSION, f"unsupported wire version {version}")
    return version, code, flags, nblobs


def encode(msg: Message) -> list[Any]:
    """Encode a message as frames: header, envelope, body, blobs."""
    code = kind_by_name(msg.kind).code
    env: dict[str, Any] = {"id": msg.id, "from": msg.frm}
    to = msg.to
    if to or to.__class__ is list:
        env["to"] = to
    if msg.ts:
        env["ts"] = msg.ts
    if msg.ref is not None:
        env["ref"] = msg.ref
    if msg.extra:
        for k, v in msg.extra.items():
            if k not in _ENV_KEYS:
                env[k] = v
    blobs: list[Any] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, Blob):
            if len(blobs) >= MAX_BLOBS:
                raise ProtocolError(TOO_MANY_FRAMES, f"at most {MAX_BLOBS} blobs per message")
            blobs.append(obj.data)
            return msgpack.ExtType(BLOB_EXT, _IDX.pack(len(blobs) - 1))
        raise TypeError(f"cannot encode {type(obj).__name__}")

    try:
        env_b = _packb(env)
        body_b = _packb(msg.body, default=default)
    except ProtocolError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(BAD_TYPE, f"cannot encode {msg.kind} message: {e}") from None
    flags = FLAG_BATCH if code == _BATCH_CODE else 0
    if blobs:
        flags |= FLAG_BLOBS
        return [header(code, flags, len(blobs)), env_b, body_b, *blobs]
    return [header(code, flags), env_b, body_b]


def decode(
    frames: Sequence[Any],
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    validate: bool = True,
) -> Message:
    """Decode IACP/2 frames into a Message. Raises ProtocolError and nothing else."""
    n = len(frames)
    if n < 3:
        raise ProtocolError(TRUNCATED, f"an IACP/2 message has at least 3 frames, got {n}")
    _, code, _flags, nblobs = parse_header(frames[0])
    kind = kind_by_code(code)
    if n != 3 + nblobs:
        if n > 3 + nblobs:
            raise ProtocolError(TOO_MANY_FRAMES, f"header announces {nblobs} blobs, got {n - 3}")
        raise ProtocolError(TRUNCATED, f"header announces {nblobs} blobs, got {n - 3}")
    for f in frames:
        if len(f) > max_frame:
            raise ProtocolError(TOO_LARGE, f"a frame exceeds the limit of {max_frame} bytes")
    try:
        env = _unpackb(frames[1])
    except Exception as e:
        raise ProtocolError(BAD_MSGPACK, _bad("envelope", e)) from None
    if not isinstance(env, dict):
        raise ProtocolError(BAD_TYPE, "envelope must be a msgpack map")
    if nblobs:
        blobs = frames[3:]

        def ext_hook(ext_code: int, data: bytes) -> Any:
            if ext_code != BLOB_EXT or len(data) != 1 or data[0] >= nblobs:
                raise ProtocolError(BAD_BLOB, "body references a blob that is not there")
            return Blob(blobs[data[0]])

        try:
            body = _unpackb(frames[2], ext_hook=ext_hook)
        except ProtocolError:
            raise
        except Exception as e:
            raise ProtocolError(BAD_MSGPACK, _bad("body", e)) from None
    else:
        try:
            body = _unpackb(frames[2])
        except Exception as e:
            raise ProtocolError(BAD_MSGPACK, _bad("body", e)) from None
    msg = from_envelope(env, kind.name, body, "2")
    if validate:
        validate_body(kind, body)
    return msg


def _bad(what: str, e: Exception) -> str:
    return f"{what} is not valid msgpack ({type(e).__name__}: {e})"


def from_envelope(env: dict[str, Any], kind: str, body: Any, v: str) -> Message:
    """Build a Message from a decoded envelope map, checking every field's type."""
    mid = env.get("id")
    frm = env.get("from")
    to = env.get("to", "")
    ts = env.get("ts", 0)
    ref = env.get("ref")
    if not isinstance(mid, str) or not mid:
        raise ProtocolError(BAD_TYPE, "envelope field 'id' must be a non-empty string")
    if not isinstance(frm, str):
        raise ProtocolError(BAD_TYPE, "envelope field 'from' must be a string")
    if not isinstance(to, str) and not (
        isinstance(to, list) and all(isinstance(t, str) for t in to)
    ):
        raise ProtocolError(BAD_TYPE, "envelope field 'to' must be a name or a list of names")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise ProtocolError(BAD_TYPE, "envelope field 'ts' must be a number")
    if ref is not None and not isinstance(ref, str):
        raise ProtocolError(BAD_TYPE, "envelope field 'ref' must be a string")
    if body is not None and not isinstance(body, dict):
        raise ProtocolError(BAD_TYPE, f"{kind} body must be a map")
    extra = None
    if len(env) > 5 or any(k not in _ENV_KEYS for k in env):
        extra = {k: v_ for k, v_ in env.items() if k not in _ENV_KEYS and k not in ("v", "kind",
                                                                                   "body")}
        extra = extra or None
    return Message(kind, body, id=mid, frm=frm, to=to, ts=ts, ref=ref, v=v, extra=extra)


def kind_of(frames: Sequence[Any]) -> str:
    """Dispatch helper: the kind name from the header frame alone, body left packed."""
    return kind_by_code(parse_header(frames[0])[1]).name


__all__ = ["BY_CODE", "HEADER_SIZE", "MAGIC", "VERSION", "decode", "encode", "header",
           "kind_of", "parse_header"]
