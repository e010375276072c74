"""RemoteMixtureOfExperts against in-process hosts: renormalised softmax, dead and slow experts skipped."""

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from engine.moe import (
    ExpertServer,
    ExpertSpec,
    LoopThread,
    NotEnoughExperts,
    RemoteMixtureOfExperts,
    StaticExpertFinder,
    build,
)
from engine.p2p import ConnectionLost, Handlers
from engine.wire import Compression, Message
from tests.unit.moe.test_server_client import FakePeer

SPEC = ExpertSpec("ffn", 8, hidden=16)
UIDS = [f"ffn.{i}.{j}" for i in range(2) for j in range(2)]


class Swarm:
    """Hosts by peer id; ``dead`` hosts fail at once, ``slow`` ones never answer."""

    peer_id = "7e" * 20  # the trainer's: receipt ids derive from it

    def __init__(self, servers: dict[str, ExpertServer]) -> None:
        self.peers = {}
        for host, server in servers.items():
            handlers = Handlers()
            server.register(handlers)
            self.peers[host] = FakePeer(handlers)
        self.dead: set[str] = set()
        self.slow: set[str] = set()
        self.garbage: dict[str, str] = {}  # host -> "nan" or "shape": a host returning rubbish
        self.garbage_replies = 0

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
        if peer_id in self.dead:
            raise ConnectionLost("host gone")
        if peer_id in self.slow:
            await asyncio.sleep(timeout)
        reply = await self.peers[peer_id].call(peer_id, method, fields, tensors, timeout=timeout)
        kind = self.garbage.get(peer_id)
        if kind is not None and reply.tensors:
            self.garbage_replies += 1
            t = reply.tensors[0]
            reply.tensors = [torch.full_like(t, float("nan")) if kind == "nan" else t[:, :-1]]
        return reply


@pytest.fixture
def setup() -> Iterator[tuple[LoopThread, Swarm, dict[str, ExpertServer]]]:
    servers = {
        f"host{i}": ExpertServer.create({UIDS[i]: SPEC}, device="cpu", backend_options={"seed": i, "lr": 0.0})
        for i in range(4)
    }
    with LoopThread() as lt:
        yield lt, Swarm(servers), servers


def layer(lt: LoopThread, swarm: Swarm, **kw: Any) -> RemoteMixtureOfExperts:
    finder = StaticExpertFinder({uid: f"host{i}" for i, uid in enumerate(UIDS)})
    torch.manual_seed(0)
    return RemoteMixtureOfExperts(
        swarm,  # type: ignore[arg-type]
        finder,
        loop=lt,
        in_features=8,
        grid_size=(2, 2),
        uid_prefix="ffn",
        **{"k_best": 4, "k_min": 1, "grace_s": 0.2, "timeout": 3.0, **kw},
    )


def reference(
    moe: RemoteMixtureOfExperts, servers: dict[str, ExpertServer], x: torch.Tensor, alive: list[int]
) -> torch.Tensor:
    logits = []
    outs = []
    for i in alive:
        a, b = (int(c) for c in UIDS[i].split(".")[1:])
        logits.append(moe.gates[0](x)[:, a] + moe.gates[1](x)[:, b])
        module = build(SPEC)
        module.load_state_dict(servers[f"host{i}"].experts[UIDS[i]].module.state_dict())
        outs.append(module(x.half().float()))
    w = torch.softmax(torch.stack(logits, 1), 1)
    return (w.unsqueeze(-1) * torch.stack(outs, 1)).sum(1)


def test_all_alive_matches_local_mixture(setup: tuple[LoopThread, Swarm, dict[str, ExpertServer]]) -> None:
    lt, swarm, servers = setup
    moe = layer(lt, swarm)
    x = torch.randn(6, 8, requires_grad=True)
    y = moe(x)
    xl = x.detach().clone().requires_grad_(True)
    yl = reference(moe, servers, xl, [0, 1, 2, 3])
    assert torch.allclose(y, yl, atol=2e-2, rtol=1e-2)
    y.square().sum().backward()
    yl.square().sum().backward()
    assert x.grad is not None and xl.grad is not None
    assert torch.allclose(x.grad, xl.grad, atol=5e-2, rtol=5e-2)
    assert all(p.grad is not None for p in moe.gates.parameters())


def test_dead_and_slow_experts_are_skipped(setup: tuple[LoopThread, Swarm, dict[str, ExpertServer]]) -> None:
    lt, swarm, servers = setup
    swarm.dead.add("host1")
    swarm.slow.add("host3")
    moe = layer(lt, swarm)
    x = torch.randn(5, 8, requires_grad=True)
    y = moe(x)  # waits for k_min, then the grace period, not for the slow host's timeout
    assert torch.allclose(y, reference(moe, servers, x.detach(), [0, 2]), atol=2e-2, rtol=1e-2)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert servers["host0"].stats()[UIDS[0]]["backward_requests"] == 1


def test_too_few_answers_raise(setup: tuple[LoopThread, Swarm, dict[str, ExpertServer]]) -> None:
    lt, swarm, _ = setup
    swarm.dead.update({"host0", "host1", "host2"})
    with pytest.raises(NotEnoughExperts):
        layer(lt, swarm, k_min=2)(torch.randn(3, 8))


@pytest.mark.parametrize("kind", ["nan", "shape"])
def test_hosts_returning_garbage_are_skipped(
    setup: tuple[LoopThread, Swarm, dict[str, ExpertServer]], kind: str
) -> None:
    lt, swarm, servers = setup
    swarm.garbage["host2"] = kind
    moe = layer(lt, swarm)
    x = torch.randn(5, 8, requires_grad=True)
    y = moe(x)
    assert swarm.garbage_replies >= 1  # the fault really happened
    assert torch.allclose(y, reference(moe, servers, x.detach(), [0, 1, 3]), atol=2e-2, rtol=1e-2)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
