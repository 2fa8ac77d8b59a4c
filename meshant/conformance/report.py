"""The kit's verdicts: one line per check (PASS/FAIL/SKIP with the spec section), or a
JSON report; a FAIL makes the exit code non-zero."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from meshant.conformance.catalog import BY_ID

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


class CheckFailed(Exception):
    """Raised inside a check: the peer under test broke the rule the check tests."""


class Skipped(Exception):
    """Raised inside a check: the peer under test cannot be checked for this (say why)."""


@dataclass(slots=True)
class Outcome:
    id: str
    section: str
    status: str
    title: str
    detail: str = ""

    def line(self) -> str:
        tail = f" — {self.detail}" if self.detail else ""
        return f"{self.status} {self.section:5} {self.id:18} {self.title}{tail}"


@dataclass(slots=True)
class Report:
    """What one run of a kit found, in the order it checked."""

    kit: str
    target: str
    outcomes: list[Outcome] = field(default_factory=list)
    echo: Callable[[str], None] | None = None

    def add(self, check_id: str, status: str, detail: str = "") -> None:
        info = BY_ID[check_id]
        out = Outcome(check_id, info.section, status, info.title, detail)
        self.outcomes.append(out)
        if self.echo is not None:
            self.echo(out.line())

    def run(self, check_id: str, fn: Callable[[], str | None]) -> bool:
        """Run one check: PASS unless it raises CheckFailed (FAIL) or Skipped (SKIP). An
        unexpected exception is a FAIL too, so a kit bug cannot pass silently."""
        try:
            detail = fn() or ""
        except Skipped as e:
            self.add(check_id, SKIP, str(e))
            return True
        except CheckFailed as e:
            self.add(check_id, FAIL, str(e))
            return False
        except Exception as e:  # a timeout, a peer that vanished, a kit bug: never a pass
            self.add(check_id, FAIL, f"{type(e).__name__}: {e}")
            return False
        self.add(check_id, PASS, detail)
        return True

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o.status == FAIL)

    def counts(self) -> dict[str, int]:
        return {s.lower(): sum(1 for o in self.outcomes if o.status == s)
                for s in (PASS, FAIL, SKIP)}

    def summary(self) -> str:
        c = self.counts()
        return (f"{self.kit} conformance of {self.target}: {c['pass']} passed, "
                f"{c['fail']} failed, {c['skip']} skipped")

    def to_json(self) -> dict[str, Any]:
        return {"kit": self.kit, "target": self.target, **self.counts(),
                "ok": self.failed == 0, "checks": [asdict(o) for o in self.outcomes]}

    def dumps(self) -> str:
        return json.dumps(self.to_json())


def require(cond: object, why: str) -> None:
    """Fail the running check with ``why`` unless ``cond`` holds."""
    if not cond:
        raise CheckFailed(why)
