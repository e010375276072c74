"""Small helpers the coordinator's load benchmarks share: a progress line on stderr (the last line of
stdout stays the JSON figures), the p99 of a sample, and the description every relayed offer carries."""

from __future__ import annotations

import sys
import time
from typing import Any

from engine.p2p.descriptions import SignedDescription

# A realistic size (a few candidates); the hub relays a description without reading or verifying it.
FAKE_SDP = "v=0\r\n" + "a=candidate:1 1 udp 2130706431 192.168.1.10 50000 typ host\r\n" * 30


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


def description(sender: str, to: str, kind: str) -> SignedDescription:
    """An unsigned offer or answer: peers would refuse it, the hub relays it like any other."""
    return SignedDescription(
        type=kind,
        sdp=FAKE_SDP,
        sender=sender,
        recipient=to,
        session="bench",
        issued_at=time.time(),
        public_key=b"\x00" * 32,
        signature=b"\x00" * 64,
    )
