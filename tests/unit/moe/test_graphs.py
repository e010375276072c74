"""Kept forward graphs (engine/moe/graphs.py): one forward per sample, exact gradients, bounded memory."""

import asyncio
import gc
import weakref

import pytest
import torch

from engine.moe import ActivationCache, BadInput, ExpertBackend, ExpertSpec, InputsEvicted, build
from engine.moe.graphs import GraphSlice

SPEC = ExpertSpec("ffn", 8, hidden=16)


def backend(**kwargs: object) -> ExpertBackend:
    return ExpertBackend("ffn.0", SPEC, device="cpu", seed=0, **kwargs)  # type: ignore[arg-type]


def forwards_of(b: ExpertBackend) -> list[int]:
    """A list that grows by one sample count per forward the module runs."""
    calls: list[int] = []
    b.module.register_forward_hook(lambda _m, args, _out: calls.append(int(args[0].shape[0])))
    return calls


def local_copy(b: ExpertBackend) -> torch.nn.Module:
    ref = build(b.spec)
    ref.load_state_dict(b.module.state_dict())
    return ref


def local_grads(b: ExpertBackend, xs: list[torch.Tensor], gs: list[torch.Tensor]) -> list[torch.Tensor]:
    ref = local_copy(b)
    out = []
    for x, g in zip(xs, gs, strict=True):
        leaf = x.clone().requires_grad_(True)
        ref(leaf).backward(g)
        assert leaf.grad is not None
        out.append(leaf.grad)
    return out


async def test_backward_runs_on_the_kept_graph_without_a_second_forward() -> None:
    for keep, forwards, recomputed in ((True, [5], 0), (False, [5, 5], 5)):
        b = backend(keep_graphs=keep)
        calls = forwards_of(b)
        x, g = torch.randn(5, 8), torch.randn(5, 8)
        await b.forward("p", "a", x)
        await b.backward("p", "a", g)
        assert calls == forwards and b.stats.recomputed_samples == recomputed
        assert b.stats.steps == 1
        await b.close()


async def test_a_merged_forward_batch_split_across_backward_batches() -> None:
    """Two members' backwards consume the shared graph (the third's rows get zero gradient there); the
    third member, later, recomputes. Every input gradient is autograd's (lr 0: no step in between)."""
    b = backend(lr=0.0, max_batch_size=64, max_wait_s=0.2)
    calls = forwards_of(b)
    xs = [torch.randn(n, 8) for n in (2, 3, 4)]
    gs = [torch.randn(n, 8) for n in (2, 3, 4)]
    await asyncio.gather(*(b.forward("p", f"a{i}", x) for i, x in enumerate(xs)))
    assert b.forward_pool.batch_sizes == [9]
    first = await asyncio.gather(b.backward("p", "a0", gs[0]), b.backward("p", "a1", gs[1]))
    assert b.backward_pool.batch_sizes == [5] and b.stats.recomputed_samples == 0
    last = await b.backward("p", "a2", gs[2])
    assert b.stats.recomputed_samples == 4 and calls == [9, 4]
    for got, want in zip([*first, last], local_grads(b, xs, gs), strict=True):
        assert torch.allclose(got, want, atol=1e-6)
    await b.close()


async def test_steps_between_a_forward_and_its_backward_leave_the_graph_usable() -> None:
    """Autograd refuses a graph whose weights changed in place; the kept graph takes the weights as they
    are now (the asynchronous update), close to what recomputing gives after one small step."""
    b = backend(lr=1e-3)
    x1, x2, g1, g2 = (torch.randn(4, 8) for _ in range(4))
    await b.forward("p", "one", x1)
    await b.forward("p", "two", x2)
    await b.backward("p", "two", g2)  # an Adam step on the weights "one"'s graph refers to
    recomputed = local_grads(b, [x1], [g1])[0]
    kept = await b.backward("p", "one", g1)
    assert b.stats.steps == 2 and b.stats.recomputed_samples == 0
    assert torch.isfinite(kept).all()
    assert not torch.equal(kept, recomputed)  # the activations are those of the forward, before the step
    assert torch.allclose(kept, recomputed, atol=1e-2)
    await b.close()


async def test_graphs_have_a_budget_of_their_own_and_what_does_not_fit_recomputes() -> None:
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    b = backend(lr=0.0)
    await b.forward("p", "a", x)
    assert b.graphs is not None
    (entry,) = b.graphs._entries.values()
    kept = entry[0]
    assert isinstance(kept, GraphSlice) and b.graphs.nbytes == kept.nbytes > 2 * x.numel() * x.element_size()
    assert b.cache.nbytes == x.numel() * x.element_size()  # the inputs' cache holds the inputs alone
    del kept, entry
    await b.close()

    b = backend(graphs=ActivationCache(max_bytes=64), lr=0.0)  # no graph fits
    calls = forwards_of(b)
    await b.forward("p", "a", x)
    assert b.graphs is not None and len(b.graphs) == 0
    got = await b.backward("p", "a", g)
    assert b.stats.recomputed_samples == 4 and calls == [4, 4]
    assert torch.allclose(got, local_grads(b, [x], [g])[0], atol=1e-6)
    await b.close()


async def test_graphs_never_push_inputs_out() -> None:
    """Graphs are forty times the inputs' size: filling their budget evicts graphs, never inputs (an
    evicted input costs the trainer a re-send, an evicted graph only a forward)."""
    inputs = ActivationCache(max_bytes=1 << 20)
    b = backend(cache=inputs, graphs=ActivationCache(max_bytes=3000), lr=0.0)
    xs = [torch.randn(4, 8) for _ in range(6)]
    for i, x in enumerate(xs):
        await b.forward("p", f"a{i}", x)
    assert b.graphs is not None and b.graphs.evictions > 0 and inputs.evictions == 0 and len(inputs) == 6
    gs = [torch.randn(4, 8) for _ in xs]
    got = [await b.backward("p", f"a{i}", g) for i, g in enumerate(gs)]
    assert 0 < b.stats.recomputed_samples < 24  # the oldest graphs were evicted, the newest kept
    for have, want in zip(got, local_grads(b, xs, gs), strict=True):
        assert torch.allclose(have, want, atol=1e-6)
    await b.close()


async def test_a_kept_graph_outlives_its_evicted_inputs() -> None:
    b = backend(cache=ActivationCache(max_bytes=4 * 8 * 4), lr=0.0)  # room for one request's inputs
    x1, x2, g1 = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    await b.forward("p", "one", x1)
    await b.forward("p", "two", x2)  # evicts "one"'s inputs, not its graph
    got = await b.backward("p", "one", g1)
    assert b.stats.inputs_evicted == 0 and b.stats.recomputed_samples == 0
    assert torch.allclose(got, local_grads(b, [x1], [g1])[0], atol=1e-6)
    await b.forward("p", "three", x1)  # evicts "two"'s inputs
    with pytest.raises(BadInput, match="shape"):  # the graph's shape stands in for the inputs'
        await b.backward("p", "two", torch.randn(3, 8))
    await b.close()


async def test_a_sibling_took_the_graph_and_the_inputs_are_gone() -> None:
    """Three requests merged into one forward; two backwards consume the graph; the third's inputs were
    evicted since: it alone gets inputs_evicted (the trainer re-sends), the others their gradients."""
    b = backend(lr=0.0, max_batch_size=64, max_wait_s=0.2)
    xs = [torch.randn(2, 8) for _ in range(3)]
    gs = [torch.randn(2, 8) for _ in range(3)]
    await asyncio.gather(*(b.forward("p", f"a{i}", x) for i, x in enumerate(xs)))
    await asyncio.gather(b.backward("p", "a0", gs[0]), b.backward("p", "a1", gs[1]))
    b.cache.clear()  # the third's inputs are gone; its graph slice is consumed
    with pytest.raises(InputsEvicted):
        await b.backward("p", "a2", gs[2])
    got = await b.backward("p", "a2", gs[2], xs[2])  # the re-send
    assert torch.allclose(got, local_grads(b, [xs[2]], [gs[2]])[0], atol=1e-6)
    await b.close()


async def test_clearing_the_caches_frees_kept_graphs() -> None:
    """What release_memory does when the volunteer comes back: the graphs go with the inputs."""
    b = backend()
    await b.forward("p", "a", torch.randn(4, 8))
    assert b.graphs is not None
    (kept, _, _) = next(iter(b.graphs._entries.values()))
    graph = weakref.ref(kept.graph)
    del kept
    b.cache.clear()
    b.graphs.clear()
    await asyncio.sleep(0)  # the loop's handle that woke this task holds the forward's result until then
    gc.collect()
    assert graph() is None
    with pytest.raises(InputsEvicted):  # a backward after the caches were cleared asks for the inputs
        await b.backward("p", "a", torch.randn(4, 8))
    await b.close()


async def test_resent_inputs_recompute_even_when_a_graph_is_kept() -> None:
    """A trainer that re-sent its inputs gets the gradient of those inputs, not of the kept graph's."""
    b = backend(lr=0.0)
    x, other, g = torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)
    await b.forward("p", "a", x)
    got = await b.backward("p", "a", g, other)
    assert b.stats.recomputed_samples == 3
    assert torch.allclose(got, local_grads(b, [other], [g])[0], atol=1e-6)
    await b.close()


async def test_a_forward_without_device_memory_for_its_graph_still_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU at the volunteer's memory cap: the graph cannot be kept, the forward answers anyway (without
    one) and its backward recomputes."""
    from engine.moe import backend as backend_module

    def full(module: torch.nn.Module, x: torch.Tensor) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (the volunteer's share)")

    monkeypatch.setattr(backend_module, "forward_keeping_graph", full)
    b = backend(lr=0.0)
    x, g = torch.randn(3, 8), torch.randn(3, 8)
    out = await b.forward("p", "a", x)
    assert torch.allclose(out, local_copy(b)(x), atol=1e-6) and b.stats.graphs_refused == 1
    got = await b.backward("p", "a", g)
    assert b.stats.recomputed_samples == 3
    assert torch.allclose(got, local_grads(b, [x], [g])[0], atol=1e-6)
    await b.close()
