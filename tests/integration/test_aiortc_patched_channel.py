"""Two real RTCPeerConnections in one process on loopback, with the SCTP patches applied."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from engine.p2p import patches

pytestmark = pytest.mark.integration

MIB = 1 << 20


async def _connected_pair(
    asks: tuple[bool, bool] = (False, False), **channel_options: Any
) -> tuple[Any, Any, Any, asyncio.Queue[Any]]:
    """Two connected peers; ``asks``: which of them puts the SACK-frequency attribute in its SDP."""
    patches.pin_host_addresses(["127.0.0.1"])
    patches.install(strict=True)
    a = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    b = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    remote: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @b.on("datachannel")
    def _on_channel(channel: Any) -> None:
        channel.on("message", inbox.put_nowait)
        remote.set_result(channel)

    channel = a.createDataChannel("bulk", **channel_options)
    opened = asyncio.Event()
    channel.on("open", opened.set)
    await a.setLocalDescription(await a.createOffer())
    offer = patches.advertise_sack_frequency(a.localDescription.sdp) if asks[0] else a.localDescription.sdp
    await b.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    await b.setLocalDescription(await b.createAnswer())
    answer = patches.advertise_sack_frequency(b.localDescription.sdp) if asks[1] else b.localDescription.sdp
    patches.agree_sack_frequency(b.sctp, answer, offer)
    await a.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    patches.agree_sack_frequency(a.sctp, offer, answer)
    await asyncio.wait_for(opened.wait(), 30)
    await asyncio.wait_for(remote, 30)
    return a, b, channel, inbox


@pytest.mark.parametrize("asks", [(False, False), (True, True)], ids=["standard", "sack-every-8"])
async def test_bulk_transfer_in_order(asks: tuple[bool, bool]) -> None:
    a, b, channel, inbox = await _connected_pair(asks)
    try:
        want = 8 if all(asks) else 2
        ends = [patches.transport_stats(pc.sctp)["sack_every"] for pc in (a, b)]
        assert ends == [want, want]
        total, size = 8 * MIB, 256 * 1024
        channel.bufferedAmountLowThreshold = 512 * 1024
        low = asyncio.Event()
        channel.on("bufferedamountlow", low.set)
        sent = hashlib.sha256()
        for i in range(total // size):
            message = os.urandom(size - i)  # distinct sizes catch reordering and truncation
            sent.update(message)
            channel.send(message)
            if channel.bufferedAmount > 1 * MIB:
                low.clear()
                await asyncio.wait_for(low.wait(), 30)
        received = hashlib.sha256()
        for i in range(total // size):
            message = await asyncio.wait_for(inbox.get(), 30)
            assert len(message) == size - i
            received.update(message)
        assert received.hexdigest() == sent.hexdigest()
    finally:
        await asyncio.wait_for(a.close(), 10)
        await asyncio.wait_for(b.close(), 10)


@pytest.mark.parametrize("options", [{"ordered": False}, {"ordered": False, "maxRetransmits": 0}])
async def test_unordered_and_unreliable_sanity(options: dict[str, Any]) -> None:
    a, b, channel, inbox = await _connected_pair(**options)
    try:
        # Single-packet messages when unreliable: stock aiortc also stalls on large messages
        # with maxRetransmits=0 (checked: same timeout with the patches off).
        step = 50 if "maxRetransmits" in options else 5000
        sent = [os.urandom(1 + step * i) for i in range(20)]
        for message in sent:
            channel.send(message)
        got = [await asyncio.wait_for(inbox.get(), 30) for _ in sent]  # loopback loses nothing
        assert sorted(got) == sorted(sent)
    finally:
        await asyncio.wait_for(a.close(), 10)
        await asyncio.wait_for(b.close(), 10)


@pytest.mark.parametrize("asks", [(True, False), (False, True)])
async def test_one_side_asking_for_fewer_sacks_changes_nothing(asks: tuple[bool, bool]) -> None:
    """aiortc ignores the attribute it does not know; the side that asked stays standard too."""
    a, b, channel, inbox = await _connected_pair(asks)
    try:
        assert [patches.transport_stats(pc.sctp)["sack_every"] for pc in (a, b)] == [2, 2]
        channel.send(b"x" * 100_000)
        assert len(await asyncio.wait_for(inbox.get(), 30)) == 100_000
    finally:
        await asyncio.wait_for(a.close(), 10)
        await asyncio.wait_for(b.close(), 10)
