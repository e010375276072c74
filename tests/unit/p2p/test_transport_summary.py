"""``lah status``'s links line: the SCTP senders' counters summed over a node's links."""

from __future__ import annotations

from engine.control.commands import format_status
from engine.p2p.ice_stats import format_transport, summarize_transport


def _link(srtt: float | None, **counters: int) -> dict[str, object]:
    return {"cc": "bbr", "cwnd": 12000, "srtt_ms": srtt, "in_recovery": False, **counters}


def test_counters_sum_and_srtt_median_and_worst() -> None:
    summary = summarize_transport(
        [_link(50.0, retransmissions=3, recoveries=1), _link(140.0, rto_expiries=2), _link(20.0), {}]
    )
    assert summary["links"] == 4  # a stock link (no stats) still counts as a link
    assert summary["retransmissions"] == 3 and summary["recoveries"] == 1 and summary["rto_expiries"] == 2
    assert summary["srtt_ms_median"] == 50.0 and summary["srtt_ms_max"] == 140.0
    assert summary["cwnd_bytes"] == 36000 and summary["controllers"] == ["bbr"]
    line = format_transport(summary)
    assert line.startswith("4 links (bbr), srtt 50 ms median / 140 ms worst, 3 retransmissions")
    assert "1 recoveries" in line and "2 RTO expiries" in line


def test_no_links_and_links_without_rtt_yet() -> None:
    empty = summarize_transport([])
    assert empty["links"] == 0 and empty["srtt_ms_median"] is None and empty["controllers"] == []
    assert format_transport(empty) == "0 links, 0 retransmissions, 0 recoveries, 0 RTO expiries"
    fresh = summarize_transport([_link(None)])
    assert format_transport(fresh).startswith("1 link (bbr), 0 retransmissions")


def test_status_text_has_links_line_even_from_an_older_node() -> None:
    text = format_status({"state": "running", "reason": "hosting experts"})  # no "transport" key
    assert "links:     0 links" in text
