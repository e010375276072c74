"""The experts a node hosts right now: one ExpertServer for the current assignment, behind the work gate.

A new assignment with other uids or specs replaces the server: the old one stops (its requests are
refused as ``unavailable`` while it drains) and writes its checkpoints, then the new one loads the newest
checkpoints from ``data_dir/experts``. ``release_memory`` is what a node does when the user comes back:
drop cached activations and, on a GPU, move the experts' weights and optimizer state to host memory so
the GPU's memory goes back to the user; ``restore_memory`` reverses it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from engine.moe import ExpertServer, ExpertSpec
from engine.moe.batching import DutyCycle
from engine.p2p import Handlers
from engine.resources import free_gpu_memory
from engine.wire.statements import Signer

from .gate import WorkGate

logger = logging.getLogger(__name__)


class Hosting:
    def __init__(
        self,
        handlers: Handlers,
        gate: WorkGate,
        data_dir: Path,
        device: torch.device,
        *,
        checkpoint_interval_s: float = 300.0,
        cache_bytes: int = 1 << 30,
        duty: DutyCycle | None = None,
        signer: Signer | None = None,
    ) -> None:
        """``duty``: the CPU cap's rest between batches (CPU hosting; a GPU is capped by its memory);
        ``signer``: the node's identity, which countersigns what it serves (receipts need it)."""
        self.handlers = handlers
        self.signer = signer
        self.duty = duty
        self.gate = gate
        self.checkpoint_dir = data_dir / "experts"
        self.device = device
        self.checkpoint_interval_s = checkpoint_interval_s
        self.cache_bytes = cache_bytes
        self.server: ExpertServer | None = None
        self.specs: dict[str, ExpertSpec] = {}
        self.offloaded = False
        self._retired: dict[str, int] = {}  # requests served by replaced servers, for the totals

    @property
    def uids(self) -> list[str]:
        return sorted(self.specs)

    async def apply(self, specs: Mapping[str, ExpertSpec]) -> bool:
        """Host exactly ``specs``; True when that changed anything."""
        if dict(specs) == self.specs and self.server is not None:
            return False
        old, self.server = self.server, None
        if old is not None:
            self._retire(old)
            await old.close()
        self.specs = dict(specs)
        server = ExpertServer.create(
            self.specs,
            device=self.device,
            cache_bytes=self.cache_bytes,
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_interval_s=self.checkpoint_interval_s,
            backend_options={"duty": self.duty} if self.duty is not None else None,
            signer=self.signer,
        )
        await server.start()
        server.register(self.handlers)
        self.gate.wrap(self.handlers)
        self.server = server
        self.offloaded = False
        logger.info("hosting %d experts: %s", len(self.specs), ", ".join(self.uids))
        return True

    def _retire(self, server: ExpertServer) -> None:
        for uid, stats in server.stats().items():
            self._retired[uid] = self._retired.get(uid, 0) + _requests(stats)

    def requests_served(self) -> int:
        live = sum(_requests(s) for s in self.server.stats().values()) if self.server else 0
        return live + sum(self._retired.values())

    def stats(self) -> dict[str, dict[str, int]]:
        return self.server.stats() if self.server is not None else {}

    async def checkpoint(self) -> list[Path]:
        return await self.server.checkpoint() if self.server is not None else []

    async def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            if self.offloaded:
                await self.restore_memory_of(server)  # checkpoints read the weights where they live
            await server.close()

    async def release_memory(self) -> None:
        """Drop cached inputs and kept graphs; offload GPU weights to host memory; give cached GPU memory
        back."""
        server = self.server
        if server is None:
            return
        for backend in server.experts.values():
            backend.cache.clear()
            if backend.graphs is not None:  # kept forward graphs (on the GPU, where it hosts there)
                backend.graphs.clear()
        if self.device.type != "cpu" and not self.offloaded:
            await asyncio.to_thread(_move_all, server, torch.device("cpu"))
            self.offloaded = True
        await asyncio.to_thread(_collect)

    async def restore_memory(self) -> None:
        if self.server is not None:
            await self.restore_memory_of(self.server)

    async def restore_memory_of(self, server: ExpertServer) -> None:
        if self.offloaded:
            await asyncio.to_thread(_move_all, server, self.device)
            self.offloaded = False


def _requests(stats: Mapping[str, int]) -> int:
    return int(stats.get("forward_requests", 0)) + int(stats.get("backward_requests", 0))


def _move_all(server: ExpertServer, device: torch.device) -> None:
    """Weights and Adam state of every expert to ``device`` (called only while no request runs)."""
    for backend in server.experts.values():
        backend.module.to(device)  # parameters move in place, so the optimizer's references stay valid
        for state in backend.optimizer.state.values():
            for name, value in list(state.items()):
                if isinstance(value, torch.Tensor) and name != "step":
                    state[name] = value.to(device)


def _collect() -> None:
    gc.collect()
    free_gpu_memory()
