"""Two real RTCPeerConnections in one process on loopback, with the SCTP patches applied."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from engine.p2p import patches

pytestmark = pytest.mark.integration

MIB = 1 << 20


async def _connected_pair(**channel_options: Any) -> tuple[Any, Any, Any, asyncio.Queue[Any]]:
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
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    await a.setRemoteDescription(b.localDescription)
    await asyncio.wait_for(opened.wait(), 30)
    await asyncio.wait_for(remote, 30)
    return a, b, channel, inbox


async def test_bulk_transfer_in_order() -> None:
    a, b, channel, inbox = await _connected_pair()
    try:
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
