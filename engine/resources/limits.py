"""Applying the limits inside the process: torch threads and GPU memory fraction, freeing GPU memory, and
the pause that keeps the node's CPU share under the cap. torch is imported only when called."""

from __future__ import annotations

import gc
import os

from .settings import Settings, effective_cpu_threads, gpu_memory_fraction


def apply_torch_limits(settings: Settings) -> None:
    """Set torch's thread count and, where CUDA exists, the allocator's memory fraction for the chosen GPU."""
    import torch

    torch.set_num_threads(effective_cpu_threads(settings))
    if settings.use_gpu and torch.cuda.is_available() and settings.gpu_index < torch.cuda.device_count():
        total = torch.cuda.get_device_properties(settings.gpu_index).total_memory
        fraction = gpu_memory_fraction(settings, total)
        torch.cuda.set_per_process_memory_fraction(fraction, settings.gpu_index)


def free_gpu_memory() -> None:
    """Give cached GPU memory back to other programs (call after dropping references to GPU tensors)."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cpu_pause_after(busy_s: float, settings: Settings, cpu_count: int | None = None) -> float:
    """Seconds to rest after ``busy_s`` of compute on all our threads so that our share of the machine's
    CPU stays under ``cpu_max_percent``: threads * busy / (busy + rest) <= cap * cores."""
    cores = cpu_count or os.cpu_count() or 1
    threads = effective_cpu_threads(settings, cores)
    cap = settings.cpu_max_percent / 100.0
    return max(0.0, busy_s * (threads / (cap * cores) - 1.0))
