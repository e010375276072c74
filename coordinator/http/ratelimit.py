"""Per-address limits: a token bucket for request rates and a counter for concurrent connections.

Pure and synchronous (the clock is a parameter), so tests drive them with a fake clock. Keys are the
client's IP: :class:`ClientAddress` takes aiohttp's ``request.remote`` and, only where that is one of
the configured ``trusted_proxies``, walks ``X-Forwarded-For`` from the right past trusted proxies to the
first address a trusted proxy saw (a client cannot pick its key by sending the header itself).
Memory is bounded: idle buckets are forgotten, and at most ``max_keys`` addresses are tracked (the
least recently seen is dropped first, which can only make the limiter more lenient, never stuck).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ClientAddress:
    """The client's address for rate limits; ``X-Forwarded-For`` counts only from trusted proxies.

    ``proxies``: addresses or CIDR networks; a malformed one raises ValueError (at startup).
    """

    def __init__(self, proxies: Iterable[str] = ()) -> None:
        self.networks: list[IpNetwork] = [ipaddress.ip_network(p.strip(), strict=False) for p in proxies]

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def __call__(self, request: web.Request) -> str:
        remote = request.remote or "?"
        if not self.networks or not self.trusted(remote):
            return remote
        hops = [h.strip() for v in request.headers.getall("X-Forwarded-For", []) for h in v.split(",")]
        for hop in reversed([h for h in hops if h]):
            if not self.trusted(hop):
                try:
                    return str(ipaddress.ip_address(hop))
                except ValueError:  # not written by a proxy of ours: keep the last one we trust
                    return remote
            remote = hop
        return remote


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """At most ``burst`` events at once per key, refilled at ``rate`` events per second."""

    def __init__(
        self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 65536
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limiter needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    @classmethod
    def per_minute(cls, count: int, *, clock: Callable[[], float] = time.monotonic) -> RateLimiter:
        return cls(rate=max(count, 1) / 60.0, burst=max(count, 1), clock=clock)

    def _refill(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.rate)
            bucket.at = now
            self._buckets.move_to_end(key)
        return bucket

    def allow(self, key: str, cost: float = 1.0) -> bool:
        """Take ``cost`` from ``key``'s bucket if it holds that much; False (and nothing taken) if not."""
        bucket = self._refill(key, self.clock())
        if bucket.tokens >= cost:
            bucket.tokens -= cost
            return True
        return False

    def retry_after(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``allow(key, cost)`` would succeed (0 if it would now)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        now = self.clock()
        tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.rate)
        return max(0.0, (cost - tokens) / self.rate)

    def prune(self) -> int:
        """Forget buckets that are full again (as good as new); returns how many."""
        now = self.clock()
        full = [
            k for k, b in self._buckets.items() if b.tokens + max(0.0, now - b.at) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]
        return len(full)

    def __len__(self) -> int:
        return len(self._buckets)


class ConnectionLimiter:
    """At most ``max_open`` concurrent connections per key, and new ones at a bounded rate.

    ``acquire`` returns False when either limit is hit; every True must be paired with ``release``.
    """

    def __init__(
        self,
        max_open: int,
        per_minute: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self.open: dict[str, int] = {}
        # By default a whole allowance of reconnections per minute: a node that lost its network
        # comes back without trouble, a loop hammering the hub does not.
        self.rate = RateLimiter.per_minute(per_minute or max_open, clock=clock)

    def acquire(self, key: str) -> bool:
        if self.open.get(key, 0) >= self.max_open:
            return False
        if not self.rate.allow(key):
            return False
        self.open[key] = self.open.get(key, 0) + 1
        return True

    def release(self, key: str) -> None:
        n = self.open.get(key, 0) - 1
        if n > 0:
            self.open[key] = n
        else:
            self.open.pop(key, None)

    def retry_after(self, key: str) -> float:
        return math.ceil(self.rate.retry_after(key)) if self.open.get(key, 0) < self.max_open else 1.0
