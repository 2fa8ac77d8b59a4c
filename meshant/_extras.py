"""How to install one of meshant's optional extras, said so that it works here.

meshant is not on PyPI, so ``pip install 'meshant[mcp]'`` fails outside a checkout (pip
looks the name up on the index). The extra's own requirements are on PyPI, and this
installation's metadata lists them with their versions, so the hint installs exactly
those, with this interpreter's pip: right however meshant was installed (from a
checkout, editable, a wheel) and into the environment that runs it, activated or not.
"""

from __future__ import annotations

import re
import shlex
import sys
from importlib import metadata

_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds, as this installation's metadata lists them
    (empty when meshant runs from a source tree that was never installed)."""
    try:
        listed = metadata.requires("meshant") or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for req in listed:
        spec, _, marker = req.partition(";")
        if extra in _EXTRA.findall(marker):
            out.append(spec.strip())
    return out


def install_hint(extra: str) -> str:
    """A command that installs ``extra``'s requirements, ready to paste."""
    reqs = requirements(extra)
    if not reqs:
        return f"from the meshant checkout: pip install '.[{extra}]'"
    python = shlex.quote(sys.executable or "python3")
    return f"{python} -m pip install " + " ".join(shlex.quote(r) for r in reqs)


def needs(what: str, extra: str) -> str:
    """``what`` needs the ``extra`` extra: the sentence, with the command that installs it."""
    return f"{what} needs the {extra!r} extra; install it with: {install_hint(extra)}"


__all__ = ["install_hint", "needs", "requirements"]
