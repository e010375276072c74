"""A node's energy reports wait out the coordinator's absence and the node's own restart, in order,
bounded with the newest kept; a report the coordinator refuses outright is dropped, counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.node.reports import Reports


class Coordinator:
    def __init__(self) -> None:
        self.away = False
        self.refuse: int | None = None
        self.got: list[float] = []

    async def post(self, token: str, peer_id: str, kwh: float) -> float:
        if self.away:
            raise CoordinatorUnreachable("down")
        if self.refuse is not None:
            status, self.refuse = self.refuse, None
            raise CoordinatorError(status, "nope", "refused")
        self.got.append(kwh)
        return sum(self.got)


async def test_reports_wait_in_order_across_an_outage_and_a_restart(tmp_path: Path) -> None:
    c = Coordinator()
    reports = Reports(tmp_path, c.post)
    reports.energy("p", 0.1)
    await reports.deliver("t")
    c.away = True
    for kwh in (0.2, 0.3):
        reports.energy("p", kwh)
        with pytest.raises(CoordinatorUnreachable):
            await reports.deliver("t")
    assert reports.pending == 2
    again = Reports(tmp_path, c.post)  # the node restarts before the coordinator is back
    c.away = False
    again.energy("p", 0.4)
    await again.deliver("t")
    assert c.got == [0.1, 0.2, 0.3, 0.4] and again.pending == 0 and again.delivered == 3


async def test_bounded_newest_kept_and_refusals_dropped(tmp_path: Path) -> None:
    c = Coordinator()
    c.away = True
    reports = Reports(tmp_path, c.post, max_reports=3)
    for i in range(5):
        reports.energy("p", float(i))
    assert reports.pending == 3 and reports.outbox.dropped == 2
    c.away = False
    c.refuse = 400
    await reports.deliver("t")
    assert c.got == [3.0, 4.0] and reports.refused == 1
    reports.energy("p", 5.0)
    c.refuse = 503  # busy: kept for the next time
    with pytest.raises(CoordinatorError):
        await reports.deliver("t")
    assert reports.pending == 1
    await reports.deliver("t")
    assert c.got == [3.0, 4.0, 5.0]
