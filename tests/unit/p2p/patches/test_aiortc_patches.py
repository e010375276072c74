"""The aiortc/aioice patches: version pin, source hashes of what they replace, and their logic.

No sockets: reassembly is checked against the stock InboundStream on random inputs, the SACK
policy by feeding packets to one RTCSctpTransport, and whole associations run over an in-memory
fake DTLS pair (with and without packet loss).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import os
import random
from typing import Any

import aioice
import aiortc
import pytest
from aiortc import rtcsctptransport as sctp

from engine.p2p import patches
from engine.p2p.errors import PatchMismatch
from engine.p2p.patches import registry, sctp_receiver
from tests.unit.p2p.sctp_fakes import (
    StockTransport,
    data_packet,
    established,
    retransmitted,
    run_pair,
    sacks,
)

StockInboundStream: Any = registry.ORIGINALS["aiortc.rtcsctptransport.InboundStream"]


def test_versions_match_pin() -> None:
    found = {"aiortc": aiortc.__version__, "aioice": aioice.__version__}
    assert found == patches.PINNED, (
        f"aiortc/aioice changed from {patches.PINNED} to {found}: review every patch in "
        "engine/p2p/patches against the new source"
    )
    assert registry.verify() == {"hosts": [], "guard": [], "sctp": [], "ice": [], "dtls": [], "handshake": []}


@pytest.mark.parametrize("patch", registry.PATCHES, ids=lambda p: p.name)
def test_replaced_sources_unchanged(patch: registry.Patch) -> None:
    source = inspect.getsource(registry.ORIGINALS[patch.name])
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == patch.sha256, (
        f"{patch.name} changed upstream: re-read it and update the patch before the recorded hash"
    )


def test_registry_names_each_original_once_and_installs_it() -> None:
    names = [p.name for p in registry.PATCHES]
    assert len(names) == len(set(names))
    assert "aioice.ice.get_host_addresses" in names
    for p in registry.PATCHES:
        if p.replacement is not None:
            owner, attr = registry._resolve(p.name)
            assert getattr(owner, attr) is p.replacement, p.name


def test_wire_constants_unchanged() -> None:
    assert sctp.SCTP_MAX_PACKET_LENGTH == 1189
    assert sctp.USERDATA_MAX_LENGTH == 1160
    assert sctp.LOCAL_MAX_MESSAGE_SIZE == 262144


def test_install_is_idempotent_and_installed() -> None:
    assert patches.install(strict=True) == {"hosts", "guard", "sctp", "ice", "dtls", "handshake"}
    assert patches.installed("sctp") and patches.installed("ice")
    assert sctp.InboundStream is sctp_receiver.FastInboundStream
    assert 0 < sctp_receiver.SACK_DELAY <= 0.2


@pytest.fixture
def uninstalled(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The sctp, ice, dtls and handshake groups put back to stock for one test, reinstalled afterwards
    (hosts and the packet guard stay: they do not depend on the pinned versions)."""
    for group in ("sctp", "ice", "dtls", "handshake"):
        registry.uninstall_group(group)
    monkeypatch.setattr(patches, "_installed", {"hosts", "guard"})
    yield
    monkeypatch.undo()
    for group in ("sctp", "ice", "dtls", "handshake"):
        registry.install_group(group)


def test_other_aiortc_version_runs_stock_with_a_warning(
    uninstalled: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(registry, "PINNED", {"aiortc": "0.0.1", "aioice": "0.13.0"})
    with caplog.at_level("WARNING"):
        assert patches.install() == {"hosts", "guard"}
    assert "running stock aiortc" in caplog.text and "0.0.1" in caplog.text
    assert (
        sctp.RTCSctpTransport._transmit
        is registry.ORIGINALS["aiortc.rtcsctptransport.RTCSctpTransport._transmit"]
    )
    assert sctp.InboundStream is StockInboundStream
    with pytest.raises(PatchMismatch):
        patches.install(strict=True)


def test_changed_source_runs_stock(uninstalled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    changed = tuple(
        dataclasses.replace(p, sha256="0" * 64) if p.name.endswith("_send_sack") else p
        for p in registry.PATCHES
    )
    monkeypatch.setattr(registry, "PATCHES", changed)
    problems = registry.verify()
    assert problems["sctp"] == ["aiortc.rtcsctptransport.RTCSctpTransport._send_sack changed upstream"]
    assert problems["ice"] == [] and problems["hosts"] == [] and problems["guard"] == []
    assert patches.install() == {"hosts", "guard", "ice", "dtls", "handshake"}
    assert not patches.installed("sctp")


def test_frozen_bundle_without_sources_trusts_the_version_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "source_sha256", lambda obj: None)  # PyInstaller ships no .py
    assert registry.verify() == {"hosts": [], "guard": [], "sctp": [], "ice": [], "dtls": [], "handshake": []}
    monkeypatch.setattr(registry, "PINNED", {"aiortc": "0.0.1", "aioice": "0.13.0"})
    problems = registry.verify()
    assert (
        problems["sctp"] and problems["ice"] and problems["hosts"] and problems["dtls"] and problems["guard"]
    )
    assert problems["handshake"]


async def test_stock_fallback_still_moves_data(uninstalled: Any) -> None:
    sent, received, _, _ = await run_pair(loss=0.02, n=10, size=20_000)
    assert received == sent


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
        got = _deliver(sctp_receiver.FastInboundStream, arrivals)
        assert got == _deliver(StockInboundStream, arrivals)


def test_reassembly_after_interrupted_scan() -> None:
    """If a consumer stops iterating pop_messages early, later calls still deliver the rest."""
    rng = random.Random(7)
    chunks = [c for c in _make_chunks(rng, 100, 10) if not c.flags & sctp.SCTP_DATA_UNORDERED]
    fast, stock = sctp_receiver.FastInboundStream(), StockInboundStream()
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


_sacks = sacks


_established = established
_data_packet = data_packet


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
    await asyncio.sleep(sctp_receiver.SACK_DELAY + 0.05)
    assert [s.cumulative_tsn for s in _sacks(dtls)] == [1001]
    assert not t._sack_needed and t._sack_timer is None


async def test_lazy_sack_timer_keeps_one_handle_and_the_delay_bound() -> None:
    """The delayed SACK's timer is not cancelled when a SACK goes early: the handle armed for the
    first waiting packet stays and, at expiry, re-arms for the packet that waits then. Every waiting
    SACK still goes within SACK_DELAY of its first packet (RFC 9260 6.2), none goes twice."""
    loop = asyncio.get_running_loop()
    t, dtls = _established(1000)
    await t._handle_data(_data_packet(t, 1001))  # waits; the timer is armed
    handle = t._sack_timer
    assert handle is not None and _sacks(dtls) == []
    await t._handle_data(_data_packet(t, 1002))  # the second packet: its SACK goes at once
    assert [s.cumulative_tsn for s in _sacks(dtls)] == [1002]
    assert t._sack_timer is handle and not handle.cancelled()  # left armed, not replaced
    await asyncio.sleep(sctp_receiver.SACK_DELAY / 2)
    waited_from = loop.time()
    await t._handle_data(_data_packet(t, 1003))  # waits again, on the same handle
    assert t._sack_timer is handle
    async with asyncio.timeout(1):
        while len(_sacks(dtls)) < 2:
            await asyncio.sleep(0.001)
    took = loop.time() - waited_from
    assert [s.cumulative_tsn for s in _sacks(dtls)] == [1002, 1003]
    assert sctp_receiver.SACK_DELAY - 0.002 <= took <= sctp_receiver.SACK_DELAY + 0.05
    await asyncio.sleep(sctp_receiver.SACK_DELAY + 0.02)
    assert len(_sacks(dtls)) == 2 and t._sack_timer is None  # nothing waits: the timer stopped


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
    stock = registry.ORIGINALS["aiortc.rtcsctptransport.RTCSctpTransport._mark_received"]
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


# --- whole associations in memory, patched and stock peers mixed ----------------------------------

PEERS = {
    "patched-patched": (sctp.RTCSctpTransport, sctp.RTCSctpTransport),
    "patched-stock": (sctp.RTCSctpTransport, StockTransport),
    "stock-patched": (StockTransport, sctp.RTCSctpTransport),
}


@pytest.mark.parametrize("peers", sorted(PEERS))
@pytest.mark.parametrize("ordered", [True, False])
async def test_association_in_memory(peers: str, ordered: bool) -> None:
    sender, receiver = PEERS[peers]
    sent, received, _, da = await run_pair(ordered=ordered, sender_cls=sender, receiver_cls=receiver)
    assert (received if ordered else sorted(received)) == (sent if ordered else sorted(sent))
    assert retransmitted(da) == 0


async def test_receiver_sacks_every_second_packet() -> None:
    sent, received, a, da = await run_pair(n=20)
    assert received == sent
    data_packets = sum(1 for p in da.sent if p[12] == 0)
    sack_count = len(_sacks(a.transport.peer))
    assert sack_count < 0.75 * data_packets


@pytest.mark.parametrize("peers", sorted(PEERS))
async def test_association_in_memory_with_loss(peers: str) -> None:
    """3% loss both ways: the loss really was repaired by retransmission, bytes intact both ways."""
    sender, receiver = PEERS[peers]
    sent, received, _, da = await run_pair(loss=0.03, n=15, sender_cls=sender, receiver_cls=receiver)
    assert received == sent and retransmitted(da) > 0


async def test_association_in_memory_with_heavy_loss() -> None:
    """10% loss in both directions: fast retransmits and T3 expiries, messages still intact."""
    sent, received, a, da = await run_pair(loss=0.10, n=15, size=30_000)
    assert received == sent
    stats = patches.transport_stats(a)
    assert retransmitted(da) > 10 and stats["retransmissions"] == retransmitted(da)
