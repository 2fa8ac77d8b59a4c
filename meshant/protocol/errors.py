"""The one exception the protocol layer raises, and its stable codes (members of
:class:`meshant.protocol.codes.Code`, re-exported here under their old names)."""

from __future__ import annotations

from meshant.errors import BadInput
from meshant.protocol.codes import Code

# Stable machine-readable codes. Peers match on these strings, so they never change meaning.
BAD_MAGIC = Code.BAD_MAGIC
TRUNCATED = Code.TRUNCATED
BAD_VERSION = Code.BAD_VERSION
UNKNOWN_KIND = Code.UNKNOWN_KIND
BAD_MSGPACK = Code.BAD_MSGPACK
BAD_JSON = Code.BAD_JSON
BAD_TYPE = Code.BAD_TYPE
MISSING_FIELD = Code.MISSING_FIELD
TOO_LARGE = Code.TOO_LARGE
TOO_MANY_FRAMES = Code.TOO_MANY_FRAMES
BAD_BLOB = Code.BAD_BLOB
BAD_FLAGS = Code.BAD_FLAGS
BAD_VALUE = Code.BAD_VALUE

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
        BAD_FLAGS,
        BAD_VALUE,
    }
)


class ProtocolError(BadInput):
    """Raised for anything malformed on the wire: fix the input. (A ``BadInput``.)

    ``code`` is one of the stable strings in this module; ``message`` is a sentence for people.
    Decoders raise nothing else, whatever bytes they are given.
    """

    code = Code.ERROR

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.args = (f"{code}: {message}",)  # str() and repr() show "code: message"


class LocalProtocolError(ProtocolError):
    """What this side would send is not a valid message (too large, not encodable)."""


class RemoteProtocolError(ProtocolError):
    """What the other side sent is not a valid message (the decoders raise this)."""
