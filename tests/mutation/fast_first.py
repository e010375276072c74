"""pytest plugin for `make mutation` (scripts/mutation.py): run the fastest tests first.

mutmut runs each mutant's tests with ``-x`` in no particular order, so a mutant that a 10 ms test kills
could first sit through a property test that cannot see it. Once mutmut has timed every test (its
``mutmut-stats.json``), this orders a run by those times.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    durations: dict[str, float] = json.loads(stats.read_text("utf-8"))["duration_by_test"]
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
