"""How much memory the node offers the coordinator: the GPU budget on a GPU, the RAM budget on the CPU."""

from __future__ import annotations

import psutil  # type: ignore[import-untyped]
import torch

from engine.resources import Settings
from engine.resources.settings import gpu_memory_fraction, ram_budget_bytes


def memory_budget(settings: Settings, device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else 0
        total = int(torch.cuda.get_device_properties(index).total_memory)
        return int(total * gpu_memory_fraction(settings, total))
    return ram_budget_bytes(settings, int(psutil.virtual_memory().total))


def process_rss() -> int:
    return int(psutil.Process().memory_info().rss)
