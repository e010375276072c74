"""The aiortc/aioice patches: version pin, source hashes of what they replace, and their logic.

No sockets: reassembly is checked against the stock InboundStream on random inputs, the SACK
policy by feeding packets to one RTCSctpTransport, and whole associations run over an in-memory
fake DTLS pair (with and without packet loss).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import random
from typing import Any

import aioice
import aiortc
import pytest
from aiortc import rtcsctptransport as sctp
from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters

from engine.p2p import aioice_patches, aiortc_patches, aiortc_sctp_fast

aiortc_patches.apply()

StockInboundStream: Any = aiortc_sctp_fast.ORIGINALS["aiortc.rtcsctptransport.InboundStream"]


def test_versions_match_pin() -> None:
    found = {"aiortc": aiortc.__version__, "aioice": aioice.__version__}
    assert found == aiortc_patches.PINNED, (
        f"aiortc/aioice changed from {aiortc_patches.PINNED} to {found}: review "
        "engine/p2p/aiortc_patches.py and aiortc_sctp_fast.py against the new source"
    )
    aiortc_patches.check_versions()


ALL_ORIGINALS = {**aiortc_sctp_fast.ORIGINALS, **aioice_patches.ORIGINALS}
ALL_HASHES = {**aiortc_sctp_fast.ORIGINAL_SOURCE_SHA256, **aioice_patches.ORIGINAL_SOURCE_SHA256}


@pytest.mark.parametrize("name", sorted(ALL_ORIGINALS))
def test_replaced_sources_unchanged(name: str) -> None:
    source = inspect.getsource(ALL_ORIGINALS[name])
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == ALL_HASHES[name], (
        f"{name} changed upstream: re-read it and update the patch before the recorded hash"
    )


def test_every_original_has_a_hash() -> None:
    assert set(aiortc_sctp_fast.ORIGINALS) == set(aiortc_sctp_fast.ORIGINAL_SOURCE_SHA256)
    assert set(aioice_patches.ORIGINALS) == set(aioice_patches.ORIGINAL_SOURCE_SHA256)


def test_wire_constants_unchanged() -> None:
    assert sctp.SCTP_MAX_PACKET_LENGTH == 1189
    assert sctp.USERDATA_MAX_LENGTH == 1160
    assert sctp.LOCAL_MAX_MESSAGE_SIZE == 262144


def test_apply_is_idempotent_and_installed() -> None:
    aiortc_patches.apply()
    assert aiortc_patches.applied()
    assert sctp.InboundStream is aiortc_sctp_fast.FastInboundStream
    assert 0 < aiortc_sctp_fast.SACK_DELAY <= 0.2


# --- reassembly against the stock class ---------------------------------------------------------


def _make_chunks(rng: random.Random, first_tsn: int, n_messages: int) -> list[sctp.DataChunk]:
    chunks = []
    tsn = first_tsn
    seq = 0
    for _ in range(n_messages):
        ordered = rng.random() < 0.7
        nfrag = rng.choice([1, 1, 2, 3, 5])
        payload = os.urandom(nfrag * 7)
        for i in range(nfrag):
            c = sctp.DataChunk()
            c.flags = 0 if ordered else sctp.SCTP_DATA_UNORDERED
            if i == 0:
                c.flags |= sctp.SCTP_DATA_FIRST_FRAG
            if i == nfrag - 1:
                c.flags |= sctp.SCTP_DATA_LAST_FRAG
            c.tsn = tsn
            c.stream_id = 1
            c.stream_seq = seq if ordered else 0
            c.protocol = 53
            c.user_data = payload[i * 7 : (i + 1) * 7]
            chunks.append(c)
            tsn = (tsn + 1) % 2**32
        if ordered:
            seq = (seq + 1) % 2**16
    return chunks


def _arrivals(rng: random.Random, chunks: list[sctp.DataChunk], mode: str) -> list[sctp.DataChunk]:
    out = list(chunks)
    if mode == "reordered":
        for i in range(len(out)):  # local reordering, as a network does
            j = min(len(out) - 1, i + rng.randrange(4))
            out[i], out[j] = out[j], out[i]
    elif mode == "shuffled":
        rng.shuffle(out)
    if mode != "in_order":
        out += rng.sample(chunks, k=len(chunks) // 5)  # duplicates
        rng.shuffle(out[-len(chunks) // 3 :])
    return out


def _deliver(stream_cls: Any, arrivals: list[sctp.DataChunk]) -> list[list[tuple[int, int, bytes]]]:
    stream = stream_cls()
    seen: set[int] = set()
    steps = []
    for c in arrivals:
        if c.tsn in seen:  # _mark_received drops duplicates before add_chunk
            continue
        seen.add(c.tsn)
        stream.add_chunk(c)
        steps.append(list(stream.pop_messages()))
    assert not stream.reassembly
    return steps


@pytest.mark.parametrize("mode", ["in_order", "reordered", "shuffled"])
@pytest.mark.parametrize("first_tsn", [0, 2**32 - 20])
def test_reassembly_matches_stock(mode: str, first_tsn: int) -> None:
    rng = random.Random(f"{mode}{first_tsn}")
    for _ in range(30):
        chunks = _make_chunks(rng, first_tsn, rng.randrange(1, 40))
        arrivals = _arrivals(rng, chunks, mode)
        got = _deliver(aiortc_sctp_fast.FastInboundStream, arrivals)
        assert got == _deliver(StockInboundStream, arrivals)


def test_reassembly_after_interrupted_scan() -> None:
    """If a consumer stops iterating pop_messages early, later calls still deliver the rest."""
    rng = random.Random(7)
    chunks = [c for c in _make_chunks(rng, 100, 10) if not c.flags & sctp.SCTP_DATA_UNORDERED]
    fast, stock = aiortc_sctp_fast.FastInboundStream(), StockInboundStream()
    got_fast, got_stock = [], []
    # hold back the first chunk so all later messages queue up, then stop after one message
    for s, got in ((fast, got_fast), (stock, got_stock)):
        for c in chunks[1:]:
            s.add_chunk(c)
            got += list(s.pop_messages())
        s.add_chunk(chunks[0])
        got += [next(iter(s.pop_messages()))]
    for c in _make_chunks(random.Random(7), 100 + len(chunks), 3):
        for s, got in ((fast, got_fast), (stock, got_stock)):
            if c.flags & sctp.SCTP_DATA_UNORDERED:
                continue
            s.add_chunk(c)
            got += list(s.pop_messages())
    assert got_fast == got_stock


# --- SACK policy on one transport ---------------------------------------------------------------


class FakeDtls:
    """Just enough of RTCDtlsTransport for RTCSctpTransport: records or forwards packets."""

    def __init__(self, role: str) -> None:
        self.state = "connected"
        self._role = role
        self.sent: list[bytes] = []
        self.peer: FakeDtls | None = None
        self.receiver: Any = None
        self.drop = lambda data: False
        self._tasks: set[asyncio.Task[None]] = set()

    def _register_data_receiver(self, receiver: Any) -> None:
        self.receiver = receiver

    def _unregister_data_receiver(self, receiver: Any) -> None:
        self.receiver = None

    async def _send_data(self, data: bytes) -> None:
        self.sent.append(data)
        peer = self.peer
        if peer is not None and peer.receiver is not None and not self.drop(data):
            task = asyncio.ensure_future(peer.receiver._handle_data(data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


def _sacks(dtls: FakeDtls) -> list[sctp.SackChunk]:
    out = []
    for packet in dtls.sent:
        out += [c for c in sctp.parse_packet(packet)[3] if isinstance(c, sctp.SackChunk)]
    return out


def _retransmitted(dtls: FakeDtls) -> int:
    """DATA chunks sent more than once (sent minus distinct TSNs)."""
    tsns = [c.tsn for p in dtls.sent for c in sctp.parse_packet(p)[3] if isinstance(c, sctp.DataChunk)]
    return len(tsns) - len(set(tsns))


def _established(base_tsn: int) -> tuple[Any, FakeDtls]:
    dtls = FakeDtls("server")
    t: Any = sctp.RTCSctpTransport(dtls)  # type: ignore[arg-type]
    t._remote_port = 5000
    t._association_state = sctp.RTCSctpTransport.State.ESTABLISHED
    t._last_received_tsn = base_tsn
    return t, dtls


def _data_packet(t: Any, tsn: int, flags: int = 3) -> bytes:
    c = sctp.DataChunk()
    c.flags = flags
    c.tsn = tsn
    c.stream_id = 1
    c.protocol = 53
    c.user_data = b"x" * 100
    return sctp.serialize_packet(5000, 5000, t._local_verification_tag, c)


async def test_sack_every_second_packet() -> None:
    t, dtls = _established(1000)
    for i in range(1, 7):
        await t._handle_data(_data_packet(t, 1000 + i))
    assert [s.cumulative_tsn for s in _sacks(dtls)] == [1002, 1004, 1006]
    assert all(not s.gaps and not s.duplicates for s in _sacks(dtls))


async def test_sack_timer_flushes_a_lone_packet() -> None:
    t, dtls = _established(1000)
    await t._handle_data(_data_packet(t, 1001))
    assert _sacks(dtls) == []
    await asyncio.sleep(aiortc_sctp_fast.SACK_DELAY + 0.05)
    assert [s.cumulative_tsn for s in _sacks(dtls)] == [1001]
    assert not t._sack_needed and t._sack_timer is None


async def test_sack_immediate_on_gap_fill_and_duplicate() -> None:
    t, dtls = _established(1000)
    await t._handle_data(_data_packet(t, 1001))  # waits for a second packet
    await t._handle_data(_data_packet(t, 1003))  # gap: at once
    sacks = _sacks(dtls)
    assert len(sacks) == 1 and sacks[0].cumulative_tsn == 1001 and sacks[0].gaps == [(2, 2)]
    await t._handle_data(_data_packet(t, 1002))  # fills the gap: at once
    sacks = _sacks(dtls)
    assert len(sacks) == 2 and sacks[1].cumulative_tsn == 1003 and sacks[1].gaps == []
    await t._handle_data(_data_packet(t, 1002))  # duplicate: at once
    sacks = _sacks(dtls)
    assert len(sacks) == 3 and sacks[2].duplicates == [1002]
    await t._handle_data(_data_packet(t, 1004))  # back to waiting for a second packet
    assert len(_sacks(dtls)) == 3
    t._sack_timer.cancel()


async def test_mark_received_matches_stock() -> None:
    stock = aiortc_sctp_fast.ORIGINALS["aiortc.rtcsctptransport.RTCSctpTransport._mark_received"]
    rng = random.Random(3)
    for base in (5, 2**32 - 8):
        a, _ = _established(base)
        b, _ = _established(base)
        tsns = [(base + 1 + rng.randrange(30)) % 2**32 for _ in range(200)]
        tsns.sort(key=lambda x: ((x - base) % 2**32) + rng.randrange(6))
        for tsn in tsns:
            assert a._mark_received(tsn) == stock(b, tsn)
            assert a._last_received_tsn == b._last_received_tsn
            assert a._sack_misordered == b._sack_misordered
            assert a._sack_duplicates == b._sack_duplicates


# --- whole associations in memory ---------------------------------------------------------------


async def _run_pair(loss: float, ordered: bool = True, n: int = 40, size: int = 50_000) -> int:
    """Send ``n`` messages a -> b dropping ``loss`` of packets; returns DATA chunks retransmitted."""
    rng = random.Random(11)
    da, db = FakeDtls("client"), FakeDtls("server")
    da.peer, db.peer = db, da
    da.drop = db.drop = lambda data: rng.random() < loss
    a: Any = sctp.RTCSctpTransport(da)  # type: ignore[arg-type]
    b: Any = sctp.RTCSctpTransport(db)  # type: ignore[arg-type]
    a._rto = b._rto = 0.2  # keep lossy runs short
    received: list[bytes] = []
    done = asyncio.Event()

    @b.on("datachannel")
    def _on_channel(channel: Any) -> None:
        @channel.on("message")
        def _on_message(message: bytes) -> None:
            received.append(message)
            if len(received) == n:
                done.set()

    await a.start(b.getCapabilities(), 5000)
    await b.start(a.getCapabilities(), 5000)
    async with asyncio.timeout(30):
        while a.state != "connected" or b.state != "connected":
            await asyncio.sleep(0.01)
        channel = RTCDataChannel(a, RTCDataChannelParameters(label="t", ordered=ordered))
        while channel.readyState != "open":
            await asyncio.sleep(0.01)
        sent = [os.urandom(rng.randrange(1, size)) for _ in range(n)]
        for message in sent:
            channel.send(message)
        await done.wait()
    assert (received if ordered else sorted(received)) == (sent if ordered else sorted(sent))
    # the receiver sent about one SACK per two DATA packets, not one per packet
    data_packets = sum(1 for p in da.sent if p[12] == 0)
    assert len(_sacks(db)) < 0.75 * data_packets or loss > 0
    await a.stop()
    await b.stop()
    return _retransmitted(da)


async def test_association_in_memory() -> None:
    assert await _run_pair(loss=0.0) == 0


async def test_association_in_memory_unordered() -> None:
    assert await _run_pair(loss=0.0, ordered=False) == 0


async def test_association_in_memory_with_loss() -> None:
    assert await _run_pair(loss=0.03, n=15) > 0  # the loss really was repaired by retransmission


async def test_association_in_memory_with_heavy_loss() -> None:
    """10% loss in both directions: fast retransmits and T3 expiries, messages still intact."""
    t3 = aiortc_sctp_fast._stock_t3_expired
    expiries: list[int] = []
    aiortc_sctp_fast._stock_t3_expired = lambda self: (expiries.append(1), t3(self))[1]
    try:
        retransmitted = await _run_pair(loss=0.10, n=15, size=30_000)
    finally:
        aiortc_sctp_fast._stock_t3_expired = t3
    assert retransmitted > 10 and expiries


# --- sender fast paths (SACK processing, retransmit flag) against the stock code -----------------

_STOCK = "aiortc.rtcsctptransport.RTCSctpTransport."
_CHUNK_FIELDS = ("tsn", "_acked", "_misses", "_retransmit", "_in_flight", "_abandoned", "_sent_count")
_STATE_FIELDS = (
    "_last_sacked_tsn", "_flight_size", "_cwnd", "_ssthresh", "_partial_bytes_acked",
    "_fast_recovery_exit", "_fast_recovery_transmit", "_advanced_peer_ack_tsn", "_local_tsn",
)  # fmt: skip


def _sender_pair(first_tsn: int) -> tuple[Any, FakeDtls, Any, FakeDtls]:
    """Two identical senders: ``fast`` with the patches, ``stock`` with the stock methods bound."""
    pair = []
    for _ in range(2):
        dtls = FakeDtls("client")
        t: Any = sctp.RTCSctpTransport(dtls)  # type: ignore[arg-type]
        t._remote_port = 5000
        t._remote_verification_tag = 1234
        t._local_tsn = first_tsn
        t._last_sacked_tsn = (first_tsn - 1) % 2**32
        t._advanced_peer_ack_tsn = t._last_sacked_tsn
        t._ssthresh = 131072  # set from the peer's a_rwnd at INIT
        t._association_state = sctp.RTCSctpTransport.State.COOKIE_ECHOED  # no data channel flush
        pair += [t, dtls]
    stock = pair[2]
    for name in ("_receive_sack_chunk", "_transmit", "_t3_expired"):
        setattr(stock, name, aiortc_sctp_fast.ORIGINALS[_STOCK + name].__get__(stock))
    return pair[0], pair[1], pair[2], pair[3]


def _snapshot(t: Any) -> tuple[Any, ...]:
    chunks = [tuple(getattr(c, f) for f in _CHUNK_FIELDS) for c in (*t._sent_queue, *t._outbound_queue)]
    return (*(getattr(t, f) for f in _STATE_FIELDS), chunks)


def _peer_sack(received: set[int], cum: int, rng: random.Random) -> sctp.SackChunk:
    sack = sctp.SackChunk()
    while (cum + 1) % 2**32 in received:
        cum = (cum + 1) % 2**32
    sack.cumulative_tsn = cum
    offsets = sorted((tsn - cum) % 2**32 for tsn in received if 0 < (tsn - cum) % 2**32 < 2**15)
    gaps: list[tuple[int, int]] = []
    for off in offsets:
        if gaps and gaps[-1][1] == off - 1:
            gaps[-1] = (gaps[-1][0], off)
        else:
            gaps.append((off, off))
    roll = rng.random()
    if roll < 0.05 and len(gaps) > 1:
        gaps.reverse()  # malformed: unsorted (stock path)
    elif roll < 0.1 and gaps:
        gaps.append(gaps[0])  # malformed: overlapping (stock path)
    elif roll < 0.15:
        sack.cumulative_tsn = (cum - rng.randrange(1, 5)) % 2**32  # stale or reneging cumulative TSN
    sack.gaps = gaps
    return sack


@pytest.mark.parametrize("first_tsn", [1000, 2**32 - 300])
@pytest.mark.parametrize("max_retransmits", [None, 1])
async def test_sender_fast_paths_match_stock(first_tsn: int, max_retransmits: int | None) -> None:
    """Random lossy runs: same packets sent, same per-chunk and congestion state after every step."""
    rng = random.Random(f"{first_tsn}{max_retransmits}")
    fast, fast_dtls, stock, stock_dtls = _sender_pair(first_tsn)
    received: set[int] = set()
    cum = (first_tsn - 1) % 2**32
    seen_packets = 0
    retransmits = t3_expiries = fast_path_sacks = 0
    stock_sack_calls = [0]
    stock_sack = aiortc_sctp_fast._stock_receive_sack

    def counting_stock_sack(t: Any, c: Any) -> Any:
        stock_sack_calls[0] += 1
        return stock_sack(t, c)

    aiortc_sctp_fast._stock_receive_sack = counting_stock_sack
    try:
        for step in range(400):
            action = rng.random()
            if action < 0.15 or not fast._sent_queue:
                data = os.urandom(rng.randrange(1, 12_000))
                for t in (fast, stock):
                    await t._send(1, 53, data, max_retransmits=max_retransmits)
            elif action < 0.18:
                t3_expiries += 1
                for t in (fast, stock):
                    t._t3_cancel()
                    t._t3_expired()
                for _ in range(3):
                    await asyncio.sleep(0)
            else:
                sack = _peer_sack(received, cum, rng)
                fell_back = stock_sack_calls[0]
                await fast._receive_sack_chunk(sack)
                fast_path_sacks += stock_sack_calls[0] == fell_back
                await stock._receive_sack_chunk(sack)
                for t in (fast, stock):
                    await t._transmit()
            assert fast_dtls.sent == stock_dtls.sent, f"step {step}"
            assert _snapshot(fast) == _snapshot(stock), f"step {step}"
            # the peer receives 85% of the new packets
            for packet in fast_dtls.sent[seen_packets:]:
                for c in sctp.parse_packet(packet)[3]:
                    if isinstance(c, sctp.DataChunk) and rng.random() < 0.85:
                        received.add(c.tsn)
            seen_packets = len(fast_dtls.sent)
            while (cum + 1) % 2**32 in received:
                cum = (cum + 1) % 2**32
        retransmits = _retransmitted(fast_dtls)
    finally:
        aiortc_sctp_fast._stock_receive_sack = stock_sack
        for t in (fast, stock):
            t._t3_cancel()
    assert retransmits > 0 and t3_expiries > 0 and fast_path_sacks > 100


async def test_transmit_skips_scan_only_when_nothing_is_marked() -> None:
    fast, _, _, _ = _sender_pair(10)
    await fast._send(1, 53, b"x" * 5000)
    assert not fast._rtx_pending
    fast._t3_cancel()
    fast._t3_expired()  # marks everything for retransmission and raises the flag
    assert fast._rtx_pending and all(c._retransmit for c in fast._sent_queue)
    fast._cwnd = 10 * sctp.USERDATA_MAX_LENGTH
    await fast._transmit()
    assert not fast._rtx_pending and not any(c._retransmit for c in fast._sent_queue)
    fast._t3_cancel()
