"""The public API's types say what comes back: handler decorators keep signatures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_decorated_handler_keeps_its_signature(tmp_path: Path) -> None:
    src = tmp_path / "app.py"
    src.write_text(
        "from meshant import Forager, TaskContext\n"
        "f = Forager('tcp://127.0.0.1:1')\n"
        "@f.task('x')\n"
        "def handler(text: str, ctx: TaskContext) -> int:\n"
        "    return len(text)\n"
        "reveal_type(handler)\n"
        "n: int = handler('abc', None)  # type: ignore[arg-type]\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        str(src)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    # A Capability with the handler's parameters and result (it calls the function).
    assert ("SyncCapability[[text: str, ctx: meshant.actors.handlers.TaskContext], int]"
            in r.stdout), r.stdout + r.stderr
