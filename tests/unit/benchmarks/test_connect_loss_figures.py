"""benchmarks/connect_loss.py's figures from connect records (no namespace, no sockets)."""

from __future__ import annotations

from typing import Any

from benchmarks.connect_loss import figures, phase_durations, quantile


def rec(
    ice: float, dtls: float, sctp: float, opened: float, ok: bool = True, **counts: int
) -> dict[str, Any]:
    base = {"stun_rtx": 0, "dtls_timeouts": 0, "dtls_copies": 0, "t1": 0, "t3": 0}
    return {"ice_ms": ice, "dtls_ms": dtls, "sctp_ms": sctp, "open_ms": opened, "ok": ok, **base, **counts}


def test_quantile_interpolates_between_ranks() -> None:
    assert quantile([], 0.5) is None
    assert quantile([7.0], 0.99) == 7.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0  # unsorted input


def test_each_phase_counts_from_the_end_of_the_one_before() -> None:
    assert phase_durations(rec(30, 1030, 1035, 1340)) == {"ice": 30, "dtls": 1000, "sctp": 5, "open": 305}


def test_failed_connects_count_but_do_not_enter_the_times() -> None:
    records = [rec(30, 40, 45, 50), rec(30, 40, 45, 16_000, t1=2), rec(30, None, None, None, ok=False, t1=9)]  # type: ignore[arg-type]
    f = figures(records, [records])
    assert f["connects"] == 3 and f["failed"] == 1
    assert f["over_15s"] == 2 and f["over_1s"] == 1
    assert f["max_ms"] == 16_000 and f["p50_ms"] == 8025
    assert f["resent_per_connect"]["t1"] == round(11 / 3, 3)
    assert f["phases"]["open"]["p50_ms"] == (5 + 15_955) / 2
