"""OfferGate: which offers the hub relays. A token bucket per sender, and a memory of recent offers so
that a replayed one never costs its recipient a second connection attempt.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from engine.p2p import signaling_protocol as sp

from ..http.ratelimit import RateLimiter

__all__ = [
    "DUPLICATE_WINDOW_S",
    "MAX_REMEMBERED_OFFERS",
    "OFFERS_PER_S",
    "OFFER_BURST",
    "RATE_LIMITED",
    "OfferGate",
]

RATE_LIMITED = "rate_limited"
# A node dials a few dozen peers as it joins (DHT bootstrap, experts), then a few a minute.
OFFER_BURST = 64
OFFERS_PER_S = 2.0
DUPLICATE_WINDOW_S = 120.0  # a signed description is refused by its recipient after this anyway
MAX_REMEMBERED_OFFERS = 65536


class OfferGate:
    """Which relayed offers go through: a token bucket per sender and a memory of recent offers.

    Pure (the clock is a parameter) and bounded: at most ``MAX_REMEMBERED_OFFERS`` signatures, the
    oldest forgotten first, and the limiter's own bound on senders.
    """

    def __init__(
        self,
        rate: float = OFFERS_PER_S,
        burst: float = OFFER_BURST,
        *,
        window_s: float = DUPLICATE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = RateLimiter(rate, burst, clock=clock)
        self.window_s = window_s
        self.clock = clock
        self._seen: OrderedDict[tuple[str, bytes], float] = OrderedDict()

    def check(self, sender: str, signal: sp.Signal) -> str | None:
        """None to relay; else why not: ``"duplicate"`` or ``RATE_LIMITED``."""
        if signal.description.type != "offer":
            return None
        now = self.clock()
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if now - at <= self.window_s and len(self._seen) <= MAX_REMEMBERED_OFFERS:
                break
            del self._seen[key]
        desc = signal.description
        key = (sender, hashlib.blake2b(desc.signed_bytes() + desc.signature, digest_size=16).digest())
        if key in self._seen:
            return "duplicate"
        if not self.limiter.allow(sender):
            return RATE_LIMITED
        self._seen[key] = now
        return None

    def retry_after(self, sender: str) -> float:
        return self.limiter.retry_after(sender)
