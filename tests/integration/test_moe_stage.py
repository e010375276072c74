"""A stage expert (causal transformer blocks over whole sequences) served over real aiortc on loopback:
forward and backward through the real client and host agree with the same stage in process."""

import asyncio

import torch

from engine.moe import ExpertServer, ExpertSpec, LoopThread, RemoteExpert, build
from engine.p2p import Handlers
from tests.integration.conftest import MakePeer

SPEC = ExpertSpec("stage", 32, hidden=64, heads=4, seq_len=16, depth=3)


async def test_a_stage_forward_and_backward_over_the_network_match_local(make_peer: MakePeer) -> None:
    server = ExpertServer.create({"stage.0.0": SPEC}, device="cpu", backend_options={"seed": 0, "lr": 0.0})
    handlers = Handlers()
    server.register(handlers)
    host = await make_peer(handlers)
    trainer = await make_peer()
    expert = RemoteExpert(
        trainer, host.peer_id, "stage.0.0", loop=LoopThread.attach(asyncio.get_running_loop()), timeout=20
    )
    ref = build(SPEC)
    ref.load_state_dict(server.experts["stage.0.0"].module.state_dict())
    torch.manual_seed(1)
    x = torch.randn(4, 16, 32, requires_grad=True)  # 4 samples, each a sequence of 16 tokens
    w = torch.randn(4, 16, 32)

    def remote_step() -> torch.Tensor:
        y = expert(x)
        (y * w).sum().backward()
        return y.detach()

    try:
        y = await asyncio.to_thread(remote_step)
        xl = x.detach().clone().requires_grad_(True)
        yl = ref(xl)
        (yl * w).sum().backward()
        assert x.grad is not None and xl.grad is not None
        assert y.shape == (4, 16, 32) and x.grad.shape == (4, 16, 32)
        assert torch.allclose(y, yl.detach(), atol=2e-2, rtol=1e-2)  # float16 on the wire, both ways
        assert torch.allclose(x.grad, xl.grad, atol=3e-2, rtol=2e-2)
        assert (x.grad[:, :8] - xl.grad[:, :8]).abs().max() < 3e-2  # causal: early tokens get later grads
        assert await asyncio.to_thread(expert.info) == SPEC  # depth travels in moe.info
        stats = server.stats()["stage.0.0"]
        assert stats["forward_samples"] == 4 and stats["backward_samples"] == 4 and stats["errors"] == 0
        assert stats["recomputed_samples"] == 0  # the kept graph served the backward
    finally:
        await server.close()
