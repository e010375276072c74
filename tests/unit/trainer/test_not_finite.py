"""No credit for nothing: a step whose loss or gradients are not finite asks no expert for a backward
pass, takes no optimizer step, withholds its receipts and stops the run with a sentence naming it."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
import torch

from engine.moe import ExpertServer, LoopThread
from engine.moe.layer_calls import CallRecord
from engine.trainer import DigitsDMoE, StepNotFinite, Trainer, TrainerConfig, TrainerNode
from engine.trainer.model import Digits
from tests.unit.moe.test_host_calls import HOSTS, SPEC, CountingSwarm, mixture

CONFIG = TrainerConfig(dim=8, grid=(3, 3), batch_size=16)


@pytest.fixture
def swarm() -> Iterator[tuple[LoopThread, CountingSwarm]]:
    servers = {
        host: ExpertServer.create(
            {u: SPEC for u, h in HOSTS.items() if h == host}, device="cpu", backend_options={"lr": 0.0}
        )
        for host in ("host0", "host1")
    }
    with LoopThread() as lt:
        yield lt, CountingSwarm(servers)


def _data(n: int = 64) -> Digits:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)
    return Digits(x, y, x[:8], y[:8])


def _backward_calls(counting: CountingSwarm) -> int:
    return sum(n for (_, method), n in counting.methods.items() if "backward" in method)


def test_a_nan_loss_asks_no_expert_for_a_backward_pass(swarm: tuple[LoopThread, CountingSwarm]) -> None:
    lt, counting = swarm
    model = DigitsDMoE(mixture(lt, counting), 8)
    settled: list[bool] = []
    trainer = Trainer(model, _data(), CONFIG, settle=settled.append)
    assert trainer.step() is not None and _backward_calls(counting) > 0  # a good step first
    with torch.no_grad():
        model.head[1].bias[3] = math.nan
    before = _backward_calls(counting)
    with pytest.raises(StepNotFinite, match=r"^step 2: the loss is nan; training stopped there") as e:
        trainer.step()
    assert (e.value.step, e.value.cause) == (2, "the loss is nan")
    assert _backward_calls(counting) == before
    assert settled == [True, False]


def test_a_non_finite_gradient_takes_no_optimizer_step(swarm: tuple[LoopThread, CountingSwarm]) -> None:
    lt, counting = swarm
    model = DigitsDMoE(mixture(lt, counting), 8)
    model.head[1].weight.register_hook(lambda g: g * math.inf)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settled: list[bool] = []
    trainer = Trainer(model, _data(), CONFIG, settle=settled.append)
    with pytest.raises(StepNotFinite, match=r"^step 1: the gradient of head.1.weight is not finite"):
        trainer.step()
    assert settled == [False]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_non_finite_gradients_reach_no_expert(swarm: tuple[LoopThread, CountingSwarm]) -> None:
    lt, counting = swarm
    moe = mixture(lt, counting)
    x = torch.randn(8, 8, requires_grad=True)
    y = moe(x)
    (y * math.nan).sum().backward()
    assert _backward_calls(counting) == 0
    assert x.grad is not None and not bool(torch.isfinite(x.grad).any())


def _record(i: int, backward: bool = False) -> CallRecord:
    return CallRecord("ffn.0.0", "ab" * 20, 4, backward, True, "", time.time(), 0.01, receipt_id=f"{i:032x}")


async def _observe(node: TrainerNode, records: list[CallRecord]) -> None:
    for r in records:
        node.observe(r)


def test_the_node_holds_a_steps_receipts_until_the_step_is_settled() -> None:
    with LoopThread() as lt:
        node = TrainerNode("http://127.0.0.1:9", "t", loop=lt)
        node.hold_steps = True
        lt.run(_observe(node, [_record(1), _record(2, True)]), 5)
        assert node.receipts.stats.queued == 0
        node.settle_step(False)
        assert (node.receipts.stats.withheld, node.receipts.stats.queued) == (2, 0)
        lt.run(_observe(node, [_record(3)]), 5)
        node.settle_step(True)
        assert (node.receipts.stats.withheld, node.receipts.stats.queued) == (2, 1)
        node.hold_steps = False
        lt.run(_observe(node, [_record(4)]), 5)  # not held: straight to the book
        assert node.receipts.stats.queued == 2
