"""How the benchmarks print repeats: one value, or min/median/max."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def spread(values: Sequence[float], fmt: str, sep: str = "/") -> str:
    """One value, or min/median/max of the repeats joined by ``sep`` (runs without a value left out)."""
    values = [v for v in values if not math.isnan(v)] or [math.nan]
    if len(values) == 1:
        return fmt.format(values[0])
    return sep.join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
