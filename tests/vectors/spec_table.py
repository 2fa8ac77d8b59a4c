"""Rewrite the kind table in docs/protocol.md from the code's table (run after adding a
kind or field; test_spec_kind_table_matches_the_code fails until you do)."""

from __future__ import annotations

from pathlib import Path

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
    text = DOC.read_text()
    head = "| code | kind | meaning | body fields |"
    start = text.index(head)
    end = text.index("\n\n", start)
    DOC.write_text(text[:start] + head + "\n|---|---|---|---|\n" + "\n".join(rows) + text[end:])


if __name__ == "__main__":
    main()
