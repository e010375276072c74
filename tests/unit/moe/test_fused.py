"""Many experts' backward batches as one (engine/moe/fused.py) through one worker hand-over
(engine/moe/dispatch.py): the same gradients, clipping and Adam steps as each expert alone, in fewer
calls; a failure in the group still fails only its own expert."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from engine.moe import ExpertBackend, ExpertSpec
from engine.moe.batching import TaskPool
from engine.moe.dispatch import dispatcher_for
from engine.moe.fused import backward_together, step_together

SPEC = ExpertSpec("ffn", 8, hidden=16)


def pair(
    uid: str, seed: int, executor: ThreadPoolExecutor, **options: Any
) -> tuple[ExpertBackend, ExpertBackend]:
    """Two identical experts: one stepped with the others, one alone."""
    make = lambda: ExpertBackend(uid, SPEC, device="cpu", seed=seed, executor=executor, **options)  # noqa: E731
    return make(), make()


async def test_a_group_step_is_each_experts_own_step() -> None:
    executor = ThreadPoolExecutor(1)
    pairs = [pair(f"ffn.{i}", i, executor) for i in range(4)]
    for step in range(3):  # Adam's state builds up over several steps
        xs = [torch.randn(3 + i, 8) * (10.0 if i == 1 else 1.0) for i in range(4)]  # expert 1 clips
        gs = [torch.randn_like(x) * (50.0 if i == 1 else 1.0) for i, x in enumerate(xs)]
        for (together, alone), x in zip(pairs, xs, strict=True):
            await together.forward("p", f"a{step}", x)
            await alone.forward("p", f"a{step}", x)
        # the group: every expert's backward request in one call, as the dispatcher makes it
        jobs = []
        for (together, _), g in zip(pairs, gs, strict=True):
            key = together._key("p", f"a{step}")
            jobs.append((together, [(g, together.cache.pop(key), together.graphs.pop(key))]))  # type: ignore[union-attr]
        grouped = backward_together(jobs)
        for (_, alone), g, (grad_in,) in zip(pairs, gs, (r[0] for r in grouped), strict=True):
            expected = await alone.backward("p", f"a{step}", g)
            torch.testing.assert_close(grad_in, expected)
    for together, alone in pairs:
        assert together.stats.steps == alone.stats.steps == 3
        for p, q in zip(together.module.parameters(), alone.module.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        state = together.optimizer.state_dict()["state"]
        for index, s in alone.optimizer.state_dict()["state"].items():
            torch.testing.assert_close(state[index]["exp_avg_sq"], s["exp_avg_sq"])
            assert float(state[index]["step"]) == float(s["step"]) == 3.0
    executor.shutdown()


def test_each_expert_is_clipped_to_its_own_norm() -> None:
    executor = ThreadPoolExecutor(1)
    big, small = (
        ExpertBackend(f"ffn.{i}", SPEC, device="cpu", seed=i, executor=executor, lr=0.0) for i in (0, 1)
    )
    for backend, scale in ((big, 1e3), (small, 1e-3)):
        for p in backend.module.parameters():
            p.grad = torch.full_like(p, scale)
    before = [p.grad.clone() for p in small.module.parameters()]  # type: ignore[union-attr]
    step_together([big, small])
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in big.module.parameters()])
    )  # type: ignore[arg-type]
    assert norm == pytest.approx(1.0, rel=1e-4)  # max_grad_norm 1.0
    for p, g in zip(small.module.parameters(), before, strict=True):
        assert torch.equal(p.grad, g)  # a small expert's gradient is not scaled by the big one's
    executor.shutdown()


def test_an_optimizer_that_is_not_plain_adam_steps_on_its_own() -> None:
    executor = ThreadPoolExecutor(1)
    plain = ExpertBackend("ffn.0", SPEC, device="cpu", seed=0, executor=executor)
    other = ExpertBackend("ffn.1", SPEC, device="cpu", seed=1, executor=executor)
    other.optimizer = torch.optim.Adam(other.module.parameters(), lr=1e-3, amsgrad=True)
    reference = torch.optim.Adam(
        [p.detach().clone().requires_grad_(True) for p in other.module.parameters()], lr=1e-3, amsgrad=True
    )
    for backend in (plain, other):
        for p in backend.module.parameters():
            p.grad = torch.ones_like(p)
    for p in reference.param_groups[0]["params"]:
        p.grad = torch.ones_like(p) / torch.linalg.vector_norm(
            torch.ones(sum(q.numel() for q in other.module.parameters()))
        )
    step_together([plain, other])
    reference.step()
    for p, q in zip(other.module.parameters(), reference.param_groups[0]["params"], strict=True):
        torch.testing.assert_close(p, q)
    assert "max_exp_avg_sq" in other.optimizer.state[next(iter(other.module.parameters()))]
    executor.shutdown()


async def test_ready_batches_share_one_worker_call_and_fail_alone() -> None:
    executor = ThreadPoolExecutor(1)
    calls: list[int] = []

    def together(jobs: list[tuple[Any, list[tuple[Any, ...]]]]) -> list[list[tuple[Any, ...]]]:
        calls.append(len(jobs))
        if any(owner == "bad" for owner, _ in jobs):
            raise RuntimeError("one member is broken")
        return [[(a[0] * 2,) for a in args] for _, args in jobs]

    def alone(requests: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if requests[0][0].item() < 0:
            raise ValueError("bad rows")
        return [(r[0] * 2,) for r in requests]

    owners = ["a", "b", "c"]
    pools = [
        TaskPool(o, alone, executor, max_wait_s=0.0, batched=False, together=together, owner=o)
        for o in owners
    ]
    outs = await asyncio.gather(*(p.submit(torch.full((1,), float(i + 1))) for i, p in enumerate(pools)))
    assert [float(o[0]) for o in outs] == [2.0, 4.0, 6.0]
    dispatcher = dispatcher_for(executor)
    assert calls == [3] and dispatcher.calls == 1 and dispatcher.jobs == 3

    # A group with a broken member: the group is run again member by member; only that one fails.
    bad = TaskPool("bad", alone, executor, max_wait_s=0.0, batched=False, together=together, owner="bad")
    results = await asyncio.gather(
        pools[0].submit(torch.full((1,), 5.0)), bad.submit(torch.full((1,), -1.0)), return_exceptions=True
    )
    assert float(results[0][0]) == 10.0  # type: ignore[index]
    assert isinstance(results[1], ValueError)
    for p in [*pools, bad]:
        await p.drain(5)
    executor.shutdown()
