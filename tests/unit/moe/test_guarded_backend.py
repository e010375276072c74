"""The guards through the real ExpertBackend (no sockets): refusals typed, logged with the sender and
counted, no step taken for a refused backward; the probe's rollback restores the last good state; the
server turns the refusals into their codes."""

import asyncio
import logging

import pytest
import torch

from engine.moe import (
    ExpertBackend,
    ExpertServer,
    ExpertSpec,
    GradientTooLarge,
    GuardConfig,
    OverShare,
    build,
)
from engine.moe.backend import DEFAULT_GUARD
from engine.moe.probe import Probe
from engine.p2p import CallContext, Handlers, RemoteError
from engine.wire import Kind, Message

SPEC = ExpertSpec("ffn", 8, hidden=16)


def backend(guard: GuardConfig | None, **kwargs: object) -> ExpertBackend:
    return ExpertBackend(
        "ffn.0",
        SPEC,
        device="cpu",
        seed=0,
        guard=guard,
        max_wait_s=0.0,
        **kwargs,  # type: ignore[arg-type]
    )


async def step(
    b: ExpertBackend, peer: str, aid: str, grad: torch.Tensor, x: torch.Tensor | None = None
) -> None:
    x = torch.randn(grad.shape[0], 8) if x is None else x
    await b.forward(peer, aid, x)
    await b.backward(peer, aid, grad)


def test_hosts_are_guarded_unless_told_otherwise() -> None:
    assert ExpertBackend("ffn.0", SPEC, device="cpu").guard is DEFAULT_GUARD
    assert backend(None).norms is None and backend(None).probe is None


async def test_a_scaled_gradient_is_refused_counted_logged_and_takes_no_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = backend(GuardConfig(norm_warmup=8, norm_multiple=8.0))
    for i in range(12):
        await step(b, f"honest{i % 4}", f"a{i}", 0.01 * torch.randn(4, 8))
    steps = b.stats.steps
    before = [p.detach().clone() for p in b.module.parameters()]
    caplog.set_level(logging.WARNING, "engine.moe.backend")
    with pytest.raises(GradientTooLarge) as e:
        await step(b, "attacker-peer", "bad", 1000 * 0.01 * torch.randn(4, 8))
    assert e.value.code == "grad_too_large"
    assert b.stats.grad_refused == 1 and b.stats.errors == 1 and b.stats.steps == steps
    assert all(torch.equal(p, q) for p, q in zip(before, b.module.parameters(), strict=True))
    assert "attacker-peer" in caplog.text and "refused a backward" in caplog.text
    await step(b, "honest0", "after", 0.01 * torch.randn(4, 8))  # honest work goes on
    assert b.stats.steps == steps + 1
    await b.close()


async def test_a_trainer_over_its_share_is_refused_and_counted() -> None:
    b = backend(GuardConfig(share_multiple=2.0, share_window=256))
    refused = 0
    for i in range(20):
        for h in range(6):
            await step(b, f"honest{h}", f"h{i}.{h}", 0.01 * torch.randn(2, 8))
        for r in range(4):  # four times an honest trainer's updates
            try:
                await step(b, "greedy", f"g{i}.{r}", 0.01 * torch.randn(2, 8))
            except OverShare as e:
                assert e.code == "over_share"
                refused += 1
    assert refused > 0 and b.stats.share_refused == refused
    assert b.shares is not None and b.shares._by_peer["greedy"] <= 2 * b.shares._by_peer["honest0"]
    await b.close()


async def test_a_jump_on_the_probe_rolls_the_expert_back_to_its_last_good_state() -> None:
    """Honest gradients are noise, so the outputs wander; eight steps that all push one way (with a
    large learning rate) move them several times as far: a jump, undone."""
    guard = GuardConfig(
        norm_multiple=1e9,
        clip_multiple=1e9,
        probe_rows=8,
        probe_every=4,
        jump_multiple=3.0,
        jump_warmup=4,
        jump_window=16,
    )
    b = backend(guard, lr=1e-3, max_grad_norm=None)
    probe = b.probe
    assert probe is not None
    for i in range(48):
        await step(b, f"honest{i % 4}", f"h{i}", torch.randn(4, 8))
    assert probe.good is not None and b.stats.rollbacks == 0
    direction = torch.randn(1, 8).expand(4, 8).contiguous()
    for i in range(8):
        await step(b, "crafty", f"c{i}", 50 * direction)
        if b.stats.rollbacks:
            break
    assert b.stats.rollbacks == 1
    good = {k[len("model.") :]: v for k, v in probe.good.tensors.items() if k.startswith("model.")}
    assert all(torch.equal(v, good[k]) for k, v in b.module.state_dict().items())
    await b.close()


def test_probe_rows_come_round_robin_from_trainers() -> None:
    probe = Probe(GuardConfig(probe_rows=4))
    for i in range(10):
        probe.offer("flooder", torch.full((2, 3), float(i)))
    probe.offer("quiet", torch.full((1, 3), -1.0))
    rows = probe._take_rows()
    assert rows is not None and rows.shape == (4, 3)
    assert (rows[:, 0] == -1.0).sum() == 1  # the quiet trainer's row is in, first
    assert rows[0, 0] == -1.0 and rows[1, 0] == 9.0
    assert Probe(GuardConfig(probe_rows=4))._take_rows() is None  # not enough rows yet: no probe


async def test_concurrent_backwards_see_each_others_records() -> None:
    b = backend(GuardConfig(share_window=64))
    for h in range(4):
        await step(b, f"honest{h}", f"h{h}", 0.01 * torch.randn(4, 8))
    xs = [torch.randn(4, 8) for _ in range(8)]
    await asyncio.gather(*(b.forward("greedy", f"g{i}", x) for i, x in enumerate(xs)))
    results = await asyncio.gather(
        *(b.backward("greedy", f"g{i}", 0.01 * torch.randn(4, 8)) for i in range(8)), return_exceptions=True
    )
    assert any(isinstance(r, OverShare) for r in results)
    assert any(isinstance(r, torch.Tensor) for r in results)
    await b.close()


async def test_the_server_answers_a_refusal_with_its_code() -> None:
    b = backend(GuardConfig(norm_warmup=4))
    server = ExpertServer({"ffn.0": b})
    handlers = Handlers()
    server.register(handlers)
    for i in range(8):
        await step(b, f"honest{i % 2}", f"h{i}", 0.01 * torch.randn(2, 8))
    ctx = CallContext("attacker", 1)
    fields = {"uid": "ffn.0", "aid": "x"}
    await handlers.unary["moe.forward"](
        Message(Kind.REQUEST, 1, fields=fields, tensors=[torch.randn(2, 8)]), ctx
    )
    with pytest.raises(RemoteError) as e:
        grad = Message(Kind.REQUEST, 2, fields=fields, tensors=[1e4 * torch.randn(2, 8)])
        await handlers.unary["moe.backward"](grad, ctx)
    assert e.value.code == "grad_too_large" and b.stats.grad_refused == 1
    await server.close(1.0)


async def test_a_clipped_backward_updates_less_but_returns_the_exact_input_gradient() -> None:
    b = backend(GuardConfig(norm_warmup=8, clip_multiple=2.0, norm_multiple=8.0))
    for i in range(12):
        await step(b, f"honest{i % 4}", f"a{i}", 0.01 * torch.randn(4, 8))
    assert b.norms is not None and b.norms.typical is not None
    grad = torch.randn(4, 8)
    grad *= 4 * b.norms.typical / float(grad.square().sum(1).mean().sqrt())  # 4 x typical: clipped to 2 x
    x = torch.randn(4, 8)
    ref = build(SPEC)
    ref.load_state_dict(b.module.state_dict())
    await b.forward("big", "clip", x)
    got = await b.backward("big", "clip", grad)
    x_local = x.clone().requires_grad_(True)
    ref(x_local).backward(grad)
    assert b.stats.grad_clipped == 1 and b.stats.grad_refused == 0
    assert torch.allclose(got, x_local.grad, atol=1e-5)  # type: ignore[arg-type]
    await b.close()
