"""The DTLS record fast path (engine/p2p/patches/dtls.py) against stock aiortc, over real peer connections.

Two RTCPeerConnections in one process on loopback. One peer's DTLS transport is put back to stock
(instance attributes: the class keeps the patch), so patched <-> stock runs both ways in one process;
the same data must arrive intact in both directions, also with datagrams lost, duplicated (DTLS replay
protection drops the copy: the error path) and with hostile datagrams injected before the DTLS layer.

Every test runs twice: with the compiled record layer (engine/p2p/native; a stock peer's OpenSSL then
opens records sealed in C, and the reverse) and with it turned off (the Python path, the fallback).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import types
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from engine.p2p import native, patches
from engine.p2p.patches import dtls, registry

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, params=["compiled", "python"])
def records(request: pytest.FixtureRequest) -> Any:
    """Which record layer the patched side uses; "compiled" needs the built extension (make native)."""
    compiled = request.param == "compiled"
    if compiled and native.records() is None:
        pytest.fail(f"the compiled record layer is not built: {native.status()} (run `make native`)")
    native.set_enabled(compiled)
    yield request.param
    native.set_enabled(True)


def _native_layer(pc: Any) -> Any:
    fast = pc.sctp.transport.__dict__.get("_lah_fast")
    return None if fast is None else fast.native

KIB = 1024
_D = "aiortc.rtcdtlstransport.RTCDtlsTransport."
_METHODS = ("_recv_next", "_write_ssl", "_send_data")


def _make_stock(pc: Any) -> None:
    """This peer's DTLS transport runs aiortc's own methods (the oracle)."""
    transport = pc.sctp.transport
    for name in _METHODS:
        setattr(transport, name, types.MethodType(registry.ORIGINALS[_D + name], transport))


def _impair(pc: Any, seed: int, loss: float, dup: float) -> None:
    """Drop or duplicate datagrams as they arrive at this peer's UDP sockets (after the handshake): in
    front of the ICE protocol's callback, so both ways on from there (queued for the DTLS reader, or
    opened in the callback itself) see the same impaired stream."""
    conn = pc.sctp.transport.transport._connection
    rng = random.Random(seed)
    armed = {"on": False, "lost": 0, "duplicated": 0}

    def impaired(deliver: Any) -> Any:
        def datagram_received(data: bytes, addr: Any) -> None:
            if armed["on"] and data[0] == 23:  # application data records only
                r = rng.random()
                if r < loss:
                    armed["lost"] += 1
                    return
                if r < loss + dup:
                    armed["duplicated"] += 1
                    deliver(data, addr)
            deliver(data, addr)

        return datagram_received

    for protocol in conn._protocols:  # uvloop looks the callback up per datagram
        protocol.datagram_received = impaired(protocol.datagram_received)
    pc._lah_impair = armed


async def _pair(stock: str | None, impair: bool = False) -> tuple[Any, Any, Any, Any]:
    """(a, b, channel of a, channel of b), connected; ``stock``: "a" or "b" runs stock DTLS."""
    patches.pin_host_addresses(["127.0.0.1"])
    patches.install(strict=True)
    a = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    b = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    remote: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    b.on("datachannel", lambda ch: remote.done() or remote.set_result(ch))
    channel = a.createDataChannel("bulk")
    opened = asyncio.Event()
    channel.on("open", opened.set)
    await a.setLocalDescription(await a.createOffer())
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    if stock:
        _make_stock(a if stock == "a" else b)
    if impair:
        _impair(a, 1, 0.02, 0.02)
        _impair(b, 2, 0.02, 0.02)
    await a.setRemoteDescription(b.localDescription)
    await asyncio.wait_for(opened.wait(), 30)
    other = await asyncio.wait_for(remote, 30)
    return a, b, channel, other


async def _exchange(sender: Any, receiver: Any, total: int, size: int) -> None:
    inbox: asyncio.Queue[bytes] = asyncio.Queue()
    receiver.on("message", inbox.put_nowait)
    sent = hashlib.sha256()
    sizes = []
    for i in range(total // size):
        message = os.urandom(size - i)
        sizes.append(len(message))
        sent.update(message)
        sender.send(message)
        while sender.bufferedAmount > 512 * KIB:
            await asyncio.sleep(0.005)
    got = hashlib.sha256()
    for n in sizes:
        message = await asyncio.wait_for(inbox.get(), 30)
        assert len(message) == n
        got.update(message)
    assert got.hexdigest() == sent.hexdigest()
    receiver.remove_all_listeners("message")


async def _close(*pcs: Any) -> None:
    for pc in pcs:
        await asyncio.wait_for(pc.close(), 10)


@pytest.mark.parametrize("stock", ["a", "b", None])
async def test_patched_and_stock_dtls_move_the_same_bytes_both_ways(stock: str | None, records: str) -> None:
    a, b, ca, cb = await _pair(stock)
    try:
        fast = {name: pc.sctp.transport.__dict__.get("_lah_fast") for name, pc in (("a", a), ("b", b))}
        for name in ("a", "b"):  # the patched side really took the fast path, the stock side never did
            assert (fast[name] is None) == (name == stock), fast
        await _exchange(ca, cb, 2 << 20, 64 * KIB)
        await _exchange(cb, ca, 1 << 20, 16 * KIB)
        for name, pc in (("a", a), ("b", b)):
            layer = _native_layer(pc)
            if records == "python" or name == stock:
                assert layer is None
            else:  # it sealed and opened the bulk of both directions; OpenSSL only the first records
                assert layer.sealed > 700 and layer.opened > 700, (layer.sealed, layer.opened)
                assert layer.dropped_auth == layer.dropped_replay == 0
    finally:
        await _close(a, b)


@pytest.mark.parametrize("stock", ["a", "b"])
async def test_with_loss_and_duplicated_records(stock: str) -> None:
    a, b, ca, cb = await _pair(stock, impair=True)
    try:
        a._lah_impair["on"] = b._lah_impair["on"] = True
        await _exchange(ca, cb, 1 << 20, 32 * KIB)
        await _exchange(cb, ca, 512 * KIB, 8 * KIB)
        for pc in (a, b):
            assert pc._lah_impair["lost"] > 0 and pc._lah_impair["duplicated"] > 0
            layer = _native_layer(pc)
            if layer is not None:  # the copies were recognised as replays, before any decryption
                assert layer.dropped_replay > 0 and layer.dropped_auth == 0
    finally:
        await _close(a, b)


async def test_hostile_datagrams_are_dropped_and_the_channel_goes_on(records: str) -> None:
    a, b, ca, cb = await _pair(None)
    try:
        conn = b.sctp.transport.transport._connection
        rng = random.Random(7)
        before = b.sctp.transport._RTCDtlsTransport__rx_packets
        junk = [
            bytes([23, 254, 253]) + rng.randbytes(40),  # an application data record that fails to decrypt
            # the same, well formed in the session's epoch, far ahead of the window: a forgery
            bytes([23, 254, 253, 0, 1]) + (1 << 40).to_bytes(6, "big") + b"\x00\x28" + rng.randbytes(40),
            bytes([23, 254, 253, 0, 1]),  # truncated record header
            bytes([21]) + rng.randbytes(1300),  # garbage "alert"
            bytes([128]) + rng.randbytes(100),  # RTP without SRTP: dropped
            bytes([200, 1, 2]),  # not DTLS, not RTP
            bytes([63]) * 1500,
        ]
        for data in junk:
            conn.data_received(data, 1)
        await _exchange(ca, cb, 256 * KIB, 16 * KIB)
        await _exchange(cb, ca, 64 * KIB, 4 * KIB)
        assert b.sctp.transport._RTCDtlsTransport__rx_packets >= before + len(junk)
        assert b.sctp.transport.state == "connected"
        layer = _native_layer(b)
        assert (layer is None) == (records == "python")
        if layer is not None:  # the forged record failed authentication; the others were not its own
            assert layer.dropped_auth == 1
    finally:
        await _close(a, b)


async def test_close_from_a_stock_peer_ends_the_patched_transport() -> None:
    a, b, ca, cb = await _pair("a")
    try:
        await _exchange(ca, cb, 64 * KIB, 16 * KIB)
        closed = asyncio.Event()
        b.sctp.transport.on("statechange", lambda: b.sctp.transport.state == "closed" and closed.set())
        await asyncio.wait_for(a.close(), 10)  # close_notify: the patched side reads ZERO_RETURN
        await asyncio.wait_for(closed.wait(), 30)
    finally:
        await _close(a, b)


async def test_close_notify_from_the_patched_side_reaches_a_stock_peer() -> None:
    """After the hand-over OpenSSL's sequence numbers are stale: the close_notify must be sealed by the
    compiled layer, or the stock peer drops it as a replay and only notices when ICE consent expires."""
    a, b, ca, cb = await _pair("b")
    try:
        await _exchange(ca, cb, 64 * KIB, 16 * KIB)
        await _exchange(cb, ca, 64 * KIB, 16 * KIB)
        closed = asyncio.Event()
        b.sctp.transport.on("statechange", lambda: b.sctp.transport.state == "closed" and closed.set())
        await asyncio.wait_for(a.sctp.transport.stop(), 10)  # DTLS alone: ICE stays up
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await _close(a, b)


async def test_a_record_layer_that_fails_to_load_leaves_the_python_path(
    records: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib

    real_import = importlib.import_module

    def broken(name: str, *args: Any) -> Any:
        if name.endswith("._records"):
            raise ImportError("libcrypto.so.3: cannot open shared object file")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    try:
        assert native.reload() is None
        assert "cannot open shared object file" in native.status()
        assert "compiled DTLS record layer not loaded" in caplog.text
        a, b, ca, cb = await _pair(None)
        try:
            assert a.sctp.transport._lah_fast is not None  # the Python fast path, not stock
            await _exchange(ca, cb, 256 * KIB, 16 * KIB)
            assert _native_layer(a) is None and _native_layer(b) is None
        finally:
            await _close(a, b)
    finally:
        monkeypatch.undo()
        native.reload()


def test_group_falls_back_when_pyopenssl_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    changed = tuple(
        dataclasses.replace(p, sha256="0" * 64) if p.name == "OpenSSL.SSL.Connection.recv" else p
        for p in registry.PATCHES
    )
    monkeypatch.setattr(registry, "PATCHES", changed)
    problems = registry.verify()
    assert problems["dtls"] == ["OpenSSL.SSL.Connection.recv changed upstream"]
    assert problems["sctp"] == [] and problems["ice"] == []
    registry.uninstall_group("dtls")
    monkeypatch.setattr(patches, "_installed", {"hosts", "guard", "sctp", "ice", "handshake"})
    try:
        from aiortc.rtcdtlstransport import RTCDtlsTransport

        assert patches.install() == {"hosts", "guard", "sctp", "ice", "handshake"}
        assert RTCDtlsTransport._recv_next is registry.ORIGINALS[_D + "_recv_next"]
    finally:
        registry.install_group("dtls")
    assert RTCDtlsTransport._recv_next is dtls.recv_next
