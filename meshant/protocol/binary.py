"""The IACP/2 binary codec: Message ⇄ list of ZeroMQ frames.

Frame 0 holds an 8-byte header, the msgpack envelope and the msgpack body, back to back;
then comes one raw frame per blob referenced from the body. The header carries the
envelope's length, so each section decodes on its own and a router can dispatch on the
kind code at byte 3 without unpacking anything. See docs/protocol.md.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import msgpack

from meshant.protocol.errors import (
    BAD_BLOB,
    BAD_FLAGS,
    BAD_MAGIC,
    BAD_MSGPACK,
    BAD_TYPE,
    BAD_VERSION,
    TOO_LARGE,
    TOO_MANY_FRAMES,
    TRUNCATED,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from meshant.protocol.kinds import BY_CODE, BY_NAME, kind_by_code, kind_by_name, validate_body
from meshant.protocol.message import Blob, Message

MAGIC = b"MA"
VERSION = 2
SUPPORTED_VERSIONS = (2,)
HEADER = struct.Struct("!2sBBBBH")  # magic, version, kind code, flags, blob count, env length
HEADER_SIZE = HEADER.size  # 8
MAX_ENVELOPE = 0xFFFF

FLAG_BLOBS = 0x01
FLAG_BATCH = 0x02

BLOB_EXT = 1
MAX_BLOBS = 255
DEFAULT_MAX_FRAME = 64 * 1024 * 1024

_ENV_KEYS = frozenset({"id", "from", "to", "ts", "ref"})
# The kinds whose body is a batch: the BATCH flag is set on exactly these (spec §2.1).
BATCH_CODES = frozenset({BY_NAME["task.batch"].code, BY_NAME["task.assigns"].code})
_IDX = struct.Struct("!B")
_packb = msgpack.packb
_unpackb = msgpack.unpackb
_pack_header = HEADER.pack
_unpack_header = HEADER.unpack_from
_NOT_EXTRA = frozenset({"v", "kind", "body"})
# One reusable packer per thread: cheaper than msgpack.packb's packer per call.
_local = threading.local()


def header(code: int, flags: int = 0, nblobs: int = 0, env_len: int = 0) -> bytes:
    """The 8-byte header for a kind code."""
    return _pack_header(MAGIC, VERSION, code, flags, nblobs, env_len)


def parse_header(frame: Any) -> tuple[int, int, int, int, int]:
    """Return ``(version, kind_code, flags, nblobs, env_len)`` from the start of frame 0.

    A router can dispatch on this alone, without unpacking the envelope or the body.
    """
    if len(frame) < HEADER_SIZE:
        raise RemoteProtocolError(
            TRUNCATED, f"frame 0 must start with a {HEADER_SIZE}-byte header, "
                f"got {len(frame)} bytes")
    magic, version, code, flags, nblobs, env_len = _unpack_header(frame)
    if magic != MAGIC:
        raise RemoteProtocolError(
            BAD_MAGIC, f"frame does not start with the IACP/2 magic {MAGIC!r}")
    if version not in SUPPORTED_VERSIONS:
        raise RemoteProtocolError(BAD_VERSION, f"unsupported wire version {version}")
    return version, code, flags, nblobs, env_len


def encode(msg: Message) -> list[Any]:
    """Encode a message as frames: [header + envelope + body, *blobs]."""
    kind = BY_NAME.get(msg.kind)
    if kind is None:
        kind = kind_by_name(msg.kind)  # raises the protocol error
    code = kind.code
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
    flags = FLAG_BATCH if code in BATCH_CODES else 0
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(autoreset=False)
    packer.reset()
    try:
        packer.pack(env)
        n = len(packer.getbuffer())
        if n > MAX_ENVELOPE:
            raise LocalProtocolError(TOO_LARGE, f"the envelope is {n} bytes, over {MAX_ENVELOPE}")
        try:
            packer.pack(msg.body)
        except TypeError:
            # Blobs (or something unencodable): the slow path finds out which.
            blobs: list[Any] = []
            body_b = _packb(msg.body, default=_blob_collector(blobs))
            data = _packb(env) + body_b  # a failed pack empties the packer: redo the env
            if blobs:
                return [_pack_header(MAGIC, VERSION, code, flags | FLAG_BLOBS, len(blobs), n)
                        + data, *blobs]
            return [_pack_header(MAGIC, VERSION, code, flags, 0, n) + data]
    except ProtocolError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise LocalProtocolError(BAD_TYPE, f"cannot encode {msg.kind} message: {e}") from None
    return [_pack_header(MAGIC, VERSION, code, flags, 0, n) + packer.bytes()]


def _blob_collector(blobs: list[Any]) -> Any:
    def default(obj: Any) -> Any:
        if isinstance(obj, Blob):
            if len(blobs) >= MAX_BLOBS:
                raise LocalProtocolError(TOO_MANY_FRAMES, f"at most {MAX_BLOBS} blobs per message")
            blobs.append(obj.data)
            return msgpack.ExtType(BLOB_EXT, _IDX.pack(len(blobs) - 1))
        raise TypeError(f"cannot encode {type(obj).__name__}")
    return default


def decode(
    frames: Sequence[Any],
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    validate: bool = True,
) -> Message:
    """Decode IACP/2 frames into a Message. Raises ProtocolError and nothing else."""
    n = len(frames)
    if n < 1:
        raise RemoteProtocolError(TRUNCATED, "an IACP/2 message has at least one frame")
    f0 = frames[0]
    size = len(f0)
    if size < HEADER_SIZE:
        parse_header(f0)  # raises the precise error
    magic, version, code, flags, nblobs, env_len = _unpack_header(f0)
    if magic != MAGIC or version not in SUPPORTED_VERSIONS:
        parse_header(f0)
    kind = BY_CODE.get(code)
    if kind is None:
        kind = kind_by_code(code)
    if flags & 3 != (FLAG_BATCH if code in BATCH_CODES else 0) | (FLAG_BLOBS if nblobs else 0):
        # The flags repeat what the kind and the blob count say; a sender that gets them
        # wrong has a bug that would otherwise go unseen until another receiver trusts them.
        raise RemoteProtocolError(BAD_FLAGS, f"flags {flags:#04x} do not match a {kind.name} "
                            f"message with {nblobs} blobs (BATCH is set on task.batch and "
                            "task.assigns only, BLOBS exactly when the blob count is not 0)")
    if n != 1 + nblobs:
        if n > 1 + nblobs:
            raise RemoteProtocolError(
                TOO_MANY_FRAMES, f"header announces {nblobs} blobs, got {n - 1}")
        raise RemoteProtocolError(TRUNCATED, f"header announces {nblobs} blobs, got {n - 1}")
    if size > max_frame or (nblobs and any(len(f) > max_frame for f in frames[1:])):
        big = max(len(f) for f in frames)
        raise RemoteProtocolError(TOO_LARGE, f"a frame of {big:,} bytes exceeds the limit of "
                            f"{max_frame:,} bytes")
    body_at = HEADER_SIZE + env_len
    if body_at >= size:
        raise RemoteProtocolError(
            TRUNCATED, f"header announces a {env_len}-byte envelope and a body, "
                f"but frame 0 has {size - HEADER_SIZE} bytes after the header")
    # bytes slices: msgpack unpacks them faster than memoryview slices, and they are small
    view = f0 if f0.__class__ is bytes else memoryview(f0)
    try:
        env = _unpackb(view[HEADER_SIZE:body_at])
    except Exception as e:
        raise RemoteProtocolError(BAD_MSGPACK, _bad("envelope", e)) from None
    if env.__class__ is not dict:
        raise RemoteProtocolError(BAD_TYPE, "envelope must be a msgpack map")
    if nblobs:
        blobs = frames[1:]

        def ext_hook(ext_code: int, data: bytes) -> Any:
            if ext_code != BLOB_EXT:
                _no_blobs(ext_code, data)
            if len(data) != 1 or data[0] >= nblobs:
                raise RemoteProtocolError(BAD_BLOB, "body references a blob that is not there (a "
                                    "reference is one byte, the index of a blob frame)")
            return Blob(blobs[data[0]])

        try:
            body = _unpackb(view[body_at:], ext_hook=ext_hook)
        except ProtocolError:
            raise
        except Exception as e:
            raise RemoteProtocolError(BAD_MSGPACK, _bad("body", e)) from None
    else:
        try:
            body = _unpackb(view[body_at:], ext_hook=_no_blobs)
        except ProtocolError:
            raise
        except Exception as e:
            raise RemoteProtocolError(BAD_MSGPACK, _bad("body", e)) from None
    msg = from_envelope(env, kind.name, body, "2")
    if validate and (kind.fields or body is not None):
        validate_body(kind, body)
    return msg


def _no_blobs(ext_code: int, data: bytes) -> Any:
    if ext_code == BLOB_EXT:
        raise RemoteProtocolError(BAD_BLOB, "body references a blob, but the message has none")
    raise RemoteProtocolError(
        BAD_MSGPACK, f"msgpack extension type {ext_code} is not used by IACP/2")


def peek_id(frames: Sequence[Any]) -> str | None:
    """The message id, if the header and envelope can be read: lets an error about an
    otherwise unreadable message (say, one too large) name the message it answers."""
    try:
        f0 = frames[0]
        if len(f0) < HEADER_SIZE or bytes(f0[:2]) != MAGIC:
            return None
        env_len = HEADER.unpack_from(f0)[5]
        env = _unpackb(bytes(f0[HEADER_SIZE:HEADER_SIZE + env_len]))
        mid = env.get("id") if isinstance(env, dict) else None
        return mid if isinstance(mid, str) and 0 < len(mid) <= 200 else None
    except Exception:
        return None


def _bad(what: str, e: Exception) -> str:
    return f"{what} is not valid msgpack ({type(e).__name__}: {e})"


_STRS = (str,)
_NUMS = (int, float)


def from_envelope(env: dict[str, Any], kind: str, body: Any, v: str) -> Message:
    """Build a Message from a decoded envelope map, checking every field's type."""
    mid = env.get("id")
    frm = env.get("from")
    to = env.get("to", "")
    ts = env.get("ts", 0)
    ref = env.get("ref")
    if mid.__class__ is not str or not mid:
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'id' must be a non-empty string")
    if frm.__class__ is not str:
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'from' must be a string")
    if to.__class__ is not str and not (
        to.__class__ is list and all(t.__class__ is str for t in to)
    ):
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'to' must be a name or a list of names")
    if ts.__class__ is not float and ts.__class__ is not int:
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'ts' must be a number")
    if ref is not None and ref.__class__ is not str:
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'ref' must be a string")
    if body is not None and body.__class__ is not dict:
        raise RemoteProtocolError(BAD_TYPE, f"{kind} body must be a map")
    extra = None
    if not env.keys() <= _ENV_KEYS:
        extra = {k: v_ for k, v_ in env.items() if k not in _ENV_KEYS and k not in _NOT_EXTRA}
        extra = extra or None
    return Message._make(kind, body, mid, frm, to, ts, ref, v, extra)


def kind_of(frames: Sequence[Any]) -> str:
    """Dispatch helper: the kind name from the header alone, envelope and body left packed."""
    return kind_by_code(parse_header(frames[0])[1]).name


__all__ = ["BY_CODE", "HEADER_SIZE", "MAGIC", "VERSION", "decode", "encode", "header",
           "kind_of", "parse_header"]
