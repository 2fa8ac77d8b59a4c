"""The meshant wire protocol, sans-IO: message model, kind table, codecs, negotiation."""

from meshant.protocol import binary, legacy
from meshant.protocol.codec import BINARY, JSON, decode_any, encode_for
from meshant.protocol.codes import Code
from meshant.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from meshant.protocol.kinds import (
    BY_CODE,
    BY_NAME,
    KINDS,
    NOTE_MAX,
    Kind,
    kind_by_name,
    validate_body,
)
from meshant.protocol.message import (
    BLOB_MIN,
    Blob,
    IdMaker,
    Message,
    inline_blobs,
    new_id,
    unwrap_blob,
    wrap_blob,
)
from meshant.protocol.negotiation import QueenTerms, Refusal, Welcome, negotiate, valid_name

__all__ = [
    "BINARY",
    "BLOB_MIN",
    "BY_CODE",
    "BY_NAME",
    "JSON",
    "KINDS",
    "NOTE_MAX",
    "Blob",
    "Code",
    "IdMaker",
    "Kind",
    "LocalProtocolError",
    "Message",
    "ProtocolError",
    "QueenTerms",
    "Refusal",
    "RemoteProtocolError",
    "Welcome",
    "binary",
    "decode_any",
    "encode_for",
    "inline_blobs",
    "kind_by_name",
    "legacy",
    "negotiate",
    "new_id",
    "unwrap_blob",
    "valid_name",
    "validate_body",
    "wrap_blob",
]
