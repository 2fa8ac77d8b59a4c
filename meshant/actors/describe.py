"""How a capability describes itself: a one-line description and JSON Schemas of its
payload and result, derived from a handler's docstring and type hints (or given to
``@forager.task(description=, schema=, result_schema=)``).

A forager sends them in its hello (``describe``, docs/protocol.md); the queen shows them
in ``status`` and ``tool.reply``, and the A2A and MCP gateways turn them into skills and
tools. They are bounded: a hello must stay small.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meshant.errors import ConfigError

DESCRIPTION_MAX = 200  # characters of the one-line description (longer is cut, with …)
SCHEMA_MAX = 8 * 1024  # bytes of one schema as compact JSON
_DEPTH_MAX = 8  # nested types followed when deriving a schema

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, type(None): {"type": "null"}, bytes: {"type": "string"},
}


def one_line(text: str | None) -> str | None:
    """The first paragraph of ``text`` as one line of at most DESCRIPTION_MAX characters."""
    if not text:
        return None
    para = inspect.cleandoc(text).split("\n\n", 1)[0]
    line = " ".join(para.split())
    if len(line) > DESCRIPTION_MAX:
        line = line[:DESCRIPTION_MAX - 1].rstrip() + "…"
    return line or None


def schema_of(tp: Any, depth: int = 0) -> dict[str, Any] | None:
    """A JSON Schema of the Python type ``tp``, or None when nothing useful can be said
    (``Any``, an unknown class). Handles scalars, ``list``/``tuple``/``dict``, unions and
    ``Optional``, ``Literal``, enums, ``TypedDict``, dataclasses and pydantic models."""
    if depth > _DEPTH_MAX or tp is Any or tp is inspect.Parameter.empty:
        return None
    if tp in _SCALARS:
        return dict(_SCALARS[tp])
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return schema_of(args[0], depth + 1)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        subs = [schema_of(a, depth + 1) for a in args]
        if any(s is None for s in subs):
            return None
        return {"anyOf": subs}
    if origin in (list, set, frozenset, Sequence) or tp in (list, set, frozenset):
        item = schema_of(args[0], depth + 1) if args else None
        return {"type": "array", **({"items": item} if item else {})}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = schema_of(args[0], depth + 1)
            return {"type": "array", **({"items": item} if item else {})}
        items = [schema_of(a, depth + 1) or {} for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items),
                "maxItems": len(items)}
    if tp is tuple:
        return {"type": "array"}
    if origin in (dict, Mapping) or tp is dict:
        value = schema_of(args[1], depth + 1) if len(args) == 2 else None
        return {"type": "object", **({"additionalProperties": value} if value else {})}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and typing.is_typeddict(tp):
        hints = _hints(tp)
        required = sorted(getattr(tp, "__required_keys__", hints))
        return _object({k: schema_of(v, depth + 1) for k, v in hints.items()}, required,
                       tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        fields = dataclasses.fields(tp)
        required = [f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        return _object({f.name: schema_of(hints.get(f.name, Any), depth + 1)
                        for f in fields}, required, tp)
    json_schema = getattr(tp, "model_json_schema", None)  # a pydantic model
    if callable(json_schema):
        try:
            out = json_schema()
        except Exception:
            return None
        return out if isinstance(out, dict) else None
    return None


def _hints(tp: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp)
    except Exception:
        return dict(getattr(tp, "__annotations__", {}))


def _object(props: dict[str, dict[str, Any] | None], required: list[str],
            tp: type) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object",
                           "properties": {k: v or {} for k, v in props.items()}}
    if required:
        out["required"] = required
    title = one_line(tp.__doc__) if tp.__doc__ and not tp.__doc__.startswith(
        tp.__name__ + "(") else None
    if title:
        out["description"] = title
    return out


def derive(fn: Callable[..., Any]) -> tuple[str | None, dict[str, Any] | None,
                                            dict[str, Any] | None]:
    """(description, payload schema, result schema) of a handler: the docstring's first
    paragraph; the first parameter's and the return annotation's types."""
    description = one_line(inspect.getdoc(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
        params = list(inspect.signature(fn).parameters.values())
    except Exception:
        return description, None, None
    payload = None
    if params and params[0].kind in (params[0].POSITIONAL_ONLY,
                                     params[0].POSITIONAL_OR_KEYWORD):
        payload = schema_of(hints.get(params[0].name, Any))
    result = schema_of(hints.get("return", Any)) if "return" in hints else None
    return description, payload, result


def describe(capability: str, fn: Callable[..., Any], *, description: str | None = None,
             schema: dict[str, Any] | None = None,
             result_schema: dict[str, Any] | None = None,
             batch: bool = False) -> dict[str, Any]:
    """What a forager's hello says of ``capability`` (served by ``fn``): given values
    win over derived ones; a batch handler's hints are of lists, so nothing is derived
    for it. Raises ConfigError when a schema is not a JSON object or over SCHEMA_MAX."""
    d_desc, d_payload, d_result = (None, None, None) if batch else derive(fn)
    out: dict[str, Any] = {}
    text = one_line(description) if description is not None else d_desc
    if text:
        out["description"] = text
    for key, given, derived in (("payload", schema, d_payload),
                                ("result", result_schema, d_result)):
        value = given if given is not None else derived
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"capability {capability!r}: the {key} schema must be a JSON "
                              f"Schema object (a dict), not {type(value).__name__}")
        try:
            size = len(json.dumps(value, separators=(",", ":")))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"capability {capability!r}: the {key} schema is not "
                              f"JSON: {e}") from None
        if size > SCHEMA_MAX:
            if given is not None:
                raise ConfigError(f"capability {capability!r}: the {key} schema is "
                                  f"{size:,} bytes as JSON, over the {SCHEMA_MAX:,} a hello "
                                  "may carry; give a smaller one (or none)")
            continue  # a derived one too large is left out rather than refused
        out[key] = value
    return out


__all__ = ["DESCRIPTION_MAX", "SCHEMA_MAX", "derive", "describe", "one_line", "schema_of"]
