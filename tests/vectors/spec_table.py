"""Rewrite the kind table in docs/protocol.md from the code's table (run after adding a
kind or field; test_spec_kind_table_matches_the_code fails until you do), and its
appendix A from the conformance kit's catalog of checks."""

from __future__ import annotations

import re
from pathlib import Path

from meshant.conformance.catalog import CHECKS
from meshant.protocol import KINDS

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _type(types: object) -> str:
    if types is object:
        return "any"
    if isinstance(types, tuple):
        return "number"
    return {str: "str", int: "int", bool: "bool", list: "array", dict: "map"}[types]  # type: ignore[index]


def main() -> None:
    rows = []
    for k in KINDS:
        fields = ", ".join(f"`{f.name}`{'*' if f.required else ''}: {_type(f.types)}"
                           for f in k.fields) or "—"
        rows.append(f"| {k.code} | `{k.name}` | {k.meaning} | {fields} |")
    text = _replace(DOC.read_text(), "| code | kind | meaning | body fields |", rows)
    checks = [f"| `{c.id}` | {kit} | {c.section} | {c.title} |" for kit, c in CHECKS]
    DOC.write_text(cross_reference(_replace(text, CHECKS_HEAD, checks)))


CROSS = "*Conformance checks: "


def _section_of(heading: str) -> str | None:
    """``"§2.3"`` for ``"### 2.3 Body and blobs"``, ``"§7a"`` for ``"## 7a. Liveness"``."""
    m = re.match(r"#{2,3} (\d+[a-z]?(?:\.\d+)?)\.? ", heading)
    return f"§{m.group(1)}" if m else None


def cross_reference(text: str) -> str:
    """Each numbered section ends with the ids of the checks that test it (a check of
    "§5.3", an item of §5, is listed under §5), so spec and kit name each other."""
    by_section: dict[str, list[str]] = {}
    for _, c in CHECKS:
        key = c.section if c.section.count(".") == 0 or c.section.startswith("§2.") else (
            c.section.partition(".")[0])
        by_section.setdefault(key, []).append(f"`{c.id}`")
    lines = [ln for ln in text.split("\n") if not ln.startswith(CROSS)]
    out: list[str] = []
    current: str | None = None
    for ln in lines:
        if ln.startswith("## ") or ln.startswith("### "):
            _flush(out, by_section.get(current or "", []))
            current = _section_of(ln)
        out.append(ln)
    _flush(out, by_section.get(current or "", []))
    return "\n".join(out)


def _flush(out: list[str], ids: list[str]) -> None:
    if not ids:
        return
    while out and out[-1] == "":
        out.pop()
    out.extend(["", CROSS + ", ".join(ids) + " (appendix A).*", ""])


CHECKS_HEAD = "| check | kit | section | what it tests |"


def _replace(text: str, head: str, rows: list[str]) -> str:
    """``text`` with the markdown table under ``head`` made of ``rows``."""
    start = text.index(head)
    end = text.find("\n\n", start)
    end = len(text.rstrip("\n")) if end < 0 else end
    sep = "|" + "---|" * (head.count(" | ") + 1)
    return text[:start] + head + "\n" + sep + "\n" + "\n".join(rows) + text[end:]


if __name__ == "__main__":
    main()
