"""A host Peer serving experts and a trainer Peer calling them over real aiortc on loopback.

The trainer's torch code is synchronous, so it runs in a worker thread (``asyncio.to_thread``) and
reaches the trainer Peer, which lives on the test's event loop, through ``LoopThread.attach``.
"""

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
from torch import nn

from engine.moe import (
    Architecture,
    ExpertCallFailed,
    ExpertServer,
    ExpertSpec,
    LoopThread,
    RemoteExpert,
    build,
    register,
)
from engine.p2p import Handlers, Peer
from tests.integration.conftest import MakePeer

T = TypeVar("T")
SPEC = ExpertSpec("ffn", 16, hidden=32)


class _Slow(nn.Module):
    """A test-only expert that takes its time, so a host can die while a request is in flight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(1.5)
        out: torch.Tensor = self.lin(x)
        return out


register("slow_test", Architecture(lambda s: _Slow(s.dim), lambda s: (s.dim,)))


async def host_and_trainer(
    make_peer: MakePeer, specs: dict[str, ExpertSpec], **backend: object
) -> tuple[ExpertServer, Peer, Peer]:
    server = ExpertServer.create(specs, device="cpu", backend_options={"seed": 0, **backend})
    handlers = Handlers()
    server.register(handlers)
    host = await make_peer(handlers)
    trainer = await make_peer()
    return server, host, trainer


async def in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


async def test_forward_backward_over_the_network_match_local(make_peer: MakePeer) -> None:
    server, host, trainer = await host_and_trainer(make_peer, {"ffn.0.0": SPEC}, lr=0.0)
    expert = RemoteExpert(
        trainer, host.peer_id, "ffn.0.0", loop=LoopThread.attach(asyncio.get_running_loop())
    )
    ref = build(SPEC)
    ref.load_state_dict(server.experts["ffn.0.0"].module.state_dict())
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(32, 16)

    def remote_step() -> torch.Tensor:
        y = expert(x)
        (y * w).sum().backward()
        return y.detach()

    y = await in_thread(remote_step)
    xl = x.detach().clone().requires_grad_(True)
    yl = ref(xl)
    (yl * w).sum().backward()
    assert x.grad is not None and xl.grad is not None
    assert torch.allclose(y, yl.detach(), atol=1e-2, rtol=1e-2)  # float16 on the wire, both ways
    assert torch.allclose(x.grad, xl.grad, atol=2e-2, rtol=1e-2)
    assert expert.resends == 0
    assert await in_thread(expert.info) == SPEC
    stats = server.stats()["ffn.0.0"]
    assert stats["forward_samples"] == 32 and stats["backward_samples"] == 32 and stats["errors"] == 0
    await server.close()


async def test_a_few_sgd_steps_reduce_the_loss(make_peer: MakePeer) -> None:
    server, host, trainer = await host_and_trainer(make_peer, {"ffn.0.0": SPEC, "ffn.0.1": SPEC}, lr=1e-2)
    loop = LoopThread.attach(asyncio.get_running_loop())
    experts = [RemoteExpert(trainer, host.peer_id, f"ffn.0.{i}", loop=loop, timeout=20) for i in range(2)]
    torch.manual_seed(0)
    dense = nn.Linear(16, 16)
    opt = torch.optim.SGD(dense.parameters(), lr=0.05)
    x = torch.randn(64, 16)
    target = torch.randn(64, 16) * 0.5

    def train(steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            h = dense(x)
            y = experts[0](h) + experts[1](h)
            loss = nn.functional.mse_loss(y, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    losses = await in_thread(lambda: train(8))
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(b.stats.steps == 8 for b in server.experts.values())  # the hosts trained too
    await server.close()


async def test_host_dying_mid_request_fails_within_the_timeout(make_peer: MakePeer) -> None:
    server, host, trainer = await host_and_trainer(make_peer, {"slow.0": ExpertSpec("slow_test", 8)})
    expert = RemoteExpert(
        trainer, host.peer_id, "slow.0", loop=LoopThread.attach(asyncio.get_running_loop()), timeout=6
    )
    await trainer.connect(host.peer_id)  # connected first: what is timed is the request, not the dial
    started = time.monotonic()
    call = asyncio.ensure_future(in_thread(lambda: expert(torch.randn(2, 8))))
    await asyncio.sleep(0.5)
    assert server.stats()["slow.0"]["forward_requests"] == 0  # still in flight on the host
    await host.stop()
    with pytest.raises(ExpertCallFailed) as err:
        await call
    elapsed = time.monotonic() - started
    assert err.value.code in ("connection", "timeout")
    assert "slow.0" in str(err.value)
    assert elapsed < 6 + 2.5
    await server.close(drain_timeout=3)
