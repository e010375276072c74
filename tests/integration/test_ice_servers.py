"""Dead STUN/TURN servers are skipped within a deadline; the link connects through the live one."""

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aioice import stun

from engine.p2p import LinkConfig
from engine.p2p.ice_servers import IceServerProbe, answers
from engine.p2p.signaling_protocol import IceServer
from tests.integration.conftest import MakePeer
from tests.integration.test_p2p_loopback import echo_handlers


class StunResponder(asyncio.DatagramProtocol):
    """A minimal STUN server: answers Binding with the sender's address, Allocate with 401."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.requests = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        request = stun.parse_message(data)
        self.requests += 1
        if request.message_method == stun.Method.BINDING:
            reply = stun.Message(stun.Method.BINDING, stun.Class.RESPONSE, request.transaction_id)
            reply.attributes["XOR-MAPPED-ADDRESS"] = addr
        else:
            reply = stun.Message(request.message_method, stun.Class.ERROR, request.transaction_id)
            reply.attributes["ERROR-CODE"] = (401, "Unauthorized")
        assert self.transport is not None
        self.transport.sendto(bytes(reply), addr)


@pytest.fixture
async def live_stun() -> AsyncIterator[tuple[int, StunResponder]]:
    transport, responder = await asyncio.get_running_loop().create_datagram_endpoint(
        StunResponder, local_addr=("127.0.0.1", 0)
    )
    yield transport.get_extra_info("sockname")[1], responder
    transport.close()


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A UDP port that receives and never answers (a server that hangs, or packets dropped on the way)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def closed_port() -> int:
    """A UDP port nobody listens on (the kernel answers ICMP port unreachable)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


async def test_probe_tells_live_from_dead(live_stun: tuple[int, StunResponder], blackhole: int) -> None:
    live, _ = live_stun
    assert await answers("127.0.0.1", live, turn=False, timeout=5)
    assert await answers("127.0.0.1", live, turn=True, timeout=5)  # a 401 is an answer
    assert not await answers("127.0.0.1", blackhole, turn=False, timeout=0.5)
    assert not await answers("127.0.0.1", closed_port(), turn=False, timeout=5)
    assert not await answers("no-such-host.invalid", 3478, turn=False, timeout=5)

    probe = IceServerProbe(deadline=0.5)
    servers = [
        IceServer(urls=[f"stun:127.0.0.1:{blackhole}", f"stun:127.0.0.1:{live}", "stun:127.0.0.1:1"]),
        IceServer(urls=[f"turn:127.0.0.1:{blackhole}?transport=udp"], username="u", credential="c"),
        IceServer(urls=[f"turn:127.0.0.1:{live}?transport=udp", "turns:example.org:5349?transport=tcp"]),
    ]
    chosen = await probe.usable(servers)
    assert [s.urls[0] for s in chosen] == [
        f"stun:127.0.0.1:{live}",  # the first live STUN only: aiortc uses one
        f"turn:127.0.0.1:{live}?transport=udp",
        "turns:example.org:5349?transport=tcp",  # TCP/TLS is not probed
    ]
    probes = probe.probes
    assert await probe.usable(servers) == chosen
    assert probe.probes == probes  # cached: later connections pay nothing


async def test_a_dead_first_stun_server_is_skipped_and_the_link_connects(
    make_peer: MakePeer, live_stun: tuple[int, StunResponder], blackhole: int
) -> None:
    live, responder = live_stun
    servers = (IceServer(urls=[f"stun:127.0.0.1:{blackhole}", f"stun:127.0.0.1:{live}"]),)
    config = LinkConfig(connect_timeout=15, ice_servers=servers, ice_probe=IceServerProbe(deadline=1.0))
    server = await make_peer(echo_handlers(), config=config)
    client = await make_peer(config=config)
    reply = await client.call(server.peer_id, "echo", {"ok": 1}, timeout=30)
    assert reply.fields["ok"] == 1
    for pc in (client.links[server.peer_id].pc, server.links[client.peer_id].pc):
        ice = pc.sctp.transport.transport  # aiortc: DTLS transport -> ICE transport
        # aiortc gathers from one STUN server: the live one, not the dead one listed first.
        assert ice.iceGatherer._connection.stun_server == ("127.0.0.1", live)
    assert responder.requests >= 2
