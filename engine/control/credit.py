"""The account's credit as a person reads it, for ``lah status`` and the tray's status window alike.

The node reads the credit from the coordinator (once a minute, and at once when someone looks:
``refresh_credit``), so what it shows is a reading with a time. A bare "0.0 (rank #1)" read before the
first receipts arrived looked like a node that was served but never credited: the words say when the
number was read, leave out a rank that only means "nobody has credit yet", and say why a reading failed.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["describe_credit"]


def _when(at: float, now: float) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(at))
    if now - at < 20 * 3600:
        return clock
    return time.strftime("%d %b %H:%M", time.localtime(at))


def describe_credit(status: dict[str, Any], now: float | None = None) -> str:
    """``31,403.0 (rank #4), read at 14:02:10``; ``none yet, read at ...``; ``not read yet``."""
    now = time.time() if now is None else now
    credit, rank = status.get("credit"), status.get("rank")
    at, error = status.get("credit_at"), status.get("credit_error")
    failed = f"; the last reading failed: {error}" if error else ""
    if not isinstance(credit, int | float) or isinstance(credit, bool):
        return f"not read yet{failed}"
    read = f", read at {_when(float(at), now)}" if isinstance(at, int | float) else ""
    if credit <= 0:
        return f"none yet{read} (credit comes with the trainers' receipts for this computer's work){failed}"
    place = f" (rank #{rank:,})" if isinstance(rank, int) and rank > 0 else ""
    return f"{credit:,.1f}{place}{read}{failed}"
