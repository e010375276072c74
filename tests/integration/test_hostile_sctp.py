"""Hostile SCTP packets over real aiortc links on loopback: malformed chunks, a receive window ignored.

Mallory holds a real, verified link to Bob and writes raw SCTP packets into it, sealed by her own DTLS
transport as any modified client could. Bob must keep answering everyone (the 20-byte packet that froze
aiortc's parameter parser is dropped and counted, the link kept), a packet whose handling raises must
close only Mallory's link with a logged reason, and a sender that ignores Bob's receive window must be
cut off with his memory bounded.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp

from engine.p2p import Peer
from engine.p2p.patches import sctp_guard, sctp_receiver
from tests.integration.conftest import MakePeer
from tests.integration.test_p2p_loopback import echo_handlers


async def linked(make_peer: MakePeer) -> tuple[Peer, Peer, Any, Any]:
    """Bob serves; Mallory has called him once. Returns both peers and each side's SCTP transport."""
    bob = await make_peer(echo_handlers())
    mallory = await make_peer(echo_handlers())
    await mallory.call(bob.peer_id, "echo", fields={"x": 1}, timeout=10)
    async with asyncio.timeout(5):
        while mallory.peer_id not in bob.links:
            await asyncio.sleep(0.01)
    return bob, mallory, mallory.links[bob.peer_id].pc.sctp, bob.links[mallory.peer_id].pc.sctp


async def raw(sender: Any, *chunks: bytes) -> None:
    """Raw chunks in one packet with the receiver's verification tag and a valid checksum, sealed and
    sent by the sender's real DTLS transport."""
    body = b"".join(c + b"\x00" * (-len(c) % 4) for c in chunks)
    header = struct.pack("!HHL", sender._local_port, sender._remote_port, sender._remote_verification_tag)
    await sender.transport._send_data(
        header + struct.pack("<L", sctp.crc32c(header + b"\x00" * 4 + body)) + body
    )


def chunk(kind: int, body: bytes, flags: int = 0) -> bytes:
    return struct.pack("!BBH", kind, flags, 4 + len(body)) + body


async def answers(caller: Peer, callee: Peer, within: float = 3.0) -> float:
    started = time.monotonic()
    reply = await caller.call(callee.peer_id, "echo", fields={"x": 2}, timeout=within)
    assert reply.fields["x"] == 2
    return time.monotonic() - started


async def test_the_20_byte_packet_is_dropped_and_the_node_goes_on(make_peer: MakePeer) -> None:
    bob, mallory, m_sctp, b_sctp = await linked(make_peer)
    fixed = struct.pack("!LLHHL", 1, 1 << 20, 8, 8, 7)
    zero_param = struct.pack("!HH", 0x8008, 0)
    for kind in (2, 4, 130):  # INIT ACK, HEARTBEAT, RECONFIG, each with a parameter of length 0
        await raw(m_sctp, chunk(kind, (fixed if kind == 2 else b"") + zero_param))
    async with asyncio.timeout(5):
        while b_sctp._lah_malformed < 3:
            await asyncio.sleep(0.01)
    assert await answers(mallory, bob) < 3  # the same link still answers
    assert bob.links[mallory.peer_id].usable
    carol = await make_peer(echo_handlers())
    assert await answers(carol, bob) < 10  # and Bob serves a newcomer


async def test_a_packet_whose_handling_raises_closes_that_link_alone(
    make_peer: MakePeer, caplog: pytest.LogCaptureFixture
) -> None:
    """A data-channel OPEN message whose label is not UTF-8, in order on a new stream: aiortc's DCEP
    handling raises ``UnicodeDecodeError`` inside the SCTP receiver. Bob closes Mallory's link, says why,
    and serves Carol."""
    bob, mallory, m_sctp, _ = await linked(make_peer)
    carol = await make_peer(echo_handlers())
    await answers(carol, bob, within=10)
    before = sum(sctp_guard.LINKS_CLOSED.values())
    tsn = m_sctp._local_tsn
    m_sctp._local_tsn = sctp.tsn_plus_one(tsn)  # our own sender must not reuse it
    label = b"\xff\xfe"
    dcep = struct.pack("!LHHL", tsn, 100, 0, sctp.WEBRTC_DCEP) + struct.pack(
        "!BBHLHH", 3, 0, 0, 0, len(label), 0
    )
    dcep += label
    with caplog.at_level(logging.WARNING, logger=sctp_guard.__name__):
        await raw(m_sctp, chunk(0, dcep, flags=3))
        async with asyncio.timeout(10):
            while mallory.peer_id in bob.links:
                await asyncio.sleep(0.02)
    assert sum(sctp_guard.LINKS_CLOSED.values()) == before + 1
    assert "closing a link: handling a datagram from the peer raised UnicodeDecodeError" in caplog.text
    assert await answers(carol, bob) < 3


async def caught_up(receiver: Any, first_tsn: int, sent: int, within: float = 0.2) -> None:
    """Until the receiver has taken in (accepted or dropped) every chunk sent, or ``within`` s."""
    deadline = time.monotonic() + within
    while (
        time.monotonic() < deadline and receiver._association_state is sctp.RTCSctpTransport.State.ESTABLISHED
    ):
        taken = (receiver._last_received_tsn - first_tsn + 1) % sctp.SCTP_TSN_MODULO
        if taken + len(receiver._sack_misordered) + receiver._lah_window_drops >= sent:
            return
        await asyncio.sleep(0.001)


async def test_a_sender_that_ignores_the_window_is_cut_off(make_peer: MakePeer) -> None:
    """A message that never ends, sent as fast as Mallory's loop can: Bob buffers at most his window,
    then closes the link; his other link still answers."""
    bob, mallory, m_sctp, b_sctp = await linked(make_peer)
    carol = await make_peer(echo_handlers())
    await answers(carol, bob, within=10)
    window = b_sctp._advertised_rwnd
    tsn = m_sctp._local_tsn
    m_sctp._local_tsn = (tsn + 1_000_000) % sctp.SCTP_TSN_MODULO  # far from anything we send next
    payload = b"m" * 1100
    most = 0
    sent = 0
    async with asyncio.timeout(60):
        while mallory.peer_id in bob.links and sent < window // 1100 + 3 * sctp_receiver.ABUSE_LIMIT:
            flags = 2 if sent == 0 else 0  # a FIRST fragment, then middle ones only
            await raw(
                m_sctp, chunk(0, struct.pack("!LHHL", (tsn + sent) % 2**32, 200, 0, 53) + payload, flags)
            )
            sent += 1
            if sent % 16 == 0:  # paced to what Bob takes in, or loopback's UDP buffers drop the rest
                await caught_up(b_sctp, tsn, sent)
                held = sum(len(c.user_data) for s in b_sctp._inbound_streams.values() for c in s.reassembly)
                most = max(most, held)
        while mallory.peer_id in bob.links:
            await asyncio.sleep(0.02)
    assert most <= window + 1100
    assert b_sctp._lah_window_drops >= sctp_receiver.ABUSE_LIMIT
    assert await answers(carol, bob) < 3
