"""The README's quick start is what CI runs, verbatim (issue #24, item 12): two one-line
commands, the first making the virtual environment that a stock Debian or Ubuntu Python
requires (PEP 668), the second running this test suite from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_start_is_two_commands_in_a_venv() -> None:
    r = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    # No pip install outside a venv: stock Debian/Ubuntu refuse it.
    assert first.startswith("python3 -m venv .venv && .venv/bin/pip install . ")
    assert first.endswith(".venv/bin/meshant demo")
    assert second == ".venv/bin/pip install '.[test]' && .venv/bin/python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".ci/readme_commands.py" in ci and 'bash -euo pipefail -c "$cmd"' in ci


def test_ci_runs_the_readme_commands_verbatim(tmp_path: Path) -> None:
    # .ci/run's loop, with the commands replaced by harmless ones, runs each as written.
    ci = (ROOT / ".ci" / "run").read_text()
    loop = ci[ci.index('for cmd in "${COMMANDS[@]}"'):ci.index("done", ci.index(
        'for cmd in "${COMMANDS[@]}"')) + 4]
    script = ('STOCK=/usr/bin\nCOMMANDS=("echo one > a && echo \'two\' >> a" "cat a > b")\n'
              + loop)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b").read_text() == "one\ntwo\n"
