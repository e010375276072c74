"""ExpertBackend without sockets: batching, numerics against local torch, steps, checks, eviction."""

import asyncio

import pytest
import torch

from engine.moe import ActivationCache, BadInput, ExpertBackend, ExpertSpec, InputsEvicted, build

SPEC = ExpertSpec("ffn", 8, hidden=16)


def backend(**kwargs: object) -> ExpertBackend:
    return ExpertBackend("ffn.0", SPEC, device="cpu", seed=0, **kwargs)  # type: ignore[arg-type]


def local_copy(b: ExpertBackend) -> torch.nn.Module:
    module = build(b.spec)
    module.load_state_dict(b.module.state_dict())
    return module


async def test_concurrent_requests_coalesce_into_one_batch() -> None:
    b = backend(max_batch_size=64, max_wait_s=0.2)
    xs = [torch.randn(n, 8) for n in (1, 3, 5, 7)]
    outs = await asyncio.gather(*(b.forward("p", f"a{i}", x) for i, x in enumerate(xs)))
    assert b.forward_pool.batches == 1 and b.forward_pool.batch_sizes == [16]
    ref = local_copy(b)
    for x, out in zip(xs, outs, strict=True):
        assert torch.allclose(out, ref(x), atol=1e-6)
    assert b.stats.forward_requests == 4 and b.stats.forward_samples == 16
    await b.close()


async def test_full_batch_starts_at_once_and_max_wait_is_respected() -> None:
    b = backend(max_batch_size=4, max_wait_s=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(b.forward("p", f"a{i}", torch.randn(2, 8)) for i in range(2)))
    assert loop.time() - started < 0.25  # 4 samples: full, no waiting
    started = loop.time()
    await b.forward("p", "lone", torch.randn(1, 8))
    waited = loop.time() - started
    assert 0.25 <= waited < 1.0  # a lone request waits about max_wait, not forever
    many = await asyncio.gather(*(b.forward("p", f"m{i}", torch.randn(3, 8)) for i in range(3)))
    assert len(many) == 3 and all(s <= 4 for s in b.forward_pool.batch_sizes)
    await b.close()


async def test_forward_backward_match_local_autograd_and_step_applies() -> None:
    b = backend(lr=1e-2, max_grad_norm=None)
    ref = local_copy(b)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = torch.randn(6, 8, dtype=torch.float64).float()
    grad_out = torch.randn(6, 8)
    out = await b.forward("peer", "act", x)
    x_local = x.clone().requires_grad_(True)
    y = ref(x_local)
    assert torch.allclose(out, y.detach(), atol=1e-6)
    before = [p.detach().clone() for p in b.module.parameters()]
    grad_in = await b.backward("peer", "act", grad_out)
    y.backward(grad_out)
    assert x_local.grad is not None
    assert torch.allclose(grad_in, x_local.grad, atol=1e-6)
    ref_opt.step()
    assert b.stats.steps == 1 and b.stats.backward_samples == 6
    for p, q, old in zip(b.module.parameters(), ref.parameters(), before, strict=True):
        assert not torch.equal(p, old)  # the step moved the weights...
        assert torch.allclose(p, q, atol=1e-6)  # ...exactly as a local Adam step would
    await b.close()


async def test_gradient_clipping_bounds_the_update() -> None:
    b = backend(lr=1.0, max_grad_norm=1e-3)
    await b.forward("p", "a", torch.randn(4, 8))
    await b.backward("p", "a", torch.full((4, 8), 1e3))
    grads = [p.grad for p in b.module.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= 1e-3 * 1.01
    await b.close()


async def test_transformer_backward_matches_local() -> None:
    spec = ExpertSpec("transformer", 8, hidden=16, heads=2)
    b = ExpertBackend("tf.1", spec, device="cpu", seed=1, lr=0.0)
    ref = build(spec)
    ref.load_state_dict(b.module.state_dict())
    x = torch.randn(2, 5, 8)
    g = torch.randn(2, 5, 8)
    out = await b.forward("p", "t", x)
    xl = x.clone().requires_grad_(True)
    y = ref(xl)
    y.backward(g)
    assert torch.allclose(out, y.detach(), atol=1e-5)
    assert xl.grad is not None
    assert torch.allclose(await b.backward("p", "t", g), xl.grad, atol=1e-5)
    await b.close()


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.randn(2, 7), "shape"),
        (torch.randn(8), "shape"),
        (torch.randn(2, 8, 1), "shape"),
        (torch.tensor([[float("nan")] * 8]), "NaN"),
        (torch.tensor([[float("inf")] * 8]), "NaN"),
        (torch.randn(2, 8).double(), "dtype"),
        (torch.ones(2, 8, dtype=torch.int32), "dtype"),
        (torch.randn(0, 8), "batch"),
    ],
)
async def test_bad_inputs_are_refused_before_batching(x: torch.Tensor, message: str) -> None:
    b = backend()
    with pytest.raises(BadInput, match=message):
        await b.forward("p", "a", x)
    assert b.forward_pool.batches == 0 and b.stats.errors == 1
    await b.close()


async def test_half_precision_inputs_are_accepted() -> None:
    b = backend()
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(3, 8).to(dtype)
        out = await b.forward("p", str(dtype), x)
        assert out.dtype == torch.float32
        assert torch.allclose(out, local_copy(b)(x.float()), atol=1e-5)
    await b.close()


async def test_bad_grad_and_activation_id() -> None:
    b = backend()
    await b.forward("p", "a", torch.randn(3, 8))
    with pytest.raises(BadInput, match="shape"):
        await b.backward("p", "a", torch.randn(2, 8))
    with pytest.raises(BadInput, match="activation id"):
        await b.forward("p", "", torch.randn(3, 8))
    with pytest.raises(BadInput, match="activation id"):
        await b.forward("p", "x" * 65, torch.randn(3, 8))
    await b.close()


async def test_evicted_inputs_raise_then_fallback_inputs_work() -> None:
    cache = ActivationCache(max_bytes=4 * 8 * 4)  # room for one 4x8 float32 request
    b = backend(cache=cache, lr=0.0, keep_graphs=False)  # inputs alone (a kept graph would outlive them)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    await b.forward("p", "one", x1)
    await b.forward("p", "two", x2)  # evicts "one"
    g = torch.randn(4, 8)
    with pytest.raises(InputsEvicted):
        await b.backward("p", "one", g)
    assert b.stats.inputs_evicted == 1
    ref = local_copy(b)
    xl = x1.clone().requires_grad_(True)
    ref(xl).backward(g)
    assert xl.grad is not None
    assert torch.allclose(await b.backward("p", "one", g, inputs=x1), xl.grad, atol=1e-6)
    # The cache is per (peer, activation): another trainer's id does not reach these inputs.
    with pytest.raises(InputsEvicted):
        await b.backward("other-peer", "two", g)
    await b.close()


async def test_close_refuses_new_work_and_finishes_queued() -> None:
    b = backend(max_wait_s=0.2)
    pending = asyncio.ensure_future(b.forward("p", "q", torch.randn(2, 8)))
    await asyncio.sleep(0.01)
    await b.close()
    assert (await pending).shape == (2, 8)
    with pytest.raises(Exception, match="shutting down"):
        await b.forward("p", "late", torch.randn(2, 8))
