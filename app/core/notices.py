"""The clocks behind what the tray tells the volunteer unprompted, apart from the lifecycle's states.

``UnreachableWatch`` decides when "Cannot reach the project" is told: once, after a node has kept
failing to join for ``UNREACHABLE_NOTIFY_S``, and again only after it joined in between.
:func:`seconds_until_tomorrow` is "Snooze until tomorrow"'s length. Pure: the clock is a parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

UNREACHABLE_NOTIFY_S = 60.0  # the node cannot reach the project this long: told once
TOMORROW_HOUR = 7  # "Snooze until tomorrow": until 07:00 the next morning


class UnreachableWatch:
    """Follows the node's status: a node ``starting`` with errors cannot reach the project's server."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.told = False

    def tell(self, status: dict[str, Any], clock: Callable[[], float]) -> bool:
        """True once per outage, when it has lasted ``UNREACHABLE_NOTIFY_S``; any other status ends it."""
        if status.get("state") == "starting" and status.get("errors"):
            now = clock()
            self.since = self.since or now
            if now - self.since >= UNREACHABLE_NOTIFY_S and not self.told:
                self.told = True
                return True
        else:
            self.since, self.told = None, False
        return False


def seconds_until_tomorrow(now: datetime | None = None) -> float:
    """Seconds from ``now`` (default: the local time) to ``TOMORROW_HOUR`` o'clock the next morning."""
    now = now or datetime.now()
    morning = (now + timedelta(days=1)).replace(hour=TOMORROW_HOUR, minute=0, second=0, microsecond=0)
    return (morning - now).total_seconds()
