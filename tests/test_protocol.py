"""The wire protocol without a network: codecs, kind table, vectors, negotiation."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest

from meshant.protocol import (
    BY_CODE,
    KINDS,
    Blob,
    IdMaker,
    Message,
    ProtocolError,
    QueenTerms,
    Refusal,
    Welcome,
    binary,
    decode_any,
    legacy,
    negotiate,
)
from meshant.protocol.errors import CODES

VECTORS = Path(__file__).parent / "vectors"


def from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"$blob"}:
            return Blob(bytes.fromhex(v["$blob"]))
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def vector_message(d: dict[str, Any]) -> Message:
    return Message(d["kind"], from_json(d["body"]), id=d["id"], frm=d["from"], to=d["to"],
                   ts=d["ts"], ref=d["ref"], v=d["v"], extra=d["extra"])


MESSAGE_VECTORS = json.loads((VECTORS / "messages.json").read_text())
ERROR_VECTORS = json.loads((VECTORS / "errors.json").read_text())


@pytest.mark.parametrize("vec", MESSAGE_VECTORS, ids=lambda v: v["description"])
def test_vectors_decode_and_encode(vec: dict[str, Any]) -> None:
    frames = [bytes.fromhex(h) for h in vec["frames_hex"]]
    msg, codec = decode_any(frames)
    assert codec == vec["codec"]
    assert msg == vector_message(vec["message"])
    encoded = binary.encode(msg) if codec == "iacp2" else [legacy.encode(msg)]
    assert [bytes(f) for f in encoded] == frames


@pytest.mark.parametrize("vec", ERROR_VECTORS, ids=lambda v: v["description"])
def test_error_vectors(vec: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_any([bytes.fromhex(h) for h in vec["frames_hex"]])
    assert info.value.code == vec["code"]
    assert info.value.code in CODES and info.value.message


def test_header_layout() -> None:
    msg = Message("task.assign", {"task": "t"}, id="i", frm="queen")
    (f0,) = binary.encode(msg)
    assert f0[0:2] == b"MA" and f0[2] == 2 and f0[3] == 12 and f0[4] == 0 and f0[5] == 0
    (env_len,) = struct.unpack("!H", f0[6:8])
    assert msgpack.unpackb(f0[8:8 + env_len]) == {"id": "i", "from": "queen"}
    assert msgpack.unpackb(f0[8 + env_len:]) == {"task": "t"}
    assert binary.kind_of([f0]) == "task.assign"


def test_blob_frames_pass_through_without_copy() -> None:
    data = b"x" * 1_000_000
    frames = binary.encode(Message("task.result", {"status": "ok", "result": Blob(data)}))
    assert len(frames) == 2 and frames[1] is data
    assert frames[0][4] & binary.FLAG_BLOBS and frames[0][5] == 1
    msg = binary.decode(frames)
    assert msg.b["result"].data is data


def test_batch_sets_the_batch_flag() -> None:
    frames = binary.encode(Message("task.batch", {"results": []}))
    assert frames[0][4] & binary.FLAG_BATCH


def test_unknown_fields_are_ignored_and_survive() -> None:
    env = msgpack.packb({"id": "x", "from": "f", "trace": [1, 2], "v": "ignored"})
    body = msgpack.packb({"reason": "r", "future_field": {"a": 1}})
    msg = binary.decode([binary.header(14, env_len=len(env)) + env + body])
    assert msg.extra == {"trace": [1, 2]}
    assert msg.b["future_field"] == {"a": 1}
    again = binary.decode(binary.encode(msg))
    assert again == msg


def test_iacp11_example_exchange_roundtrips_byte_for_byte() -> None:
    for vec in MESSAGE_VECTORS:
        if vec["codec"] != "iacp1.1":
            continue
        line = bytes.fromhex(vec["frames_hex"][0])
        msg = legacy.decode(line + b"\n")  # a trailing newline is allowed
        assert legacy.encode(msg) == line
    assign = legacy.decode(bytes.fromhex(MESSAGE_VECTORS[-4]["frames_hex"][0]))
    assert assign.kind == "task.assign"
    assert assign.b == {"node": "tg:crawl-index/3", "deadline": 1312284400}


@pytest.mark.parametrize("data,code", [
    (b"{not json", "bad-json"),
    (b'{"v":"1.1",}', "bad-json"),
    (b"{" + b'"a":[' * 100 + b"1" + b"]" * 100 + b"}", "bad-json"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"hb","ts":' + b"9" * 5000 + b"}", "bad-json"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"hb","ts":NaN}', "bad-type"),
    (b'{"v":"2","id":"x","from":"f","kind":"hb"}', "bad-version"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"nope"}', "unknown-kind"),
    (b'{"v":"1.1","from":"f","kind":"hb"}', "missing-field"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"task.reject","body":{}}', "missing-field"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"hb","body":[]}', "bad-type"),
    (b'{"v":"1.1","id":"x","from":"f","kind":"hb","body":{"slots":"2"}}', "bad-type"),
    (b'\xff{', "truncated"),
])
def test_legacy_bad_input(data: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_any([data])
    assert info.value.code == code


def test_oversized_frames_are_refused() -> None:
    frames = binary.encode(Message("task.result", {"status": "ok", "result": "x" * 2000}))
    with pytest.raises(ProtocolError) as info:
        binary.decode(frames, max_frame=1000)
    assert info.value.code == "too-large"
    with pytest.raises(ProtocolError) as info:
        legacy.decode(b"{" + b" " * 2000 + b"}", max_size=1000)
    assert info.value.code == "too-large"


def test_extra_frames_are_refused() -> None:
    frames = binary.encode(Message("hb", {}))
    with pytest.raises(ProtocolError) as info:
        binary.decode([*frames, b"stray"])
    assert info.value.code == "too-many-frames"


def test_kind_table_is_consistent() -> None:
    names = [k.name for k in KINDS]
    codes = [k.code for k in KINDS]
    assert len(set(names)) == len(names) and len(set(codes)) == len(codes)
    assert all(0 < c < 256 for c in codes)
    for required in ("task.assign", "task.accept", "task.reject", "task.result", "task.cancel",
                     "hb", "mem.sync", "tool.query", "tool.reply", "ctl.drain", "ctl.halt",
                     "hello", "welcome", "error", "task.progress", "task.submit",
                     "task.status", "broadcast", "msg", "note"):
        assert required in names
    assert BY_CODE[15].name == "task.result"


def test_bool_is_not_a_count_and_required_fields_are_enforced() -> None:
    with pytest.raises(ProtocolError) as info:
        Message("hello", {"role": "forager", "versions": [2], "slots": True}).validate()
    assert info.value.code == "bad-type"
    with pytest.raises(ProtocolError):
        Message("error", {"code": "x"}).validate()
    Message("task.result", {"partial": True, "value": 1}).validate()


def test_encoding_an_unencodable_body_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError) as info:
        binary.encode(Message("task.result", {"result": {1, 2}}))
    assert info.value.code == "bad-type"
    with pytest.raises(ProtocolError):
        binary.encode(Message("no.such.kind", {}))


def test_ids_are_unique_and_prefixed() -> None:
    a, b = IdMaker(), IdMaker()
    ids = {a() for _ in range(1000)} | {b() for _ in range(1000)}
    assert len(ids) == 2000
    assert IdMaker("q-")() == "q-1"


TERMS = QueenTerms(epoch="e1", hb_interval=0.5, hb_misses=4, assign_timeout=60)


def test_negotiation_picks_version_and_feature_intersection() -> None:
    w = negotiate({"role": "forager", "name": "f1", "versions": [1, 2, 7],
                   "features": ["batch", "telepathy"], "slots": 3, "tools": ["a"]}, TERMS, "x")
    assert isinstance(w, Welcome)
    assert w.version == 2 and w.features == ("batch",) and w.slots == 3
    body = w.body(TERMS)
    assert body["hb_interval"] == 0.5 and body["hb_misses"] == 4 and body["epoch"] == "e1"
    Message("welcome", body).validate()


@pytest.mark.parametrize("hello,code", [
    ({"role": "forager", "versions": [9]}, "no-common-version"),
    ({"role": "spy", "versions": [2]}, "role-refused"),
    ({"role": "forager", "name": "queen", "versions": [2]}, "bad-name"),
    ({"role": "forager", "name": "a b", "versions": [2]}, "bad-name"),
    ({"role": "forager", "versions": [2], "codecs": ["json"]}, "no-common-codec"),
    ({"role": "forager", "versions": [2], "slots": 0}, "bad-hello"),
])
def test_negotiation_refusals(hello: dict[str, Any], code: str) -> None:
    r = negotiate(hello, TERMS, "fallback-1")
    assert isinstance(r, Refusal) and r.code == code and r.reason


def test_negotiation_fallback_name() -> None:
    w = negotiate({"role": "client", "versions": [2]}, TERMS, "client-abc")
    assert isinstance(w, Welcome) and w.name == "client-abc"


def test_spec_kind_table_matches_the_code() -> None:
    spec = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    rows = {}
    for line in spec.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 6 and parts[1].isdigit() and parts[2].startswith("`"):
            rows[int(parts[1])] = (parts[2].strip("`"), parts[4])
    assert {code: name for code, (name, _) in rows.items()} == {k.code: k.name for k in KINDS}
    for k in KINDS:
        for f in k.fields:
            assert f"`{f.name}`{'*' if f.required else ''}:" in rows[k.code][1], (k.name, f.name)


def _top_level_names(fields: str) -> list[str]:
    """``graph, state, node_states: [{node, …}…], failed?`` → graph, state, node_states,
    failed: the names of a body's own fields, not those nested in a value."""
    names, depth, current = [], 0, ""
    for ch in fields + ",":
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            m = re.match(r"\s*([a-z_]+)", current)
            if m:
                names.append(m.group(1))
            current = ""
        else:
            current += ch
    return names


def test_the_kind_table_has_every_field_section_7d_gives_a_graph_kind() -> None:
    # §7d defines each graph message's body in full (`graph.result {graph, state, …}`);
    # the kind table (and the spec's §4, made from it) must not know fewer fields.
    spec = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    section = spec.split("## 7d.")[1].split("\n## ")[0]
    by_name = {k.name: k for k in KINDS}
    seen = set()
    for m in re.finditer(r"`(graph\.[a-z]+) \{([^`]*?)\}", section):
        kind = by_name[m.group(1)]
        seen.add(kind.name)
        known = {f.name for f in kind.fields}
        missing = [n for n in _top_level_names(m.group(2)) if n not in known]
        assert not missing, (kind.name, missing)
    assert {"graph.state", "graph.result"} <= seen
