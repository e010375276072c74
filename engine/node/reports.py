"""The node's reports to the coordinator (the energy its contributed work spent), kept until delivered.

A node reports energy as deltas; while the coordinator is away (or the node restarts before it is
back) the deltas wait in an :class:`~engine.account.outbox.Outbox` in the node's data dir, in order,
and are delivered, oldest first, at the next report. The outbox is bounded (``MAX_REPORTS``): a node
away from its coordinator for days keeps the newest reports and counts what it dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from engine.account.errors import AccountError, CoordinatorError
from engine.account.outbox import Outbox

__all__ = ["MAX_REPORTS", "Reports"]

logger = logging.getLogger(__name__)

MAX_REPORTS = 1000  # a report a minute at most: most of a day away

#: ``(token, peer_id, kwh_delta)`` -> the coordinator's total; raises AccountError on failure.
EnergyPoster = Callable[[str, str, float], Awaitable[float]]


class Reports:
    def __init__(
        self, directory: Path | None, post_energy: EnergyPoster, max_reports: int = MAX_REPORTS
    ) -> None:
        self.outbox = Outbox(directory, max_reports)
        self.post_energy = post_energy
        self.delivered = 0
        self.refused = 0

    @property
    def pending(self) -> int:
        return len(self.outbox)

    def energy(self, peer_id: str, kwh_delta: float) -> None:
        """Keep one energy report for delivery."""
        self.outbox.put("energy", [{"peer_id": peer_id, "kwh_delta": kwh_delta}])

    async def deliver(self, token: str) -> None:
        """Deliver what waits, oldest first; stops at the first failure (AccountError: the caller's to
        note) and leaves the rest for next time. A report the coordinator refuses outright (4xx other
        than 429) is dropped, counted, rather than blocking the others forever."""
        for entry in self.outbox.entries():
            for item in entry.items:
                try:
                    await self.post_energy(token, str(item["peer_id"]), float(item["kwh_delta"]))
                except CoordinatorError as e:
                    if e.status == 429 or e.status >= 500:
                        raise
                    self.refused += 1
                    logger.warning("the coordinator refused an energy report: %s", e)
                except (KeyError, TypeError, ValueError):
                    self.refused += 1  # not a report this node wrote: never sent
                except AccountError:
                    raise
            self.outbox.done(entry)
            self.delivered += len(entry.items)
