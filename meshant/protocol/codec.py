"""One entry point for whatever a peer sends: IACP/2 frames or an IACP 1.1 JSON frame."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshant.protocol import binary, legacy
from meshant.protocol.errors import TRUNCATED, RemoteProtocolError
from meshant.protocol.message import Message

BINARY = "iacp2"
JSON = "iacp1.1"


def decode_any(
    frames: Sequence[Any], *, max_frame: int = binary.DEFAULT_MAX_FRAME
) -> tuple[Message, str]:
    """Decode a message in either codec; returns the message and which codec it used."""
    if not frames:
        raise RemoteProtocolError(TRUNCATED, "empty message")
    first = frames[0]
    if len(frames) == 1 and len(first) > 0 and first[0:1] == b"{":
        return legacy.decode(first, max_size=max_frame), JSON
    return binary.decode(frames, max_frame=max_frame), BINARY


def encode_for(msg: Message, codec: str) -> list[Any]:
    """Encode for a peer that speaks ``codec``."""
    if codec == JSON:
        return [legacy.encode(msg)]
    return binary.encode(msg)
