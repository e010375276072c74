"""pytest plugin for `make mutation` (scripts/mutation.py): run the fastest tests first.

mutmut runs each mutant's tests with ``-x`` in no particular order, so a mutant that a 10 ms test kills
could first sit through a property test that cannot see it. Once mutmut has timed every test (its
``mutmut-stats.json``), this orders a run by those times. It also caps property tests at
``LAH_MUTATION_EXAMPLES`` examples each (set by scripts/mutation.py): the named tests pin the limits,
the property tests are a second net, and at full size they would cost minutes per mutant.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    cap = int(os.environ.get("LAH_MUTATION_EXAMPLES", "0"))
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # set by @settings / @given
        if cap and own is not None and own.max_examples > cap:
            test._hypothesis_internal_use_settings = settings(own, max_examples=cap)  # type: ignore[union-attr]
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    durations: dict[str, float] = json.loads(stats.read_text("utf-8"))["duration_by_test"]
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
