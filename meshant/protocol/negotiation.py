"""Capability negotiation as pure logic: a hello in, a welcome or a refusal out."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from meshant.protocol.binary import SUPPORTED_VERSIONS

ROLES = ("forager", "client")
FEATURES = ("batch", "progress", "blobs", "mem.sync", "broadcast", "batch.progress", "steps")
CODECS = ("msgpack",)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
RESERVED_NAMES = frozenset({"queen", "*", "all"})
# What a hello may say of its capabilities (``describe``): a one-line description and
# JSON Schemas of the payload and result. Bounded, so a hello stays small.
DESCRIBE_KEYS = ("description", "payload", "result")
DESCRIBE_MAX = 64 * 1024  # bytes of the whole ``describe`` map as compact JSON
DESCRIPTION_MAX = 1000  # characters of one description

# Refusal codes (stable, machine-readable).
NO_COMMON_VERSION = "no-common-version"
BAD_NAME = "bad-name"
ROLE_REFUSED = "role-refused"
NO_COMMON_CODEC = "no-common-codec"
BAD_HELLO = "bad-hello"


@dataclass(frozen=True, slots=True)
class QueenTerms:
    """What the queen offers every peer."""

    epoch: str
    versions: tuple[int, ...] = SUPPORTED_VERSIONS
    features: tuple[str, ...] = FEATURES
    hb_interval: float = 1.0
    hb_misses: int = 5
    assign_timeout: float = 300.0
    pub: str = ""
    queen: str = "queen"
    max_message: int = 64 * 1024 * 1024
    max_broadcast: int = 128 * 1024
    roles: tuple[str, ...] = ROLES


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Welcome:
    version: int
    features: tuple[str, ...]
    name: str
    role: str
    slots: int = 0
    tools: tuple[str, ...] = ()
    labels: dict[str, Any] = field(default_factory=dict)
    describe: dict[str, dict[str, Any]] = field(default_factory=dict)

    def body(self, terms: QueenTerms) -> dict[str, Any]:
        return {
            "version": self.version,
            "features": list(self.features),
            "hb_interval": terms.hb_interval,
            "hb_misses": terms.hb_misses,
            "assign_timeout": terms.assign_timeout,
            "epoch": terms.epoch,
            "pub": terms.pub,
            "queen": terms.queen,
            "name": self.name,
            "max_message": terms.max_message,
            "max_broadcast": terms.max_broadcast,
        }


def valid_name(name: object) -> bool:
    return isinstance(name, str) and bool(NAME_RE.match(name)) and name not in RESERVED_NAMES


def negotiate(hello: dict[str, Any], terms: QueenTerms, fallback_name: str) -> Welcome | Refusal:
    """Decide on a hello body (already type-checked against the kind table)."""
    role = hello.get("role")
    if role not in terms.roles:
        return Refusal(ROLE_REFUSED, f"role {role!r} is not accepted here "
                       f"(accepted: {', '.join(terms.roles)})")
    name = hello.get("name") or fallback_name
    if not valid_name(name):
        return Refusal(BAD_NAME, f"name {name!r} is not allowed: use 1-128 letters, digits or "
                       "'._:@-', starting with a letter or digit, and not a reserved name")
    versions = [v for v in hello.get("versions", []) if isinstance(v, int)]
    common = sorted(set(versions) & set(terms.versions))
    if not common:
        return Refusal(NO_COMMON_VERSION, f"no common protocol version: peer speaks "
                       f"{versions}, queen speaks {list(terms.versions)}")
    codecs = hello.get("codecs") or ["msgpack"]
    if "msgpack" not in codecs:
        return Refusal(NO_COMMON_CODEC, f"no common codec: peer offers {codecs}, queen needs "
                       "msgpack")
    wanted = hello.get("features") or []
    features = tuple(f for f in terms.features if f in wanted)
    slots = hello.get("slots", 1 if role == "forager" else 0)
    if role == "forager" and (slots < 1 or slots > 10_000):
        return Refusal(BAD_HELLO, f"slots must be between 1 and 10000, got {slots}")
    tools = hello.get("tools") or []
    if not all(isinstance(t, str) and t for t in tools):
        return Refusal(BAD_HELLO, "tools must be a list of non-empty strings")
    describe = check_describe(hello.get("describe"), tools)
    if isinstance(describe, Refusal):
        return describe
    return Welcome(
        version=common[-1],
        features=features,
        name=name,
        role=role,
        slots=slots,
        tools=tuple(tools),
        labels=dict(hello.get("labels") or {}),
        describe=describe,
    )


def check_describe(value: Any, tools: list[str]) -> dict[str, dict[str, Any]] | Refusal:
    """A hello's ``describe`` map, kept only for the tools it announces and only the known
    keys of each; a Refusal when it is malformed or over DESCRIBE_MAX bytes."""
    if not value:
        return {}
    if not isinstance(value, dict):
        return Refusal(BAD_HELLO, "describe must be a map of capability to description")
    try:
        size = len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError):
        return Refusal(BAD_HELLO, "describe must hold JSON values only")
    if size > DESCRIBE_MAX:
        return Refusal(BAD_HELLO, f"describe is {size:,} bytes as JSON, over the "
                       f"{DESCRIBE_MAX:,} a hello may carry: give smaller schemas")
    out: dict[str, dict[str, Any]] = {}
    for tool, about in value.items():
        if tool not in tools:
            continue
        if not isinstance(about, dict):
            return Refusal(BAD_HELLO, f"describe[{tool!r}] must be a map")
        kept = {k: about[k] for k in DESCRIBE_KEYS if about.get(k) is not None}
        text = kept.get("description")
        if text is not None and (not isinstance(text, str) or len(text) > DESCRIPTION_MAX):
            return Refusal(BAD_HELLO, f"describe[{tool!r}].description must be a string of "
                           f"at most {DESCRIPTION_MAX} characters")
        if any(not isinstance(kept.get(k, {}), dict) for k in ("payload", "result")):
            return Refusal(BAD_HELLO, f"describe[{tool!r}]: a schema must be a map")
        if kept:
            out[tool] = kept
    return out
