"""Malformed messages, each wrong in exactly one way, and the error code the spec (§9)
gives each. They are the error vectors (``tests/vectors/errors.json`` is generated from
this list) and what the kit sends a queen or a forager under test."""

from __future__ import annotations

from meshant.protocol import binary

ENV = b"\x82\xa2id\xa1x\xa4from\xa1y"  # {"id": "x", "from": "y"}
RESULT, REJECT, BATCH, NOTE = 15, 14, 20, 42


def f0(code: int, env: bytes = ENV, body: bytes = b"\x80", flags: int = 0, nblobs: int = 0,
       env_len: int | None = None) -> bytes:
    """Frame 0 built by hand, so a message can be wrong in exactly one way."""
    n = len(env) if env_len is None else env_len
    return binary.header(code, flags, nblobs, n) + env + body


# (description, frames, code). Appended to, never reordered: the vectors keep their order.
DECODE_CASES: list[tuple[str, list[bytes], str]] = [
    ("wrong magic", [b"XX" + f0(RESULT)[2:]], "bad-magic"),
    ("truncated header", [b"MA\x02"], "truncated"),
    ("no frames at all", [], "truncated"),
    ("unknown version", [f0(RESULT)[:2] + b"\x09" + f0(RESULT)[3:]], "bad-version"),
    ("unknown kind code", [f0(250)], "unknown-kind"),
    ("envelope length past the end", [f0(RESULT, env_len=200)], "truncated"),
    ("no body after the envelope", [f0(RESULT, body=b"")], "truncated"),
    ("invalid msgpack envelope", [f0(RESULT, env=b"\xc1")], "bad-msgpack"),
    ("invalid msgpack body", [f0(RESULT, body=b"\xc1")], "bad-msgpack"),
    ("trailing bytes after the body", [f0(RESULT, body=b"\x80\x80")], "bad-msgpack"),
    ("envelope not a map", [f0(RESULT, env=b"\x93\x01\x02\x03")], "bad-type"),
    ("id of the wrong type", [f0(RESULT, env=b"\x82\xa2id\x05\xa4from\xa1y")], "bad-type"),
    ("body not a map", [f0(RESULT, body=b"\x93\x01\x02\x03")], "bad-type"),
    ("reject without reason", [f0(REJECT)], "missing-field"),
    ("blob announced but missing", [f0(RESULT, flags=1, nblobs=1)], "truncated"),
    ("more frames than announced", [f0(RESULT), b"stray"], "too-many-frames"),
    ("body references a missing blob",
     [f0(RESULT, body=b"\x81\xa6result\xd4\x01\x05", flags=1, nblobs=1), b"raw"], "bad-blob"),
    ("note longer than 80 characters",
     [f0(NOTE, body=b"\x81\xa4text\xd9\x51" + b"a" * 81)], "bad-value"),
    # Added with the spec's strictness fixes (its "Changes" section).
    ("code 21 is task.assigns, not unassigned: its body needs 'assigns'",
     [f0(21, flags=2)], "missing-field"),
    ("BATCH flag on a task.result", [f0(RESULT, flags=2)], "bad-flags"),
    ("task.batch without the BATCH flag", [f0(BATCH, body=b"\x81\xa7results\x90")],
     "bad-flags"),
    ("BLOBS flag with no blobs", [f0(RESULT, flags=1)], "bad-flags"),
    ("a blob frame without the BLOBS flag",
     [f0(RESULT, body=b"\x81\xa6result\xd4\x01\x00", nblobs=1), b"raw"], "bad-flags"),
    ("a blob reference of two bytes",
     [f0(RESULT, body=b"\x81\xa6result\xd5\x01\x00\x00", flags=1, nblobs=1), b"raw"],
     "bad-blob"),
    ("a blob reference in a message without blobs",
     [f0(RESULT, body=b"\x81\xa6result\xd4\x01\x00")], "bad-blob"),
    ("a msgpack extension type other than 1", [f0(RESULT, body=b"\x81\xa6result\xd4\x05\x00")],
     "bad-msgpack"),
    ("a field of the wrong type (reason an int)", [f0(REJECT, body=b"\x81\xa6reason\x05")],
     "bad-type"),
    ("a boolean is not an integer (hb slots true)", [f0(30, body=b"\x81\xa5slots\xc3")],
     "bad-type"),
    ("order: the kind is checked before the flags", [f0(250, flags=2)], "unknown-kind"),
    ("order: the flags are checked before the envelope", [f0(RESULT, env=b"\xc1", flags=2)],
     "bad-flags"),
    ("order: the envelope is checked before the body",
     [f0(RESULT, env=b"\x93\x01\x02\x03", body=b"\xc1")], "bad-type"),
    ("order: the body's msgpack before its fields", [f0(REJECT, body=b"\xc1")], "bad-msgpack"),
    ("task.ask without a request id", [f0(60)], "missing-field"),
    ("task.update with a body that is not a map",
     [f0(65, body=b"\x84\xa4task\xa1t\xa3seq\x01\xa4kind\xa1k\xa4body\x01")], "bad-type"),
]

# IACP 1.1 JSON frames (§8), each wrong in one way.
JSON_CASES: list[tuple[str, bytes, str]] = [
    ("JSON that does not parse", b'{"v":"1.1",', "bad-json"),
    ("a JSON envelope of version 3", b'{"v":"3.0","id":"x","from":"f","kind":"hb"}',
     "bad-version"),
    ("a JSON kind that does not exist", b'{"v":"1.1","id":"x","from":"f","kind":"nope"}',
     "unknown-kind"),
    ("a JSON envelope without id", b'{"v":"1.1","from":"f","kind":"hb"}', "missing-field"),
]
