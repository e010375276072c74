"""A 4-bit expert call over real aiortc on loopback: a low-rank expert (rows of ``wire_rank`` numbers)
answers ``wire="int4"`` within the 4-bit bound, and a request whose int4 payload is malformed fails that
call while the host stays up and serves the next one."""

import asyncio

import pytest
import torch

from engine.moe import ExpertCallFailed, ExpertServer, ExpertSpec, LoopThread, RemoteExpert, build
from engine.p2p import Handlers
from engine.wire import Compression, encode_message
from tests.integration.conftest import MakePeer

SPEC = ExpertSpec("ffn", 32, hidden=64, wire_rank=5)  # rows of 5: an odd element count, a padding nibble


async def test_int4_call_over_aiortc_and_a_malformed_payload_fails_only_its_call(
    make_peer: MakePeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ExpertServer.create({"ffn.0.0": SPEC}, device="cpu", backend_options={"seed": 0, "lr": 0.0})
    handlers = Handlers()
    server.register(handlers)
    host = await make_peer(handlers)
    trainer = await make_peer()
    loop = LoopThread.attach(asyncio.get_running_loop())
    expert = RemoteExpert(trainer, host.peer_id, "ffn.0.0", loop=loop, timeout=20, wire="int4")
    ref = build(SPEC)
    ref.load_state_dict(server.experts["ffn.0.0"].module.state_dict())
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(3, 5)

    def step() -> torch.Tensor:
        y: torch.Tensor = expert(x)
        (y * w).sum().backward()
        return y.detach()

    y = await asyncio.wait_for(asyncio.to_thread(step), 30)
    with torch.no_grad():
        y_ref = ref(x.detach())
    # The inputs' 4-bit step, carried through the expert, then the outputs' own.
    assert y.shape == (3, 5)
    assert float((y - y_ref).abs().max()) < 0.5 * float(y_ref.abs().max())
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert server.stats()["ffn.0.0"]["forward_requests"] == 1

    def corrupting(msg, compression, **kwargs):  # type: ignore[no-untyped-def]
        pieces = encode_message(msg, compression, **kwargs)
        if msg.method == "moe.forward" and compression == Compression.INT4:
            last = bytearray(pieces[-1])
            last[-1] |= 0xF0  # the padding nibble of 15 elements
            pieces = [*pieces[:-1], bytes(last)]
        return pieces

    monkeypatch.setattr("engine.p2p.rpc.encode_message", corrupting)
    with pytest.raises(ExpertCallFailed) as failed:
        await asyncio.wait_for(asyncio.to_thread(lambda: expert(torch.randn(3, 5))), 30)
    print("malformed int4 request:", failed.value.code, failed.value)
    assert failed.value.code == "connection"  # the host's RPC drops a peer that sends undecodable bytes
    monkeypatch.setattr("engine.p2p.rpc.encode_message", encode_message)

    # The host is up: a fresh trainer's call goes through.
    other = await make_peer()
    again = RemoteExpert(other, host.peer_id, "ffn.0.0", loop=loop, timeout=20, wire="int4")
    out = await asyncio.wait_for(asyncio.to_thread(lambda: again(torch.randn(4, 5)).detach()), 30)
    assert out.shape == (4, 5)
    assert server.stats()["ffn.0.0"]["forward_requests"] == 2
    await server.close()
