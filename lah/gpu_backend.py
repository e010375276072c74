"""The experts' compute on a real GPU against the CPU: one expert, and many experts' backward as one.

Part of ``scripts/gpu-check`` (:mod:`lah.gpu_check`): ``backend`` runs each architecture's forward,
backward and Adam step through the real :class:`~engine.moe.backend.ExpertBackend` on CUDA and on the
CPU from the same weights; ``fused`` runs several experts' backward batches as the host runs them when
they are ready together (:func:`engine.moe.fused.backward_together`: one autograd call, one foreach
clipping and Adam pass) against each expert stepping alone, and times both, since on a GPU the
per-expert kernel launches are what grouping saves.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import torch

__all__ = ["CheckFailed", "Skip", "check_backend", "check_fused", "cuda"]


class Skip(Exception):
    """A check that cannot run here (no CUDA, no NVML); the reason is reported, the run still passes."""


class CheckFailed(Exception):
    """A check ran and the device did not do what the node relies on."""


def cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise Skip(f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    return torch.device("cuda", 0)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


async def _backend_pair(spec: Any, batch: int, dtype: torch.dtype, device: str) -> dict[str, float]:
    """Forward, backward and Adam step on ``device`` and on the CPU from the same weights.

    Outputs, input gradients and the parameters' gradients are compared relative to their largest value.
    The weights after the step are not: Adam's first step moves every weight by about ``lr`` times the sign
    of its gradient, so a gradient near zero that rounds to the other sign on one device moves that weight
    ``2 * lr`` apart. What is checked of the step instead is that it happened on the device and moved no
    weight further than Adam's first step can.
    """
    from engine.moe.backend import ExpertBackend

    lr = 1e-3
    dev = ExpertBackend("ffn.0", spec, device=device, seed=0, lr=lr)
    cpu = ExpertBackend("ffn.0", spec, device="cpu", seed=0, lr=lr)
    cpu.module.load_state_dict({k: v.cpu() for k, v in dev.module.state_dict().items()})
    start = {k: v.detach().cpu().clone() for k, v in cpu.module.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    shape = (batch, *(d if d is not None else 16 for d in dev.input_shape))
    x = torch.randn(shape, generator=gen).to(dtype)
    g = torch.randn(shape, generator=gen).to(dtype)
    try:
        errors: dict[str, float] = {}
        for name, a, b in (
            ("forward", await dev.forward("p", "a1", x), await cpu.forward("p", "a1", x)),
            ("backward", await dev.backward("p", "a1", g), await cpu.backward("p", "a1", g)),
        ):
            if a.device.type != "cpu" or not torch.isfinite(a).all():
                raise CheckFailed(f"{spec.arch} {name} on {device} returned {a.device} / non-finite values")
            errors[name] = _relative(a, b)
        params = dict(cpu.module.named_parameters())
        errors["param_grads"] = max(
            _relative(p.grad.cpu(), params[k].grad)  # type: ignore[union-attr,arg-type]
            for k, p in dev.module.named_parameters()
        )
        moved = max(float((v.cpu() - start[k]).abs().max()) for k, v in dev.module.state_dict().items())
        errors["step_max_move_over_lr"] = moved / lr
        if dev.stats.steps != 1 or next(dev.module.parameters()).device.type != torch.device(device).type:
            raise CheckFailed(f"{spec.arch}: the expert did not step on {device}")
        return errors
    finally:
        await dev.close()
        await cpu.close()


def check_backend(device: str | None = None) -> dict[str, Any]:
    """``device`` other than CUDA only for the tests of this module: it exercises the same code."""
    device = device or str(cuda())
    from engine.moe import ExpertSpec

    cases = {
        "ffn": ExpertSpec("ffn", dim=1024),
        "transformer": ExpertSpec("transformer", dim=256, heads=4, seq_len=32),
    }
    tolerance = 2e-3  # float32 accumulation orders differ between cuBLAS and the CPU; TF32 would be ~1e-2
    figures: dict[str, Any] = {}
    failures: list[str] = []
    for name, spec in cases.items():
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            errors = asyncio.run(_backend_pair(spec, 64, dtype, device))
            key = f"{name}_{str(dtype).removeprefix('torch.')}"
            figures[key] = {k: float(f"{v:.2e}") for k, v in errors.items()}
            worst = max(v for k, v in errors.items() if k != "step_max_move_over_lr")
            if worst > tolerance:
                failures.append(f"{key} differs from the CPU by {worst:.2e} (relative), over {tolerance}")
            if not 0 < errors["step_max_move_over_lr"] <= 1.5:
                failures.append(
                    f"{key}: Adam's first step moved a weight {errors['step_max_move_over_lr']:.2f} lr"
                )
    if failures:
        raise CheckFailed("; ".join(failures) + f"; figures: {figures}")
    return figures


async def _fused_pair(experts: int, batch: int, device: str, rounds: int) -> dict[str, float]:
    """``experts`` FFN experts twice over: one set stepped together, one alone; the weights must agree
    and the seconds per round of each are the figures."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.moe import ExpertBackend, ExpertSpec
    from engine.moe.fused import FusedExpert, backward_together

    spec = ExpertSpec("ffn", dim=512, hidden=1024)
    executor = ThreadPoolExecutor(1)
    grouped = [
        ExpertBackend(f"ffn.{i}", spec, device=device, seed=i, executor=executor) for i in range(experts)
    ]
    alone = [
        ExpertBackend(f"ffn.{i}", spec, device=device, seed=i, executor=executor) for i in range(experts)
    ]
    gen = torch.Generator().manual_seed(2)
    timing = {"together_s": 0.0, "alone_s": 0.0}
    try:
        for r in range(rounds):
            xs = [torch.randn(batch, 512, generator=gen) for _ in range(experts)]
            gs = [torch.randn(batch, 512, generator=gen) for _ in range(experts)]
            for i in range(experts):
                await grouped[i].forward("p", f"a{r}", xs[i])
                await alone[i].forward("p", f"a{r}", xs[i])
            jobs: list[tuple[FusedExpert, list[tuple[Any, ...]]]] = []
            for b, g in zip(grouped, gs, strict=True):
                key = b._key("p", f"a{r}")
                jobs.append((b, [(g, b.cache.pop(key), b.graphs.pop(key) if b.graphs is not None else None)]))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            together = await asyncio.get_running_loop().run_in_executor(executor, backward_together, jobs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            singles = [await b.backward("p", f"a{r}", g) for b, g in zip(alone, gs, strict=True)]
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if r > 0:  # the first round warms kernels and allocators up
                timing["together_s"] += t1 - t0
                timing["alone_s"] += t2 - t1
            worst_grad = max(
                _relative(t[0][0], s) for t, s in zip(together, singles, strict=True) if t[0][0] is not None
            )
            if worst_grad > 2e-3:
                raise CheckFailed(f"grouped input gradients differ from single ones by {worst_grad:.2e}")
        worst = max(
            _relative(p.detach().cpu(), q.detach().cpu())
            for a, b in zip(grouped, alone, strict=True)
            for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True)
        )
        if worst > 2e-3 or any(b.stats.steps != rounds for b in grouped):
            raise CheckFailed(f"grouped Adam steps differ from single ones by {worst:.2e} (relative)")
        n = max(rounds - 1, 1)
        return {
            "experts": experts,
            "rows": batch,
            "weights_max_relative_diff": float(f"{worst:.2e}"),
            "together_ms_per_round": round(1e3 * timing["together_s"] / n, 2),
            "alone_ms_per_round": round(1e3 * timing["alone_s"] / n, 2),
            "speedup": round(timing["alone_s"] / max(timing["together_s"], 1e-9), 2),
        }
    finally:
        for b in (*grouped, *alone):
            await b.close()
        executor.shutdown()


def check_fused(device: str | None = None, experts: int = 32, rounds: int = 6) -> dict[str, Any]:
    """``device`` other than CUDA only for the tests of this module: it exercises the same code."""
    device = device or str(cuda())
    figures = asyncio.run(_fused_pair(experts, 12, device, rounds))
    gc.collect()  # the experts' memory back to the driver before the memory-cap check measures
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return figures
