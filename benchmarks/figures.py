"""Small helpers the coordinator's load benchmarks share: a progress line on stderr (the last line of
stdout stays the JSON figures) and the p99 of a sample."""

from __future__ import annotations

import sys
from typing import Any


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
