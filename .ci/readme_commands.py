"""Print the README's quick-start commands, one per line, exactly as written there: the
shell blocks of its "## Quick start" section. .ci/run runs them verbatim, and a test
checks they are the two the README promises (tests/test_readme.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def quick_start(readme: Path) -> list[str]:
    text = readme.read_text("utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    commands = quick_start(root / "README.md")
    if len(commands) != 2 or any("\n" in c for c in commands):
        sys.exit(f"README.md's quick start should hold two one-line commands: {commands!r}")
    print("\n".join(commands))
