"""Regenerate the test vectors. Run only when the wire format changes on purpose:

    python tests/vectors/generate.py

The vectors are the spec's examples in executable form (docs/protocol.md refers to them);
tests check both directions, so code and spec cannot drift apart silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshant.protocol import Blob, Message, binary, legacy

HERE = Path(__file__).parent


def to_json(v: Any) -> Any:
    if isinstance(v, Blob):
        return {"$blob": bytes(v).hex()}
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_json(x) for x in v]
    return v


def message_json(m: Message) -> dict[str, Any]:
    return {"v": m.v, "id": m.id, "from": m.frm, "to": m.to, "kind": m.kind, "ts": m.ts,
            "ref": m.ref, "body": to_json(m.body), "extra": m.extra}


BINARY = [
    ("hello from a forager", Message("hello", {
        "role": "forager", "name": "forager-07", "versions": [2], "codecs": ["msgpack"],
        "features": ["batch", "progress", "blobs"], "slots": 4, "tools": ["crawl", "echo"],
        "labels": {"zone": "eu"}}, id="m-4f91c1", frm="forager-07", to="queen",
        ts=1312284100)),
    ("welcome", Message("welcome", {
        "version": 2, "features": ["batch", "progress"], "hb_interval": 1.0, "hb_misses": 5,
        "assign_timeout": 300.0, "epoch": "3f2a9c01d4e5b6a7", "pub": "tcp://127.0.0.1:5671",
        "queen": "queen", "name": "forager-07"}, id="q-0001", frm="queen", to="forager-07",
        ts=1312284100.25, ref="m-4f91c1")),
    ("task.assign", Message("task.assign", {
        "task": "c1-7", "attempt": 1, "capability": "crawl",
        "payload": {"url": "cm://index/3"}}, id="c1-7.1", frm="queen", to="forager-07",
        ts=1312284101)),
    ("task.result, final", Message("task.result", {
        "status": "ok", "result": {"artifacts": ["cm://index/3"]}}, id="m-4f91c3",
        frm="forager-07", to="queen", ts=1312284180, ref="c1-7.1")),
    ("task.result, partial", Message("task.result", {"partial": True, "value": "tok"},
                                     id="m-4f91c4", frm="forager-07", to="queen",
                                     ref="c1-7.1")),
    ("task.result with a blob", Message("task.result", {
        "status": "ok", "result": Blob(b"\x00\x01binary\xff")}, id="m-4f91c5",
        frm="forager-07", to="queen", ref="c1-8.1")),
    ("task.batch", Message("task.batch", {"results": [
        {"ref": "c1-9.1", "status": "ok", "result": 1},
        {"ref": "c1-10.1", "status": "error", "error": {"type": "ValueError",
                                                         "message": "bad"}}]},
        id="m-4f91c6", frm="forager-07", to="queen")),
    ("note to several, with an unknown envelope field", Message(
        "note", {"text": "crawl done"}, id="m-5", frm="forager-07", to=["forager-08", "ops"],
        extra={"trace": "abc"})),
    ("error", Message("error", {"code": "name-taken", "message": "the name is held"},
                      id="q-0002", frm="queen", to="", ref="m-1")),
]

LEGACY_LINES = [
    '{"v":"1.1","id":"q-00a1","from":"queen","to":"forager-07","kind":"task.assign",'
    '"ts":1312284100,"body":{"node":"tg:crawl-index/3","deadline":1312284400}}',
    '{"v":"1.1","id":"m-4f91c2","from":"forager-07","to":"queen","kind":"task.accept",'
    '"ref":"q-00a1","ts":1312284101}',
    '{"v":"1.1","id":"m-4f91c3","from":"forager-07","to":"queen","kind":"task.result",'
    '"ref":"q-00a1","ts":1312284180,"body":{"status":"ok","artifacts":["cm://index/3"]}}',
    '{"v":"1.1","id":"m-9","from":"forager-07","to":"queen","kind":"hb","ts":1312284190,'
    '"body":{"slots":1,"tools":["echo"],"load":0.2},"colour":"unknown fields survive"}',
]

ENV = b"\x82\xa2id\xa1x\xa4from\xa1y"  # {"id": "x", "from": "y"}


def f0(code: int, env: bytes = ENV, body: bytes = b"\x80", flags: int = 0, nblobs: int = 0,
       env_len: int | None = None) -> bytes:
    """Frame 0 built by hand, so a vector can be wrong in exactly one way."""
    n = len(env) if env_len is None else env_len
    return binary.header(code, flags, nblobs, n) + env + body


ERRORS = [
    ("wrong magic", [b"XX" + f0(15)[2:]], "bad-magic"),
    ("truncated header", [b"MA\x02"], "truncated"),
    ("no frames at all", [], "truncated"),
    ("unknown version", [f0(15)[:2] + b"\x09" + f0(15)[3:]], "bad-version"),
    ("unknown kind code", [f0(250)], "unknown-kind"),
    ("envelope length past the end", [f0(15, env_len=200)], "truncated"),
    ("no body after the envelope", [f0(15, body=b"")], "truncated"),
    ("invalid msgpack envelope", [f0(15, env=b"\xc1")], "bad-msgpack"),
    ("invalid msgpack body", [f0(15, body=b"\xc1")], "bad-msgpack"),
    ("trailing bytes after the body", [f0(15, body=b"\x80\x80")], "bad-msgpack"),
    ("envelope not a map", [f0(15, env=b"\x93\x01\x02\x03")], "bad-type"),
    ("id of the wrong type", [f0(15, env=b"\x82\xa2id\x05\xa4from\xa1y")], "bad-type"),
    ("body not a map", [f0(15, body=b"\x93\x01\x02\x03")], "bad-type"),
    ("reject without reason", [f0(14)], "missing-field"),
    ("blob announced but missing", [f0(15, flags=1, nblobs=1)], "truncated"),
    ("more frames than announced", [f0(15), b"stray"], "too-many-frames"),
    ("body references a missing blob",
     [f0(15, body=b"\x81\xa6result\xd4\x01\x05", flags=1, nblobs=1), b"raw"], "bad-blob"),
    ("note longer than 80 characters",
     [f0(42, body=b"\x81\xa4text\xd9\x51" + b"a" * 81)], "bad-value"),
]


def main() -> None:
    vectors = []
    for desc, m in BINARY:
        frames = binary.encode(m)
        vectors.append({"description": desc, "codec": "iacp2",
                        "frames_hex": [bytes(f).hex() for f in frames],
                        "message": message_json(m)})
    for line in LEGACY_LINES:
        m = legacy.decode(line.encode())
        vectors.append({"description": f"IACP 1.1 {m.kind}", "codec": "iacp1.1",
                        "frames_hex": [line.encode().hex()], "message": message_json(m)})
    (HERE / "messages.json").write_text(json.dumps(vectors, indent=1) + "\n")
    errors = [{"description": d, "frames_hex": [f.hex() for f in fr], "code": code}
              for d, fr, code in ERRORS]
    (HERE / "errors.json").write_text(json.dumps(errors, indent=1) + "\n")


if __name__ == "__main__":
    main()
