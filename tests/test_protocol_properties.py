"""Property tests: round trips are identity; garbage gives a ProtocolError and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshant.protocol import KINDS, Blob, Message, ProtocolError, binary, decode_any, legacy

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=False), names)
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(names, kids, max_size=4)), max_leaves=12)

# Bodies valid for their kind: take the table's fields and fill them with the right types.
_FOR_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    str: names, int: st.integers(0, 2**31), bool: st.booleans(), list: st.lists(scalars,
                                                                                  max_size=3),
    dict: st.dictionaries(names, scalars, max_size=3),
}


def _field_strategy(types: Any) -> st.SearchStrategy[Any]:
    if types is object:
        return values
    if isinstance(types, tuple):
        return st.one_of(st.integers(0, 1000), st.floats(0, 1e6, allow_nan=False))
    return _FOR_TYPE[types]


@st.composite
def messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(KINDS))
    body: dict[str, Any] = {}
    for f in kind.fields:
        if f.required or draw(st.booleans()):
            body[f.name] = draw(_field_strategy(f.types))
    if kind.name == "note":
        body["text"] = draw(st.text(st.characters(exclude_characters="\r\n",
                                                  exclude_categories=["Cs"]), max_size=80))
    body.update(draw(st.dictionaries(st.text(min_size=1, max_size=5).map(lambda s: "x_" + s),
                                     scalars, max_size=2)))
    if draw(st.booleans()):
        body["blob"] = Blob(draw(st.binary(max_size=64)))
    to = draw(st.one_of(names, st.lists(names, max_size=3)))
    return Message(kind.name, body, id=draw(names.filter(bool)), frm=draw(names), to=to,
                   ts=draw(st.one_of(st.integers(0, 2**40), st.floats(0, 2e9))),
                   ref=draw(st.one_of(st.none(), names)))


@pytest.mark.slow
@given(messages())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_binary_roundtrip_is_identity(msg: Message) -> None:
    assert binary.decode(binary.encode(msg)) == msg


@given(messages())
@settings(max_examples=200)
def test_legacy_roundtrip_keeps_json_values(msg: Message) -> None:
    if msg.body and "blob" in msg.body:
        del msg.body["blob"]
    msg.v = "1.1"
    try:
        line = legacy.encode(msg)
    except ProtocolError:
        return  # e.g. integers JSON cannot hold faithfully are refused, not mangled
    again = legacy.decode(line)
    assert again.kind == msg.kind and again.id == msg.id and again.ref == msg.ref
    assert legacy.encode(again) == line


@given(st.lists(st.binary(max_size=64), max_size=6))
@settings(max_examples=500)
def test_arbitrary_frames_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    try:
        decode_any(frames)
    except ProtocolError:
        pass


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_arbitrary_json_like_bytes(data: bytes) -> None:
    try:
        decode_any([b"{" + data])
    except ProtocolError:
        pass


@pytest.mark.slow
@given(messages(), st.data())
@settings(max_examples=300)
def test_mutated_frames_decode_or_raise_protocol_error(msg: Message, data: st.DataObject) -> None:
    frames = [bytes(f) for f in binary.encode(msg)]
    i = data.draw(st.integers(0, len(frames) - 1))
    f = bytearray(frames[i])
    if f:
        pos = data.draw(st.integers(0, len(f) - 1))
        f[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(f)))
    frames[i] = bytes(f[:cut])
    try:
        decode_any(frames)
    except ProtocolError:
        pass
