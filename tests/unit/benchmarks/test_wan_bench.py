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


def test_share_counts_only_the_seconds_both_flows_ran_after_the_later_ones_start() -> None:
    """TCP starts 2 s (8 bins) before ours; the window opens 5 s after ours and ends with the earlier
    flow's last bin. TCP's 2 s alone and both start-ups do not count."""
    tcp = [[k, 900] for k in range(100, 160)]  # 15 s from bin 100
    ours = [[k, 3000 if k < 128 else 100] for k in range(108, 170)]  # fast while settling, then 100
    share = wan.shared_window_share(ours, tcp, 0.25, settle_s=5.0)
    assert share["window_s"] == 7.75  # bins 128..158: the last common bin (159) may be partial
    assert share["share"] == 0.1  # 100 / (100 + 900): the start-up's 3000s are outside the window
    assert share["join_share"] == round(3000 / 3900, 3)  # the first 5 s after ours started
    assert share["per_s"][:5] == [0.77] * 5 and share["per_s"][5:] == [0.1] * 7


def test_share_without_a_common_window_is_none() -> None:
    assert wan.shared_window_share([], [[1, 10]], 0.25)["share"] is None
    one_second = wan.shared_window_share([[0, 10], [3, 10]], [[0, 10], [3, 10]], 0.25, settle_s=5.0)
    assert one_second["share"] is None and one_second["window_s"] == 0.0
