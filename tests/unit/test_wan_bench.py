"""benchmarks/wan.py's bookkeeping: the CPU ceiling of the emulated path, and a starved process flagged."""

from __future__ import annotations

import os

import pytest

from benchmarks import wan


def _case(mbps: float, send: float, recv: float, delay: float) -> dict[str, float]:
    return {"MBps": mbps, "cpu_send": send, "cpu_recv": recv, "delay_cpu": delay}


def test_cpu_ceiling_is_the_rate_that_would_use_every_core() -> None:
    """0.31 core-seconds per MB (sender, receiver, delayer together): 2 cores move ~6.5 MB/s at most."""
    runs = [_case(3.5, 0.45, 0.42, 0.22), _case(3.0, 0.40, 0.35, 0.2), _case(4.0, 0.5, 0.5, 0.25)]
    per_mb = sorted((r["cpu_send"] + r["cpu_recv"] + r["delay_cpu"]) / r["MBps"] for r in runs)[1]
    assert wan._cpu_ceiling(runs) == pytest.approx((os.cpu_count() or 1) / per_mb, abs=0.05)
    assert wan._cpu_ceiling([]) is None
    assert wan._cpu_ceiling([_case(0.0, 0.1, 0.1, 0.1)]) is None  # nothing moved: no estimate


def test_a_process_that_waited_for_a_core_is_cpu_bound() -> None:
    """0.2 of a core used but 0.95 wanted (used plus run-queue wait): starved, so flagged."""
    recv = {"MBps": 1.0, "cpu": 0.2, "demand": 0.5}
    assert wan.cpu_bound({"cpu": 0.2, "demand": 0.95}, recv)
    assert not wan.cpu_bound({"cpu": 0.2, "demand": 0.3}, recv)
    assert wan.cpu_bound({"cpu": 0.95, "demand": None}, {"MBps": 1.0})  # TCP's receiver: no schedstat
    assert not wan.cpu_bound({}, {})
