"""The IACP 1.1 JSON codec: one frame holding one JSON envelope (a trailing newline allowed)."""

from __future__ import annotations

import json
from typing import Any

from meshant.protocol.binary import from_envelope
from meshant.protocol.errors import (
    BAD_JSON,
    BAD_TYPE,
    BAD_VERSION,
    MISSING_FIELD,
    TOO_LARGE,
    LocalProtocolError,
    RemoteProtocolError,
)
from meshant.protocol.kinds import kind_by_name, validate_body
from meshant.protocol.message import Blob, Message

LEGACY_VERSION = "1.1"
DEFAULT_MAX_JSON = 1024 * 1024
# Deeply nested JSON is the classic way to blow a recursive parser's stack.
MAX_DEPTH = 64

_decoder = json.JSONDecoder()
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def is_legacy(frames: list[Any]) -> bool:
    """True when a message is a single frame that starts with ``{``."""
    if len(frames) != 1:
        return False
    f = frames[0]
    return len(f) > 0 and bytes(memoryview(f)[:1]) == b"{"


def _depth_ok(data: bytes) -> bool:
    depth = 0
    in_str = False
    esc = False
    for c in data:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x7B, 0x5B):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif c in (0x7D, 0x5D):
            depth -= 1
    return True


def decode(frame: Any, *, max_size: int = DEFAULT_MAX_JSON, validate: bool = True) -> Message:
    """Decode one IACP 1.1 JSON frame. Raises ProtocolError and nothing else."""
    data = bytes(frame)
    if len(data) > max_size:
        raise RemoteProtocolError(TOO_LARGE, f"JSON message exceeds {max_size} bytes")
    if not _depth_ok(data):
        raise RemoteProtocolError(BAD_JSON, f"JSON nests deeper than {MAX_DEPTH} levels")
    try:
        text = data.decode("utf-8")
        obj = json.loads(text.rstrip("\r\n") if text.endswith("\n") else text)
    except (ValueError, RecursionError) as e:
        # ValueError covers bad UTF-8, bad JSON and integers too long to convert.
        raise RemoteProtocolError(BAD_JSON, f"not a valid IACP 1.1 JSON envelope ({e})") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(BAD_JSON, "an IACP 1.1 envelope must be a JSON object")
    v = obj.get("v")
    if not isinstance(v, str):
        raise RemoteProtocolError(MISSING_FIELD, "IACP 1.1 envelope needs a string 'v'")
    if not v.startswith("1."):
        raise RemoteProtocolError(BAD_VERSION, f"JSON envelopes speak IACP 1.x, not {v!r}")
    kind_name = obj.get("kind")
    if not isinstance(kind_name, str):
        raise RemoteProtocolError(MISSING_FIELD, "IACP 1.1 envelope needs a string 'kind'")
    kind = kind_by_name(kind_name)
    for field in ("id", "from"):
        if field not in obj:
            raise RemoteProtocolError(MISSING_FIELD, f"IACP 1.1 envelope needs {field!r}")
    body = obj.get("body")
    if "body" in obj and not isinstance(body, dict):
        raise RemoteProtocolError(BAD_TYPE, f"{kind_name} body must be an object")
    ts = obj.get("ts", 0)
    if isinstance(ts, float) and ts != ts:  # NaN: json accepts it, nothing can use it
        raise RemoteProtocolError(BAD_TYPE, "envelope field 'ts' must be a number")
    msg = from_envelope(obj, kind_name, body, v)
    if validate:
        validate_body(kind, body)
    return msg


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Blob):
        return bytes(obj).decode("latin-1")
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj).decode("latin-1")
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def encode(msg: Message) -> bytes:
    """Encode as one IACP 1.1 JSON line, fields in the spec's order."""
    kind_by_name(msg.kind)
    obj: dict[str, Any] = {"v": msg.v if msg.v.startswith("1.") else LEGACY_VERSION,
                           "id": msg.id, "from": msg.frm, "to": msg.to, "kind": msg.kind}
    if msg.ref is not None:
        obj["ref"] = msg.ref
    obj["ts"] = msg.ts
    if msg.body is not None:
        obj["body"] = msg.body
    if msg.extra:
        for k, v in msg.extra.items():
            obj.setdefault(k, v)
    try:
        return _dumps(obj).encode("utf-8") if not _needs_default(msg.body) else json.dumps(
            obj, separators=(",", ":"), ensure_ascii=False, default=_jsonable).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise LocalProtocolError(BAD_TYPE, f"cannot encode {msg.kind} as JSON: {e}") from None


def _needs_default(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    return any(isinstance(v, Blob | bytes | bytearray | memoryview) for v in body.values())
