"""Capabilities describe themselves: derived from hints and docstrings or given, bounded,
carried in the hello, shown by status and tool.query; old peers keep working."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypedDict

import pytest

from meshant import protocol as p
from meshant.actors.describe import SCHEMA_MAX, derive, describe, schema_of
from meshant.errors import ConfigError
from meshant.protocol.negotiation import QueenTerms, Refusal, Welcome, negotiate


class Point(TypedDict):
    x: int
    y: float


@dataclasses.dataclass
class Job:
    """A job to run."""

    url: str
    depth: int = 1
    mode: Literal["fast", "deep"] = "fast"


def test_schemas_from_hints() -> None:
    assert schema_of(int) == {"type": "integer"}
    assert schema_of(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert schema_of(dict[str, float]) == {"type": "object",
                                           "additionalProperties": {"type": "number"}}
    assert schema_of(str | None) == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert schema_of(Any) is None
    assert schema_of(Point) == {"type": "object", "required": ["x", "y"], "properties": {
        "x": {"type": "integer"}, "y": {"type": "number"}}}
    job = schema_of(Job)
    assert job is not None and job["required"] == ["url"]
    assert job["properties"]["mode"] == {"enum": ["fast", "deep"]}
    assert job["description"] == "A job to run."


def test_derive_from_a_handler() -> None:
    def add(payload: Point) -> int:
        """Add the coordinates.

        More text that is not the one line."""
        return payload["x"]

    desc, payload, result = derive(add)
    assert desc == "Add the coordinates."
    assert payload is not None and payload["type"] == "object"
    assert result == {"type": "integer"}
    given = describe("add", add, description="Sum.", schema={"type": "object"})
    assert given == {"description": "Sum.", "payload": {"type": "object"},
                     "result": {"type": "integer"}}


def test_oversize_or_bad_schemas_are_refused_with_a_reason() -> None:
    big = {"type": "object", "description": "x" * (SCHEMA_MAX + 1)}
    with pytest.raises(ConfigError, match="over the"):
        describe("c", lambda p: p, schema=big)
    with pytest.raises(ConfigError, match="must be a JSON Schema object"):
        describe("c", lambda p: p, schema=[1])  # type: ignore[arg-type]


def _hello(describe: Any) -> dict[str, Any]:
    return {"role": "forager", "versions": [2], "name": "f", "tools": ["a"],
            "describe": describe}


def test_negotiation_keeps_known_tools_and_refuses_malformed_or_oversize() -> None:
    terms = QueenTerms(epoch="e")
    w = negotiate(_hello({"a": {"description": "A.", "junk": 1}, "b": {"description": "B"}}),
                  terms, "x")
    assert isinstance(w, Welcome) and w.describe == {"a": {"description": "A."}}
    assert isinstance(negotiate(_hello("nope"), terms, "x"), Refusal)
    assert isinstance(negotiate(_hello({"a": {"payload": [1]}}), terms, "x"), Refusal)
    huge = {"a": {"payload": {"description": "x" * 70_000}}}
    r = negotiate(_hello(huge), terms, "x")
    assert isinstance(r, Refusal) and "65,536" in r.reason
    # The kind table types the field: an old peer sending none is as before.
    p.validate_body(p.BY_NAME["hello"], {"role": "forager", "versions": [2]})
    with pytest.raises(p.ProtocolError):
        p.validate_body(p.BY_NAME["hello"], {"role": "forager", "versions": [2],
                                             "describe": [1]})


def test_status_and_tool_query_show_descriptions(colony: Any) -> None:
    colony.start_queen()
    f = colony.forager(start=False)

    @f.task("square")
    def square(n: int) -> int:
        """Square a number."""
        return n * n

    f.add_handler("plain", lambda x: x)
    f.start(timeout=10)
    c = colony.client()
    [entry] = c.tool_query("square")
    assert entry["description"] == "Square a number."
    assert entry["payload"] == {"type": "integer"} and entry["result"] == {"type": "integer"}
    [plain] = c.tool_query("plain")
    assert "description" not in plain and "payload" not in plain
    [rec] = c.status()["foragers"]
    assert rec["describe"] == {"square": {"description": "Square a number.",
                                          "payload": {"type": "integer"},
                                          "result": {"type": "integer"}}}
    assert c.run("square", 7, result_timeout=10) == 49
