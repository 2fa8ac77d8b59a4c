"""The one exception the protocol layer raises, and its stable codes."""

from __future__ import annotations

# Stable machine-readable codes. Peers match on these strings, so they never change meaning.
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
BAD_VALUE = "bad-value"

CODES = frozenset(
    {
        BAD_MAGIC,
        TRUNCATED,
        BAD_VERSION,
        UNKNOWN_KIND,
        BAD_MSGPACK,
        BAD_JSON,
        BAD_TYPE,
        MISSING_FIELD,
        TOO_LARGE,
        TOO_MANY_FRAMES,
        BAD_BLOB,
        BAD_VALUE,
    }
)


class ProtocolError(Exception):
    """Raised for anything malformed on the wire.

    ``code`` is one of the stable strings in this module; ``message`` is a sentence for people.
    Decoders raise nothing else, whatever bytes they are given.
    """

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
