"""Percentiles from all samples, sorted: exact, and cheap enough for benchmark sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method."""
    if not sorted_samples:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(sorted_samples)))
    return sorted_samples[min(rank, len(sorted_samples)) - 1]


def summary(samples: Sequence[float], qs: Sequence[float] = (50, 90, 99, 99.9)) -> dict[str, float]:
    """Percentiles, min and max of ``samples`` (keys ``p50``, ``p99.9``, ``max`` ...)."""
    s = sorted(samples)
    out = {f"p{q:g}": percentile(s, q) for q in qs}
    out["min"] = s[0] if s else float("nan")
    out["max"] = s[-1] if s else float("nan")
    out["n"] = len(s)
    return out
