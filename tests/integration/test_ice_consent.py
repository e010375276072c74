"""ICE consent (RFC 7675) on a busy machine: two real aioice connections on loopback, the answering
side's event loop made slow by delaying its binding responses past aioice's 0.5 s wait.

Stock aioice tears such a link down after six late answers; the patched check retransmits and only
gives up when nothing has answered for the expiry, so the link lives. A peer that is gone is still
dropped. The consent interval is shortened (the expiry follows it: six intervals) so each case takes
seconds, not minutes; the retransmission timer (0.5, 1, 2 s) is aioice's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aioice.ice as ice
import aioice.stun as stun
import pytest

from engine.p2p.patches import ice as ice_patch
from engine.p2p.patches import pin_host_addresses, pinned_host_addresses, registry

INTERVAL_S = 0.5  # expiry: 6 x 0.5 = 3 s, against ~1.4 s between late answers
LATE_S = 0.8  # each answer comes later than stock's 0.5 s wait, well within the patched 7.5 s


@pytest.fixture
async def pair(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Any, Any]]:
    monkeypatch.setattr(ice, "CONSENT_INTERVAL", INTERVAL_S)
    before = pinned_host_addresses()
    pin_host_addresses(["127.0.0.1"])
    a = ice.Connection(ice_controlling=True)
    b = ice.Connection(ice_controlling=False)
    async with asyncio.timeout(30):
        await asyncio.gather(a.gather_candidates(), b.gather_candidates())
        for x, y in ((a, b), (b, a)):
            x.remote_username, x.remote_password = y.local_username, y.local_password
            for c in y.local_candidates:
                await x.add_remote_candidate(c)
            await x.add_remote_candidate(None)
        await asyncio.gather(a.connect(), b.connect())
    yield a, b
    async with asyncio.timeout(30):
        await asyncio.gather(a.close(), b.close())
    pin_host_addresses(before)


def answer_late(conn: Any) -> None:
    """Binding responses from ``conn`` leave LATE_S after the request came, as from a lagging loop."""
    loop = asyncio.get_running_loop()
    for protocol in conn._protocols:
        send = protocol.send_stun

        def late(message: Any, addr: Any, send: Any = send) -> None:
            if message.message_method == stun.Method.BINDING and message.message_class == stun.Class.RESPONSE:
                loop.call_later(LATE_S, send, message, addr)
            else:
                send(message, addr)

        protocol.send_stun = late


async def still_open(conn: Any, for_s: float) -> bool:
    await asyncio.sleep(for_s)
    return conn._query_consent_task is not None and not conn._query_consent_task.done()


async def test_late_answers_keep_the_link(pair: tuple[Any, Any]) -> None:
    a, b = pair
    answer_late(b)
    # Stock closes after six late answers: ~6 x (0.5 + 0.5) s.
    assert await still_open(a, 8 * (INTERVAL_S + 0.5) + 1)
    await a.sendto(b"still here", 1)
    async with asyncio.timeout(10):
        assert await b.recv() == b"still here"


async def test_stock_consent_drops_the_same_link(
    pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle: what the patch changes. The same lag under aioice's own check closes the link."""
    a, b = pair
    a._query_consent_task.cancel()
    stock = registry.ORIGINALS["aioice.ice.Connection.query_consent"]
    monkeypatch.setattr(ice.Connection, "query_consent", stock)
    a._query_consent_task = asyncio.create_task(a.query_consent())
    answer_late(b)
    async with asyncio.timeout(30):
        while a._query_consent_task is not None and not a._query_consent_task.done():
            await asyncio.sleep(0.1)
    assert a._nominated == {}  # closed: consent expired


async def test_a_peer_that_is_gone_is_still_dropped(pair: tuple[Any, Any]) -> None:
    a, b = pair
    for protocol in b._protocols:  # b stops answering anything, as a killed process
        protocol.send_stun = lambda message, addr: None
    # No answer for the expiry: closed after the first check that runs out (7.5 s each) past 3 s.
    async with asyncio.timeout(30):
        while a._query_consent_task is not None and not a._query_consent_task.done():
            await asyncio.sleep(0.1)
    assert a._nominated == {}
    assert ice_patch.consent_expiry_s() == pytest.approx(6 * INTERVAL_S)
