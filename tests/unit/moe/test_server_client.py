"""ExpertServer handlers and RemoteExpert through an in-process fake peer: the wire codec, no sockets."""

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.moe import ExpertCallFailed, ExpertServer, ExpertSpec, LoopThread, RemoteExpert, build
from engine.p2p import CallContext, Handlers, RemoteError
from engine.wire import Compression, Kind, Message, decode_message, encode_message_bytes

SPEC = ExpertSpec("ffn", 8, hidden=16)


class FakePeer:
    """Peer.call's contract, with messages encoded and decoded as the real transport does."""

    def __init__(self, handlers: Handlers, peer_id: str = "trainer") -> None:
        self.handlers = handlers
        self.peer_id = peer_id
        self.sent_bytes = 0

    async def call(
        self,
        peer_id: str,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = 30.0,
        compression: Compression = Compression.NONE,
    ) -> Message:
        data = encode_message_bytes(
            Message(Kind.REQUEST, 1, method, fields or {}, list(tensors)), compression
        )
        self.sent_bytes += len(data)
        async with asyncio.timeout(timeout):
            reply = await self.handlers.unary[method](
                decode_message(bytearray(data)), CallContext(self.peer_id, 1)
            )
        return decode_message(bytearray(encode_message_bytes(reply, reply.compression)))


def make_server(tmp_path: Path | None = None, **backend: Any) -> ExpertServer:
    specs = {"ffn.0.1": SPEC, "ffn.0.2": SPEC}
    return ExpertServer.create(
        specs, device="cpu", checkpoint_dir=tmp_path, backend_options={"seed": 0, **backend}
    )


async def test_handlers_reply_in_float16_and_type_their_errors() -> None:
    server = make_server()
    handlers = Handlers()
    server.register(handlers)
    peer = FakePeer(handlers)
    x = torch.randn(4, 8)
    reply = await peer.call("host", "moe.forward", {"uid": "ffn.0.1", "aid": "a"}, [x])
    ref = build(SPEC)
    ref.load_state_dict(server.experts["ffn.0.1"].module.state_dict())
    assert torch.allclose(reply.tensors[0], ref(x), atol=1e-2, rtol=1e-3)
    info = await peer.call("host", "moe.info", {"uid": "ffn.0.2"})
    assert ExpertSpec.from_fields(info.fields) == SPEC and info.fields["input_shape"] == [8]
    for fields, tensors, code in [
        ({"uid": "ffn.9.9", "aid": "a"}, [x], "unknown_expert"),
        ({"uid": "ffn.0.1", "aid": "a"}, [torch.randn(4, 3)], "bad_input"),
        ({"uid": "ffn.0.1", "aid": "a"}, [torch.full((4, 8), float("nan"))], "bad_input"),
        ({"uid": "ffn.0.1", "aid": 5}, [x], "bad_input"),
        ({"uid": "ffn.0.1", "aid": "a"}, [], "bad_input"),
        ({"uid": "ffn.0.1", "aid": "never"}, [x], "inputs_evicted"),
    ]:
        method = "moe.backward" if code == "inputs_evicted" else "moe.forward"
        with pytest.raises(RemoteError) as err:
            await peer.call("host", method, fields, tensors)
        assert err.value.code == code
    stats = server.stats()["ffn.0.1"]
    assert stats["forward_requests"] == 1 and stats["forward_samples"] == 4 and stats["errors"] >= 3
    await server.close()
    with pytest.raises(RemoteError) as err:
        await peer.call("host", "moe.forward", {"uid": "ffn.0.1", "aid": "b"}, [x])
    assert err.value.code == "unavailable"


async def test_checkpoints_on_close_and_restore_on_start(tmp_path: Path) -> None:
    server = make_server(tmp_path, lr=0.05)
    handlers = Handlers()
    server.register(handlers)
    await server.start()
    peer = FakePeer(handlers)
    x = torch.randn(4, 8)
    await peer.call("host", "moe.forward", {"uid": "ffn.0.1", "aid": "a"}, [x])
    await peer.call("host", "moe.backward", {"uid": "ffn.0.1", "aid": "a"}, [torch.randn(4, 8)])
    trained = {k: v.clone() for k, v in server.experts["ffn.0.1"].module.state_dict().items()}
    await server.close()
    assert (tmp_path / "ffn.0.1").is_dir() and (tmp_path / "ffn.0.2").is_dir()
    again = make_server(tmp_path, seed=123)
    await again.start()
    restored = again.experts["ffn.0.1"]
    assert restored.stats.steps == 1
    for k, v in restored.module.state_dict().items():
        assert torch.equal(v, trained[k])
    await again.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    with LoopThread() as lt:
        yield lt


def test_remote_expert_autograd_matches_local(loop_thread: LoopThread) -> None:
    server = make_server(lr=0.0)
    handlers = Handlers()
    server.register(handlers)
    peer = FakePeer(handlers)
    expert = RemoteExpert(peer, "host", "ffn.0.1", loop=loop_thread, timeout=10)  # type: ignore[arg-type]
    ref = build(SPEC)
    ref.load_state_dict(server.experts["ffn.0.1"].module.state_dict())
    x = torch.randn(5, 8, requires_grad=True)
    w = torch.randn(5, 8)
    (expert(x) * w).sum().backward()
    xl = x.detach().half().float().requires_grad_(True)  # what the host saw: float16 on the wire
    (ref(xl) * w).sum().backward()
    assert x.grad is not None and xl.grad is not None
    assert torch.allclose(x.grad, xl.grad, atol=2e-2, rtol=1e-2)
    assert expert.resends == 0
    assert expert.info() == SPEC
    loop_thread.run(server.close(), 10)


def test_remote_expert_resends_inputs_after_eviction(loop_thread: LoopThread) -> None:
    server = make_server(lr=0.0)
    handlers = Handlers()
    server.register(handlers)
    peer = FakePeer(handlers)
    expert = RemoteExpert(peer, "host", "ffn.0.2", loop=loop_thread, timeout=10)  # type: ignore[arg-type]
    x = torch.randn(3, 8, requires_grad=True)
    y = expert(x)
    backend = server.experts["ffn.0.2"]
    backend.cache.clear()  # as if the budget or the TTL had evicted them (inputs and graph)
    assert backend.graphs is not None
    backend.graphs.clear()
    y.sum().backward()
    assert expert.resends == 1 and x.grad is not None and x.grad.shape == x.shape
    # A failure that is not an eviction is not retried: it surfaces with the host's code.
    with pytest.raises(ExpertCallFailed) as err:
        expert(torch.full((2, 8), float("inf")))
    assert err.value.code == "bad_input" and "ffn.0.2" in str(err.value)
    loop_thread.run(server.close(), 10)


def test_loop_thread_times_out_and_refuses_its_own_thread(loop_thread: LoopThread) -> None:
    with pytest.raises(TimeoutError):
        loop_thread.run(asyncio.sleep(5), timeout=0.1)

    async def nested() -> None:
        loop_thread.run(asyncio.sleep(0), timeout=1)

    with pytest.raises(RuntimeError, match="own loop"):
        loop_thread.run(nested(), timeout=5)
    assert loop_thread.run(asyncio.sleep(0, result=7), timeout=5) == 7


def test_int8_wire_halves_the_bytes_and_stays_within_its_bound(loop_thread: LoopThread) -> None:
    """``wire="int8"``: requests and replies both travel 8-bit; the result is the float16 call's within
    the quantizer's bound, in about half the bytes."""
    spec = ExpertSpec("ffn", 256, hidden=512)
    server = ExpertServer.create({"ffn.0.1": spec}, device="cpu", backend_options={"seed": 0, "lr": 0.0})
    handlers = Handlers()
    server.register(handlers)
    x = torch.randn(32, 256)
    w = torch.randn(32, 256)
    results = {}
    for wire in ("float16", "int8"):
        peer = FakePeer(handlers)
        expert = RemoteExpert(peer, "host", "ffn.0.1", loop=loop_thread, timeout=10, wire=wire)  # type: ignore[arg-type]
        xi = x.clone().requires_grad_(True)
        out = expert(xi)
        (out * w).sum().backward()
        assert xi.grad is not None
        results[wire] = (out.detach(), xi.grad, peer.sent_bytes)
    out16, grad16, sent16 = results["float16"]
    out8, grad8, sent8 = results["int8"]
    # Half a quantization step of the block's absmax, for the inputs and again for the outputs.
    assert float((out8 - out16).abs().max()) < 2 * float(out16.abs().max()) / 127
    assert float((grad8 - grad16).norm() / grad16.norm()) < 0.02
    assert sent8 < 0.55 * sent16  # the requests; replies shrink alike (FakePeer counts requests)
    loop_thread.run(server.close(), 10)


def test_int4_wire_quarters_float16_bytes_and_stays_within_its_bound(loop_thread: LoopThread) -> None:
    """``wire="int4"``: the host accepts it and answers 4-bit; the result is the float16 call's within
    twice the 4-bit step (inputs, then outputs), in under a third of float16's bytes."""
    spec = ExpertSpec("ffn", 256, hidden=512)
    server = ExpertServer.create({"ffn.0.1": spec}, device="cpu", backend_options={"seed": 0, "lr": 0.0})
    handlers = Handlers()
    server.register(handlers)
    x, w = torch.randn(32, 256), torch.randn(32, 256)
    results = {}
    for wire in ("float16", "int4"):
        peer = FakePeer(handlers)
        expert = RemoteExpert(peer, "host", "ffn.0.1", loop=loop_thread, timeout=10, wire=wire)  # type: ignore[arg-type]
        xi = x.clone().requires_grad_(True)
        out = expert(xi)
        (out * w).sum().backward()
        assert xi.grad is not None
        results[wire] = (out.detach(), xi.grad, peer.sent_bytes)
    out16, grad16, sent16 = results["float16"]
    out4, grad4, sent4 = results["int4"]
    assert 0 < float((out4 - out16).abs().max()) < 2 * float(out16.abs().max()) / 14
    assert 0 < float((grad4 - grad16).norm() / grad16.norm()) < 0.3
    assert sent4 < 0.3 * sent16
    reply = Message(Kind.REQUEST, 1, "moe.forward", {"uid": "ffn.0.1", "aid": "a", "wire": "int4"})
    assert server._reply_compression(reply) == Compression.INT4
    loop_thread.run(server.close(), 10)


async def test_unknown_wire_format_is_refused_before_any_compute() -> None:
    server = make_server()
    handlers = Handlers()
    server.register(handlers)
    peer = FakePeer(handlers)
    with pytest.raises(RemoteError) as err:
        await peer.call(
            "host", "moe.forward", {"uid": "ffn.0.1", "aid": "a", "wire": "int3"}, [torch.randn(2, 8)]
        )
    assert err.value.code == "bad_input" and "int3" in str(err.value)
    assert server.stats()["ffn.0.1"]["forward_requests"] == 0
    with pytest.raises(ValueError, match="unknown wire format"):
        RemoteExpert(peer, "host", "ffn.0.1", loop=None, wire="int3")  # type: ignore[arg-type]
    await server.close()
