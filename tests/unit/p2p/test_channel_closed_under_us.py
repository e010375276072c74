"""A data channel closed under a sender before its close event arrived: ConnectionLost, not the
transport's own InvalidStateError (which no caller catches: it crashed a trainer whose DHT store went
to a peer that had just been killed)."""

import pytest

from engine.p2p.channel import FramedChannel
from engine.p2p.errors import ConnectionLost
from tests.memchannel import MemoryChannel


async def test_send_on_a_channel_closed_under_us_raises_connection_lost() -> None:
    raw = MemoryChannel()
    failures: list[BaseException] = []
    channel = FramedChannel(raw, lambda _m: None, max_frame=16384, window=1 << 20, max_message_bytes=1 << 19)
    channel.on_failure = failures.append
    raw.readyState = "closed"  # no "close" event yet
    with pytest.raises(ConnectionLost):
        await channel.send([b"x" * 100])
    assert channel.error is not None and len(failures) == 1
    with pytest.raises(ConnectionLost):  # and so does every later send
        await channel.send([b"y"])
