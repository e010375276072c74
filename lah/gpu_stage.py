"""The stage expert at the size a 24 GB GPU holds, on CUDA: FLOP/s, memory against the plan, busy share.

Part of ``scripts/gpu-check`` (:mod:`lah.gpu_check`), for issue 33: a stage of causal transformer blocks
(:mod:`engine.moe.stage`) as :func:`engine.moe.stage_fit.largest_stage` sizes it for a 20 GiB budget
(d=1024, 16 heads, sequences of 1024 tokens, one sequence a batch) runs forward, backward and Adam step
through the real :class:`~engine.moe.backend.ExpertBackend` (float32 on the device, as a host runs it).
It reports:

- ``tflops``: counted FLOPs (torch's counter, forward and backward, as in
  ``benchmarks/compute_per_byte.py``) per second of forward+backward+step, the median of the timed calls;
- ``peak_gib`` against ``planned_gib`` (:func:`~engine.moe.stage_fit.stage_memory`): what the device
  really needed must stay within the budget the plan was made for (``planned / HEADROOM``), or a host
  would accept a stage that runs out of memory;
- ``flops_per_upload_byte`` (float16 and 8-bit payloads plus the transport overhead measured by the
  benchmark, :data:`TRANSPORT_OVERHEAD`) and the busy share it gives behind a 2.5 MB/s uplink, both
  with the issue's 80 TFLOP/s (``busy_share_formula``) and with this device's measured rate
  (``busy_share_here``). These are formulas, not the emulated home link of the issue's item 4.

``smoke=True`` runs the same code on a stage a CPU computes in a second (``scripts/gpu-check
--cpu-smoke``), so the check is known to work before a GPU is lent.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import torch

__all__ = ["TRANSPORT_OVERHEAD", "check_stage"]

#: Transport bytes over the tensors' own (SCTP, DTLS and UDP headers, acknowledgements, message headers):
#: 5.6% in benchmarks/compute_per_byte.py (docs/measurements/compute-per-byte-2026-12-05.md).
TRANSPORT_OVERHEAD = 0.056
UPLINK_BPS = 2.5e6
REFERENCE_FLOPS = 8e13
GIB = float(1 << 30)


def _spec(smoke: bool) -> tuple[Any, int]:
    from engine.moe.registry import ExpertSpec
    from engine.moe.stage_fit import largest_stage

    if smoke:
        return ExpertSpec("stage", 64, 256, 4, 32, depth=2), 2
    return largest_stage(1024, 16, 20 * (1 << 30), seq_len=1024, batch_tokens=1024), 1


async def _run(spec: Any, batch: int, device: torch.device, calls: int) -> dict[str, Any]:
    from engine.moe.backend import ExpertBackend
    from engine.moe.stage import flop_counter

    backend = ExpertBackend("stage.0", spec, device=device, seed=0, max_batch_size=batch)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(batch, spec.seq_len, spec.dim, generator=gen).half()
        g = (torch.randn(batch, spec.seq_len, spec.dim, generator=gen) * 1e-3).half()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = []
        for i in range(calls + 1):  # the first call warms up kernels and the allocator; not timed
            t0 = time.perf_counter()
            await backend.forward("check", f"a{i}", x)
            await backend.backward("check", f"a{i}", g)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                seconds.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        recomputed = backend.stats.recomputed_samples
    finally:
        await backend.close()
    # The count, on the CPU or the device, of one call's forward and backward as the host ran it.
    module = backend.module
    xc = x.to(device, torch.float32).requires_grad_(True)
    with flop_counter() as counter:
        out = module(xc)
        out.backward(g.to(device, torch.float32))
    module.zero_grad(set_to_none=True)
    return {
        "flops": int(counter.get_total_flops()),
        "seconds": statistics.median(seconds),
        "peak": peak,
        "recomputed": recomputed,
    }


def check_stage(device: str | torch.device, *, smoke: bool = False, calls: int = 3) -> dict[str, Any]:
    from engine.moe.stage import stage_flops_per_token
    from engine.moe.stage_fit import HEADROOM, stage_memory
    from engine.wire.compression import int8_payload_nbytes, row_block_size

    from .gpu_backend import CheckFailed

    dev = torch.device(device)
    spec, batch = _spec(smoke)
    tokens = batch * spec.seq_len
    got = asyncio.run(_run(spec, batch, dev, calls))
    expected = stage_flops_per_token(spec.dim, spec.hidden_size, spec.depth, spec.seq_len) * tokens
    if got["flops"] != expected:
        raise CheckFailed(f"torch counted {got['flops']} FLOPs a call, the formula says {expected}")
    planned = stage_memory(spec, batch_tokens=tokens, kept_bytes=0).total
    tflops = got["flops"] / got["seconds"] / 1e12
    per_token = {
        "float16": 2 * 2 * spec.dim,
        "int8": 2 * int8_payload_nbytes(spec.dim, row_block_size((1, spec.dim))),
    }
    figures: dict[str, Any] = {
        "spec": spec.to_fields(),
        "device": str(dev),
        "tokens_per_call": tokens,
        "gflop_per_call": round(got["flops"] / 1e9, 2),
        "call_s": round(got["seconds"], 4),
        "tflops": float(f"{tflops:.3g}"),
        "planned_gib": round(planned / GIB, 2),
        "peak_gib": None if got["peak"] is None else round(got["peak"] / GIB, 2),
        "recomputed_samples": got["recomputed"],
    }
    for wire, payload in per_token.items():
        fpb = stage_flops_per_token(spec.dim, spec.hidden_size, spec.depth, spec.seq_len) / (
            payload * (1 + TRANSPORT_OVERHEAD)
        )
        figures[f"flops_per_upload_byte_{wire}"] = round(fpb)
        figures[f"busy_share_formula_{wire}"] = round(min(1.0, fpb * UPLINK_BPS / REFERENCE_FLOPS), 5)
        figures[f"busy_share_here_{wire}"] = round(min(1.0, fpb * UPLINK_BPS / (tflops * 1e12)), 5)
    if got["peak"] is not None and got["peak"] > planned / HEADROOM:
        raise CheckFailed(
            f"the stage needed {got['peak'] / GIB:.2f} GiB, over the {planned / HEADROOM / GIB:.2f} GiB "
            f"budget its plan of {planned / GIB:.2f} GiB was made for: a host would accept stages that "
            f"do not fit ({figures})"
        )
    return figures
