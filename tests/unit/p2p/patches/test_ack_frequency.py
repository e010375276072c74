"""The SACK frequency agreed in the SDP and RFC 7053's I bit (engine/p2p/patches/ack_frequency.py).

The attribute's text handling, then the receiver and sender on in-memory associations (no sockets):
patched pairs that agreed, pairs where only one side asked (nothing changes), patched against stock,
with loss and duplication, and the I bit's promise that nothing waits for the delayed-SACK timer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp
from aiortc.sdp import SessionDescription

from engine.p2p import patches
from engine.p2p.patches import ack_frequency, sctp_receiver
from tests.unit.p2p.sctp_fakes import (
    FakeDtls,
    StockTransport,
    data_packet,
    data_tsns,
    established,
    retransmitted,
    run_pair,
    sacks,
)

# An offer as aiortc 1.16 writes it (one data channel, one host candidate), before our attribute.
OFFER = (
    "v=0\r\no=- 4005213763 4005213763 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
    "a=msid-semantic:WMS *\r\nm=application 49256 UDP/DTLS/SCTP webrtc-datachannel\r\n"
    "c=IN IP4 127.0.0.1\r\na=mid:0\r\na=sctp-port:5000\r\na=max-message-size:262144\r\n"
    "a=candidate:16572de626da4e5384a0ce2d0d93678a 1 udp 2130706431 127.0.0.1 49256 typ host\r\n"
    "a=end-of-candidates\r\na=ice-ufrag:K6f0\r\na=ice-pwd:XY7FANWhKlzO2iPkTY98jm\r\n"
    "a=fingerprint:sha-256 06:A6:BD:99:ED:90:BA:5F:6F:2F:3A:30:05:31:62:97:68:B8:5E:93:40:72:C7:29:"
    "C8:A4:29:E3:D8:6C:38:72\r\na=setup:actpass\r\n"
)
I_BIT = ack_frequency.I_BIT


def _with(value: str) -> str:
    return OFFER + f"a=lah-sack-frequency:{value}\r\n"


# --- the attribute ------------------------------------------------------------------------------


def test_advertise_adds_one_line_to_the_application_section_and_aiortc_still_parses_it() -> None:
    patches.install(strict=True)
    sdp = ack_frequency.advertise(OFFER)
    line = f"a=lah-sack-frequency:{ack_frequency.MAX_SACK_EVERY}\r\n"
    assert sdp.count(line) == 1 and sdp.endswith(line)
    assert ack_frequency.advertise(sdp) == sdp  # once
    parsed = SessionDescription.parse(sdp)
    media = parsed.media[0]
    assert media.kind == "application" and media.sctp_port == 5000
    assert media.sctpCapabilities is not None and media.sctpCapabilities.maxMessageSize == 262144
    assert media.dtls is not None and media.dtls.fingerprints[0].algorithm == "sha-256"
    assert ack_frequency.advertised(sdp) == ack_frequency.MAX_SACK_EVERY == 8


def test_advertise_puts_the_line_in_the_application_section_when_another_follows() -> None:
    patches.install(strict=True)
    audio = "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\n"
    sdp = ack_frequency.advertise(OFFER + audio)
    app, rest = sdp.split("m=audio", 1)
    assert "a=lah-sack-frequency:8" in app and "lah-sack-frequency" not in rest


def test_nothing_advertised_without_sctp_patches_or_data_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    patches.install(strict=True)
    no_app = OFFER.split("m=application")[0]
    assert ack_frequency.advertise(no_app) == no_app
    monkeypatch.setattr(patches, "_installed", set())
    assert ack_frequency.advertise(OFFER) == OFFER


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2", 2), ("4", 4), ("8", 8), ("16", 8), ("999", 8), ("008", 8)],
)
def test_advertised_values_are_clamped(value: str, expected: int) -> None:
    assert ack_frequency.advertised(_with(value)) == expected


@pytest.mark.parametrize("value", ["", "0", "1", "-4", "+4", "4.5", "abc", "1e3", "1000", "4 8", "\u0664"])
def test_malformed_values_count_as_a_standard_peer(value: str) -> None:
    assert ack_frequency.advertised(_with(value)) is None
    assert ack_frequency.agreed(_with("16"), _with(value)) == 2


def test_two_different_values_count_as_none_and_the_same_twice_as_one() -> None:
    assert ack_frequency.advertised(_with("8") + "a=lah-sack-frequency:4\r\n") is None
    assert ack_frequency.advertised(_with("8") + "a=lah-sack-frequency:8\r\n") == 8
    assert ack_frequency.advertised(OFFER + "a=lah-sack-frequency-x:8\r\n") is None


def test_both_sides_must_ask_and_the_smaller_wins() -> None:
    assert ack_frequency.agreed(_with("16"), _with("8")) == 8
    assert ack_frequency.agreed(_with("4"), _with("16")) == 4
    assert ack_frequency.agreed(OFFER, _with("16")) == 2
    assert ack_frequency.agreed(_with("16"), OFFER) == 2


async def test_apply_sets_a_patched_transport_and_leaves_a_stock_one() -> None:
    patches.install(strict=True)
    t: Any = sctp.RTCSctpTransport(FakeDtls("client"))  # type: ignore[arg-type]
    assert ack_frequency.sack_every(t) == 2 and not t._lah_mark_waits
    assert ack_frequency.apply(t, _with("16"), _with("8")) == 8
    assert t._lah_sack_every == 8 and t._lah_mark_waits
    assert patches.transport_stats(t)["sack_every"] == 8
    assert ack_frequency.apply(t, _with("16"), OFFER) == 2  # a renegotiation without it: back to standard
    assert t._lah_sack_every == 2 and not t._lah_mark_waits
    stock: Any = StockTransport(FakeDtls("client"))  # type: ignore[arg-type]
    ack_frequency.apply(stock, _with("16"), _with("16"))
    assert not hasattr(stock, "_lah_sack_every")
    assert ack_frequency.apply(None, _with("16"), _with("16")) == 8  # the most we accept


# --- the receiver -------------------------------------------------------------------------------


def _receiver(sack_every: int) -> tuple[Any, FakeDtls]:
    return established(1000, sack_every)


_data = data_packet


async def test_receiver_sacks_every_n_packets_once_agreed() -> None:
    t, dtls = _receiver(8)
    for tsn in range(1001, 1017):
        await t._handle_data(_data(t, tsn))
    assert [s.cumulative_tsn for s in sacks(dtls)] == [1008, 1016]
    t._sack_timer.cancel()


async def test_i_bit_gap_and_duplicate_are_sacked_at_once() -> None:
    t, dtls = _receiver(8)
    await t._handle_data(_data(t, 1001))
    await t._handle_data(_data(t, 1002, flags=3 | I_BIT))  # the sender waits: at once
    assert [s.cumulative_tsn for s in sacks(dtls)] == [1002]
    await t._handle_data(_data(t, 1004))  # a gap: at once, as at every frequency
    await t._handle_data(_data(t, 1003))  # fills it: at once
    await t._handle_data(_data(t, 1003))  # a duplicate: at once
    got = sacks(dtls)
    assert [s.cumulative_tsn for s in got] == [1002, 1002, 1004, 1004]
    assert got[1].gaps == [(2, 2)] and got[3].duplicates == [1003]
    await t._handle_data(_data(t, 1005))  # in order again: waits for 8 packets or the timer
    assert len(sacks(dtls)) == 4
    t._sack_timer.cancel()


async def test_i_bit_is_honoured_from_any_sender_at_the_standard_frequency() -> None:
    t, dtls = _receiver(2)
    await t._handle_data(_data(t, 1001, flags=3 | I_BIT))
    assert [s.cumulative_tsn for s in sacks(dtls)] == [1001]


async def test_the_timer_still_bounds_a_thinned_sack() -> None:
    t, dtls = _receiver(8)
    for tsn in range(1001, 1004):
        await t._handle_data(_data(t, tsn))
    assert sacks(dtls) == []
    await asyncio.sleep(sctp_receiver.SACK_DELAY + 0.05)
    assert [s.cumulative_tsn for s in sacks(dtls)] == [1003]


# --- whole associations -------------------------------------------------------------------------


def _i_bits(packets: list[bytes]) -> list[int]:
    return [
        c.tsn
        for p in packets
        for c in sctp.parse_packet(p)[3]
        if isinstance(c, sctp.DataChunk) and c.flags & I_BIT
    ]


def _data_packets(dtls: FakeDtls) -> int:
    return sum(1 for p in dtls.sent if p[12] == 0)


async def test_agreed_pair_sends_a_quarter_of_the_sacks_and_flags_every_wait() -> None:
    sent, received, _, da = await run_pair(n=30, size=60_000, sack_every=8)
    assert received == sent and retransmitted(da) == 0
    data, sack_count = _data_packets(da), len(sacks(da.peer))
    assert sack_count <= data / 4, (sack_count, data)
    flagged = _i_bits(da.sent)
    assert flagged and len(flagged) <= sack_count  # each one drew a SACK; most SACKs came by count
    standard = await run_pair(n=30, size=60_000)
    assert len(sacks(standard[3].peer)) >= _data_packets(standard[3]) / 2 - 1
    assert _i_bits(standard[3].sent) == []  # not agreed: no I bits on the wire


async def test_one_sided_request_changes_nothing() -> None:
    sent, received, a, da = await run_pair(n=20, sack_every=8, agree_on="sender")
    assert received == sent
    assert _i_bits(da.sent) == [] and ack_frequency.sack_every(a) == 2
    assert len(sacks(da.peer)) >= _data_packets(da) / 2 - 1


@pytest.mark.parametrize("loss", [0.03, 0.10])
async def test_agreed_pair_repairs_loss_and_flags_retransmissions(loss: float) -> None:
    sent, received, _, da = await run_pair(loss=loss, n=15, size=30_000, sack_every=8)
    assert received == sent and retransmitted(da) > 0
    tsns = data_tsns(da.sent)
    resent = {t for t in tsns if tsns.count(t) > 1}
    flagged = set(_i_bits(da.sent))
    assert resent and resent <= flagged  # every retransmission asked for a SACK at once


async def test_agreed_pair_with_duplication_delivers_each_message_once() -> None:
    sent, received, _, _ = await run_pair(n=20, duplicate=0.05, sack_every=8)
    assert received == sent


async def test_a_small_message_is_acked_without_the_timer() -> None:
    """Five packets and nothing after them: the last carries the I bit, so the sender's flight empties
    in about a round trip, not after the 20 ms delayed-SACK timer."""
    waits: list[float] = []
    for sack_every in (8, 2):
        sent, received, _, _ = await run_pair(n=1, size=5 * 1100, sack_every=sack_every, measure=waits)
        assert received == sent
    assert waits[0] < sctp_receiver.SACK_DELAY / 2 < sctp_receiver.SACK_DELAY * 0.8 < waits[1], waits


async def test_patched_sender_against_a_stock_receiver_sends_no_i_bits() -> None:
    sent, received, _, da = await run_pair(n=10, sack_every=8, receiver_cls=StockTransport)
    assert received == sent and _i_bits(da.sent) == []
