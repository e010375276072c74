"""The SCTP sender (engine/p2p/patches/sctp_sender.py): loss recovery and bad input, with crafted SACKs.

One transport and a recording fake DTLS: we send data, feed it SACKs we build, and read what it sent.
Whole associations (patched against stock aiortc, both ways) run in memory with loss and duplication.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp

from engine.p2p import patches
from engine.p2p.patches import sctp_constants, sctp_sack, sctp_sender, sctp_timers
from tests.unit.p2p.sctp_fakes import FakeDtls, StockTransport, data_tsns, retransmitted, run_pair

MTU = sctp.USERDATA_MAX_LENGTH
FIRST = 1000


def _sender(peer_rwnd: int = 1 << 20) -> tuple[Any, FakeDtls]:
    dtls = FakeDtls("client")
    t: Any = sctp.RTCSctpTransport(dtls)  # type: ignore[arg-type]
    t._remote_port = 5000
    t._remote_verification_tag = 1234
    t._local_tsn = FIRST
    t._last_sacked_tsn = FIRST - 1
    t._advanced_peer_ack_tsn = FIRST - 1
    t._ssthresh = peer_rwnd  # what aiortc takes from the peer's INIT
    t._association_state = sctp.RTCSctpTransport.State.COOKIE_ECHOED  # no data channel flush
    return t, dtls


def _sack(cum: int, gaps: list[tuple[int, int]] | None = None, rwnd: int = 1 << 20) -> sctp.SackChunk:
    sack = sctp.SackChunk()
    sack.cumulative_tsn = cum % 2**32
    sack.gaps = list(gaps or [])
    sack.advertised_rwnd = rwnd
    sack.duplicates = []
    return sack


def _count(dtls: FakeDtls, tsn: int) -> int:
    return data_tsns(dtls.sent).count(tsn)


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def _close(t: Any) -> None:
    t._t3_cancel()
    if t._tlp_handle is not None:
        t._tlp_handle.cancel()


async def test_initial_window_is_ten_packets() -> None:
    t, dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 30))
    assert len(data_tsns(dtls.sent)) == 10
    _close(t)


async def test_fast_retransmit_each_chunk_once() -> None:
    """TSN 1000 lost: SACKs reporting later TSNs strike it three times, then it goes again once only."""
    t, dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    for end in range(2, 11):  # the original flight arrives, all but the first chunk
        await t._receive_sack_chunk(_sack(FIRST - 1, [(2, end)]))
    assert _count(dtls, FIRST) == 2
    st = patches.transport_stats(t)
    assert st["fast_retransmits"] == 1 and st["recoveries"] == 1 and st["retransmissions"] == 1
    await t._receive_sack_chunk(_sack(FIRST + 9))  # the retransmission arrives: recovery ends
    assert not t._in_recovery and t._cc.cwnd == t._cc.ssthresh
    _close(t)


async def test_lost_retransmission_is_found_by_time_order() -> None:
    """The retransmission of TSN 1000 is lost too: once data sent after it is acked, it goes again."""
    t, dtls = _sender()
    t._min_rtt = 0.004  # reordering window 1 ms
    await t._send(1, 53, b"x" * (MTU * 60))
    for _ in range(40):
        highest = max(data_tsns(dtls.sent))
        await t._receive_sack_chunk(_sack(FIRST - 1, [(2, highest - FIRST + 1)]))
        if _count(dtls, FIRST) >= 3:
            break
        await asyncio.sleep(0.01)
    assert _count(dtls, FIRST) == 3
    st = patches.transport_stats(t)
    assert st["rack_losses"] >= 1 and st["rto_expiries"] == 0
    _close(t)


async def test_zero_window_sends_one_probe_and_waits() -> None:
    t, dtls = _sender(peer_rwnd=0)
    await t._send(1, 53, b"x" * (MTU * 20))
    assert len(data_tsns(dtls.sent)) == 1  # the zero-window probe
    for _ in range(50):
        await t._transmit()
    assert len(data_tsns(dtls.sent)) == 1  # no spinning, nothing more until the peer opens
    assert t._t3_handle is not None  # the probe is guarded by the retransmission timer
    await t._receive_sack_chunk(_sack(FIRST, rwnd=0))
    assert data_tsns(dtls.sent) == [FIRST, FIRST + 1]  # nothing in flight again: the next probe
    await t._receive_sack_chunk(_sack(FIRST + 1, rwnd=3000))  # a tiny window: 2 chunks fit
    assert data_tsns(dtls.sent)[2:] == [FIRST + 2, FIRST + 3]
    assert t._flight_size <= 3000
    assert patches.transport_stats(t)["rwnd_limited"] > 0
    _close(t)


async def test_window_never_overrun() -> None:
    t, dtls = _sender(peer_rwnd=10_000)
    await t._send(1, 53, b"x" * (MTU * 40))
    assert t._flight_size <= 10_000
    sent = len(data_tsns(dtls.sent))
    for k in range(12):  # the peer acks one chunk at a time and shrinks its window to 5000
        before = t._flight_size
        await t._receive_sack_chunk(_sack(FIRST + k, rwnd=5000))
        assert t._flight_size <= max(5000, before - MTU)
    assert len(data_tsns(dtls.sent)) > sent  # it did send again once the window allowed
    _close(t)


async def test_rto_min_backoff_and_reset() -> None:
    t, _ = _sender()
    t._update_rto(0.001)
    assert t._rto == pytest.approx(sctp_constants.RTO_MIN)
    await t._send(1, 53, b"x" * MTU)
    for expected in (0.6, 1.2, 2.4):
        t._t3_cancel()
        t._t3_expired()
        assert t._rto == pytest.approx(expected)
    t._update_rto(0.001)  # a fresh measurement ends the backoff
    assert t._rto == pytest.approx(sctp_constants.RTO_MIN)
    for _ in range(8):
        t._t3_cancel()
        t._t3_expired()
    assert t._rto == sctp_constants.RTO_MAX
    _close(t)


async def test_probe_timeout_is_srtt_plus_variance_plus_sack_delay() -> None:
    """RFC 9002's timeout: on a steady 50 ms path ~85 ms after the last SACK, not RFC 8985's 2 x SRTT
    + 50 ms (150 ms), which every call whose tail was lost would pay; never beyond the RTO."""
    import time

    t, _ = _sender()
    for _ in range(20):
        t._update_rto(0.05)
    await t._send(1, 53, b"x" * (MTU * 3))
    now = time.monotonic()
    sctp_timers.arm_tlp(t, now)
    pto = t._tlp_deadline - now
    assert pto == pytest.approx(0.05 + max(4 * t._rttvar, 0.01) + sctp_constants.WORST_DELAYED_SACK, abs=1e-6)
    assert 0.08 <= pto < 0.1
    t._rto = 0.06
    sctp_timers.arm_tlp(t, now)
    assert t._tlp_deadline - now == pytest.approx(0.06)
    _close(t)


async def test_tail_loss_probe_resends_the_last_chunk_before_the_rto() -> None:
    t, dtls = _sender()
    t._update_rto(0.01)
    await t._send(1, 53, b"x" * (MTU * 5))
    t._rto = 5.0  # keep the T3 timer out of the way
    t._t3_restart()
    await t._receive_sack_chunk(_sack(FIRST + 3))  # the last chunk (the tail) was lost
    await _until(lambda: patches.transport_stats(t)["tlp_probes"] == 1)
    await _until(lambda: _count(dtls, FIRST + 4) == 2)
    assert patches.transport_stats(t)["rto_expiries"] == 0
    _close(t)


async def test_peer_that_never_sacks_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sctp_constants, "MAX_RETRANS", 3)
    monkeypatch.setattr(sctp_constants, "RTO_MAX", 0.1)
    t, dtls = _sender()
    t._rto = 0.05
    await t._send(1, 53, b"x" * (MTU * 3))
    await _until(lambda: t._association_state == sctp.RTCSctpTransport.State.CLOSED)
    st = patches.transport_stats(t)
    assert st["gave_up"] and st["rto_expiries"] == 4
    chunks = [c for p in dtls.sent for c in sctp.parse_packet(p)[3]]
    assert isinstance(chunks[-1], sctp.AbortChunk)


async def test_peer_silent_past_the_association_timeout_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sctp_constants, "ASSOCIATION_TIMEOUT", 0.2)
    t, _ = _sender()
    t._rto = 0.1
    await t._send(1, 53, b"x" * MTU)
    await _until(lambda: t._association_state == sctp.RTCSctpTransport.State.CLOSED)
    assert patches.transport_stats(t)["gave_up"]


async def test_gap_blocks_out_of_range_are_skipped() -> None:
    t, _dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    flight = t._flight_size
    await t._receive_sack_chunk(_sack(FIRST - 1, [(0, 0), (5, 3), (50, 60)]))
    assert t._flight_size == flight and not any(c._acked for c in t._sent_queue)
    assert patches.transport_stats(t)["bad_gap_blocks"] == 3
    await t._receive_sack_chunk(_sack(FIRST - 1, [(8, 20)]))  # partly beyond the highest TSN sent
    assert [c.tsn for c in t._sent_queue if c._acked] == [FIRST + 7, FIRST + 8, FIRST + 9]
    assert patches.transport_stats(t)["bad_gap_blocks"] == 4
    assert t._flight_size == flight - 3 * MTU
    _close(t)


async def test_forged_cumulative_ack_is_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    t, _dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    before = (len(t._sent_queue), t._flight_size, t._last_sacked_tsn)
    with caplog.at_level(logging.WARNING, logger=sctp_sack.__name__):
        await t._receive_sack_chunk(_sack(FIRST + 500))
    assert (len(t._sent_queue), t._flight_size, t._last_sacked_tsn) == before
    assert patches.transport_stats(t)["forged_acks"] == 1
    assert "beyond the highest sent" in caplog.text
    _close(t)


async def test_stale_sack_is_ignored() -> None:
    t, _ = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    await t._receive_sack_chunk(_sack(FIRST + 4))
    await t._receive_sack_chunk(_sack(FIRST + 1, [(2, 3)]))  # older than the one before
    assert t._last_sacked_tsn == FIRST + 4 and len(t._sent_queue) == 5
    _close(t)


PEERS = {
    "patched-stock": (sctp.RTCSctpTransport, StockTransport),
    "stock-patched": (StockTransport, sctp.RTCSctpTransport),
}


@pytest.mark.parametrize("peers", sorted(PEERS))
async def test_duplicated_packets_deliver_each_message_once(peers: str) -> None:
    sender, receiver = PEERS[peers]
    sent, received, _, _ = await run_pair(duplicate=0.2, n=20, sender_cls=sender, receiver_cls=receiver)
    assert received == sent


@pytest.mark.parametrize("peers", sorted(PEERS))
async def test_delay_and_loss_interop(peers: str) -> None:
    """10 ms each way, 2% loss both ways: patched and stock peers move the same bytes either way."""
    sender, receiver = PEERS[peers]
    sent, received, _, _ = await run_pair(
        loss=0.02, delay=0.01, n=30, sender_cls=sender, receiver_cls=receiver, seed=5
    )
    assert received == sent


async def test_retransmissions_per_loss_near_one() -> None:
    """1% of DATA packets lost on a 20 ms RTT path: about one retransmission per loss (stock ~30)."""
    sent, received, a, da = await run_pair(loss=0.01, delay=0.01, n=60, data_loss_only=True, seed=3)
    assert received == sent
    lost = len(da.dropped)
    assert lost >= 5
    assert retransmitted(da) <= 2 * lost + 2
    st = patches.transport_stats(a)
    assert st["recoveries"] >= 1 and st["srtt_ms"] is not None


async def test_rtt_tail_call_recovers_without_rto() -> None:
    """A 64 KiB message whose last packet is dropped completes by the probe, not the RTO."""
    dropped: list[int] = []

    def drop_last_data_once(data: bytes) -> bool:
        chunks = sctp.parse_packet(data)[3]
        last = [c for c in chunks if isinstance(c, sctp.DataChunk) and c.flags & sctp.SCTP_DATA_LAST_FRAG]
        if last and len(last[0].user_data) > 100 and not dropped:
            dropped.append(last[0].tsn)
            return True
        return False

    da, db = FakeDtls("client", 0.01), FakeDtls("server", 0.01)
    da.peer, db.peer = db, da
    a: Any = sctp.RTCSctpTransport(da)  # type: ignore[arg-type]
    b: Any = sctp.RTCSctpTransport(db)  # type: ignore[arg-type]
    got: asyncio.Queue[bytes] = asyncio.Queue()
    b.on("datachannel", lambda ch: ch.on("message", got.put_nowait))
    from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters

    await a.start(b.getCapabilities(), 5000)
    await b.start(a.getCapabilities(), 5000)
    try:
        await _until(lambda: a.state == "connected" and b.state == "connected")
        ch = RTCDataChannel(a, RTCDataChannelParameters(label="t"))
        await _until(lambda: ch.readyState == "open")
        ch.send(b"w" * 30_000)  # warm up: an RTT estimate
        assert len(await asyncio.wait_for(got.get(), 10)) == 30_000
        da.drop = drop_last_data_once
        ch.send(b"c" * 65_536)
        assert len(await asyncio.wait_for(got.get(), 10)) == 65_536
    finally:
        await a.stop()
        await b.stop()
    st = patches.transport_stats(a)
    assert dropped and st["tlp_probes"] >= 1 and st["rto_expiries"] == 0


async def test_controller_is_chosen_per_association_and_by_default() -> None:
    t, _ = _sender()
    assert patches.transport_stats(t)["cc"] == sctp_sender.DEFAULT_CONTROLLER
    t._cc.cwnd = 37 * MTU
    patches.set_congestion_control(t, "cubic")
    assert patches.transport_stats(t)["cc"] == "cubic" and t._cc.cwnd == 37 * MTU
    with pytest.raises(ValueError):
        patches.set_congestion_control(t, "vegas")
    previous = sctp_sender.DEFAULT_CONTROLLER
    try:
        patches.set_default_congestion_control("cubic")
        assert patches.transport_stats(_sender()[0])["cc"] == "cubic"
    finally:
        patches.set_default_congestion_control(previous)
    assert patches.transport_stats(StockTransport(FakeDtls("client"))) == {}  # type: ignore[arg-type]


async def test_first_rto_resends_one_chunk_and_detects_a_spurious_timeout() -> None:
    t, dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    t._t3_cancel()
    t._t3_expired()
    await _until(lambda: _count(dtls, FIRST) == 2)
    assert all(_count(dtls, FIRST + i) == 1 for i in range(1, 10))  # not the whole window
    await t._receive_sack_chunk(_sack(FIRST + 9))  # everything had arrived: the peer was only slow
    st = patches.transport_stats(t)
    assert st["spurious_rtos"] == 1 and st["retransmissions"] == 1
    _close(t)


async def test_first_rto_then_only_the_resent_chunk_acked_resends_the_rest() -> None:
    t, dtls = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    t._t3_cancel()
    t._t3_expired()
    await _until(lambda: _count(dtls, FIRST) == 2)
    await t._receive_sack_chunk(_sack(FIRST))  # only the resent chunk arrived: the window was lost
    assert all(c._retransmit or _count(dtls, c.tsn) == 2 for c in t._sent_queue)
    assert _count(dtls, FIRST + 1) == 2
    assert patches.transport_stats(t)["spurious_rtos"] == 0
    _close(t)


async def test_duplicate_reports_widen_the_reordering_window() -> None:
    t, _ = _sender()
    await t._send(1, 53, b"x" * (MTU * 10))
    sack = _sack(FIRST + 2)
    sack.duplicates = [FIRST, FIRST + 1]  # the peer got these twice: we resent them needlessly
    await t._receive_sack_chunk(sack)
    assert t._reo_mult == 2 and patches.transport_stats(t)["duplicates_reported"] == 2
    _close(t)
