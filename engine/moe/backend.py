"""One hosted expert: its module, its optimizer, its request batching and its activation cache.

Forward requests keep their inputs in the :class:`ActivationCache` and, by default, their autograd graph
in a second one (:mod:`.graphs`: charged the bytes autograd saved, with a budget of its own so that graphs
never push inputs out; a graph that does not fit, or is evicted, is recomputed from the inputs), so the
backward request brings only the output gradient; the host backpropagates, returns the input gradient
and applies a local optimizer step: the
asynchronous training of Learning@home, where each expert updates itself from the gradients it gets.
With ``keep_graphs=False`` forwards run under ``torch.inference_mode`` and every backward recomputes.

Everything a peer sends is checked here before it reaches a batch (shape against the spec, dtype, finite
values): one malformed request must fail alone with ``bad_input``, not poison the batch it joins.
With a :class:`~.guard.GuardConfig` (``guard=``: :data:`DEFAULT_GUARD` unless told otherwise, ``None``
for none) a backward must also pass the expert's bounds on bad trainers before it joins a batch (its
size against the recent ones, its sender's share of the recent updates: :mod:`.guard`), and every
``probe_every`` steps the expert's outputs on its probe are checked for a jump, which rolls it back to
its last good state (:mod:`.probe`). Refusals and rollbacks are counted in :class:`BackendStats`
(``grad_refused``, ``share_refused``, ``grad_clipped``, ``rollbacks``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Hashable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from engine.wire import all_finite

from .batching import DutyCycle, TaskPool
from .cache import ActivationCache
from .checkpoint import Checkpoint, restore_state, snapshot_state
from .errors import BadInput, ExpertUnavailable, GradientTooLarge, InputsEvicted, OverShare
from .fused import backward_together
from .graphs import BackwardRequest, GraphSlice, forward_keeping_graph
from .graphs import backward as graph_backward
from .guard import GuardConfig, NormBound, ShareWindow, row_rms
from .probe import Probe
from .registry import ExpertSpec, build, input_shape

__all__ = ["ALLOWED_DTYPES", "BackendStats", "ExpertBackend", "default_device"]

logger = logging.getLogger(__name__)

ALLOWED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Default budget of kept forward graphs (40 KiB a sample for d=1024/4096: about 13,000 samples).
GRAPH_BYTES = 512 << 20
#: Above this many elements the finiteness check leaves the event loop for a worker thread. The
#: check is one pass (engine.wire.finite): 0.03-0.16 ms for a 256 x 1024 batch, 0.3 ms for 1 Mi
#: elements on one core; below that a hand-over to a thread and back costs the loop more in wake-ups.
THREAD_CHECK_ELEMENTS = 1 << 20
MAX_ACTIVATION_ID = 64
#: Every host's bounds against bad trainers unless it is given others (``guard=None``: none at all).
DEFAULT_GUARD = GuardConfig()


def default_device() -> torch.device:
    """CUDA when there is one, the CPU otherwise: the same code runs on both."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class BackendStats:
    forward_requests: int = 0
    backward_requests: int = 0
    forward_samples: int = 0
    backward_samples: int = 0
    errors: int = 0
    steps: int = 0
    inputs_evicted: int = 0
    recomputed_samples: int = 0  # backward samples whose forward ran again (no kept graph)
    graphs_refused: int = 0  # forward batches that ran without a graph for want of device memory
    grad_refused: int = 0  # backwards over the bound on recent gradient sizes (guard)
    share_refused: int = 0  # backwards over their trainer's share of recent updates (guard)
    grad_clipped: int = 0  # backwards whose update was scaled down to the clip bound (guard)
    rollbacks: int = 0  # jumps on the probe, each undone by restoring the last good state (guard)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class ExpertBackend:
    """Serves forward/backward for one expert; compute runs on ``executor`` (one thread per device)."""

    def __init__(
        self,
        uid: str,
        spec: ExpertSpec,
        *,
        device: torch.device | str | None = None,
        executor: Executor | None = None,
        cache: ActivationCache | None = None,
        graphs: ActivationCache | None = None,
        lr: float = 1e-3,
        max_grad_norm: float | None = 1.0,
        max_batch_size: int = 256,
        max_wait_s: float = 0.005,
        max_request_samples: int = 4096,
        seed: int | None = None,
        duty: DutyCycle | None = None,
        keep_graphs: bool = True,
        guard: GuardConfig | None = DEFAULT_GUARD,
    ) -> None:
        self.uid = uid
        self.spec = spec
        self.device = torch.device(device) if device is not None else default_device()
        self.input_shape = input_shape(spec)
        if seed is not None:
            torch.manual_seed(seed)
        # train() mode on purpose: there is no dropout, and TransformerEncoderLayer's eval-mode fast path
        # would make an inference forward differ (slightly) from the recomputation done for backward.
        self.module = build(spec).to(self.device).train()
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=lr)
        self.max_grad_norm = max_grad_norm
        self.max_request_samples = max_request_samples
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix=f"expert-{uid}")
        self.cache = cache if cache is not None else ActivationCache()
        # Kept forward graphs: none at all with keep_graphs=False (every backward recomputes).
        self.graphs = (
            None if not keep_graphs else graphs if graphs is not None else ActivationCache(GRAPH_BYTES)
        )
        self.forward_pool = TaskPool(
            f"{uid}.fwd",
            self._forward_batch,
            self.executor,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            duty=duty,
        )
        self.backward_pool = TaskPool(
            f"{uid}.bwd",
            self._backward_requests,
            self.executor,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            duty=duty,
            batched=False,  # requests carry their graphs, which do not concatenate
            together=_guarded_together,  # with every other expert's backward that is ready
            owner=self,
        )
        self.stats = BackendStats()
        self.closed = False
        self.guard = guard
        self.norms = NormBound(guard) if guard is not None else None
        self.shares = ShareWindow(guard) if guard is not None else None
        self.probe = Probe(guard, uid) if guard is not None else None

    # -- requests (event loop) -------------------------------------------------------------------

    async def forward(self, peer_id: str, activation_id: str, inputs: torch.Tensor) -> torch.Tensor:
        """Outputs for ``inputs``; keeps the inputs for a later :meth:`backward` of this activation."""
        self._check_open()
        try:
            await self._check_inputs(inputs, "inputs")
            _check_activation_id(activation_id)
            outputs: torch.Tensor
            outputs, *kept = await self.forward_pool.submit(inputs)
        except Exception:
            self.stats.errors += 1
            raise
        key = self._key(peer_id, activation_id)
        self.cache.put(key, inputs)
        if kept and self.graphs is not None:
            self.graphs.put(key, kept[0], kept[0].nbytes)  # no room for it: the backward recomputes
        self.stats.forward_requests += 1
        self.stats.forward_samples += int(inputs.shape[0])
        if self.probe is not None:
            self.probe.offer(peer_id, inputs)
        return outputs

    async def backward(
        self, peer_id: str, activation_id: str, grad_outputs: torch.Tensor, inputs: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Input gradient for a past forward; applies an optimizer step. Needs the forward's kept graph, or
        cached or re-sent inputs to recompute it."""
        self._check_open()
        try:
            _check_activation_id(activation_id)
            await self._check_inputs(grad_outputs, "grad_outputs")
            key = self._key(peer_id, activation_id)
            cached: torch.Tensor | None = self.cache.pop(key)
            kept: GraphSlice | None = self.graphs.pop(key) if self.graphs is not None else None
            if inputs is not None:
                await self._check_inputs(inputs, "inputs")
                kept = None  # re-sent inputs: their gradient, recomputed
            else:
                inputs = cached
            if inputs is not None:
                shape = tuple(inputs.shape)
            elif kept is not None and not kept.graph.consumed:
                shape = kept.shape  # the inputs were evicted, their graph was not
            else:
                raise self._evicted(activation_id)
            if shape != tuple(grad_outputs.shape):
                raise BadInput(f"grad_outputs shape {tuple(grad_outputs.shape)} != inputs {tuple(shape)}")
            scale = await self._admit(peer_id, grad_outputs) if self.guard is not None else 1.0
            grad_inputs: torch.Tensor | None
            update = grad_outputs if scale == 1.0 else grad_outputs * scale
            (grad_inputs,) = await self.backward_pool.submit(update, inputs, kept)
            if grad_inputs is None:  # its graph went to a sibling's backward meanwhile, and no inputs
                raise self._evicted(activation_id)
            if scale != 1.0:  # clipped for the weights only: the trainer's input gradient is exact
                grad_inputs = grad_inputs / scale
        except Exception:
            self.stats.errors += 1
            raise
        self.stats.backward_requests += 1
        self.stats.backward_samples += int(grad_outputs.shape[0])
        return grad_inputs

    async def _admit(self, peer_id: str, grad_outputs: torch.Tensor) -> float:
        """The guard's bounds (:mod:`.guard`): the request's size, then its sender's share; the scale
        its output gradient takes for the update. Nothing is awaited between the checks and their
        records, so concurrent requests see each other's."""
        assert self.norms is not None and self.shares is not None
        if grad_outputs.numel() >= THREAD_CHECK_ELEMENTS:
            squared = await asyncio.to_thread(_squared_norm, grad_outputs)
        else:
            squared = _squared_norm(grad_outputs)
        rows = int(grad_outputs.shape[0])
        try:
            scale = self.norms.admit(peer_id, row_rms(squared, rows), self.uid)
            self.shares.admit(peer_id, rows, self.uid)
        except GradientTooLarge as e:
            self.stats.grad_refused += 1
            logger.warning("refused a backward from %s: %s", peer_id, e)
            raise
        except OverShare as e:
            self.stats.share_refused += 1
            logger.warning("refused a backward from %s: %s", peer_id, e)
            raise
        self.stats.grad_clipped += scale < 1.0
        return scale

    def _after_step(self) -> None:
        """The probe's check after an optimizer step (worker thread)."""
        if self.probe is not None and self.probe.after_step(self.module, self.optimizer, self.device):
            self.stats.rollbacks += 1

    def _evicted(self, activation_id: str) -> InputsEvicted:
        self.stats.inputs_evicted += 1
        return InputsEvicted(f"{self.uid}: inputs of activation {activation_id!r} are gone; re-send them")

    def _key(self, peer_id: str, activation_id: str) -> Hashable:
        return (self.uid, peer_id, activation_id)

    def _check_open(self) -> None:
        if self.closed:
            raise ExpertUnavailable(f"expert {self.uid} is shutting down")

    async def _check_inputs(self, x: torch.Tensor, what: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise BadInput(f"{what} is not a tensor")
        if x.dtype not in ALLOWED_DTYPES:
            raise BadInput(f"{what} dtype {x.dtype} is not one of float32, float16, bfloat16")
        want = self.input_shape
        shape = tuple(x.shape)
        if len(shape) != len(want) + 1 or any(
            w is not None and w != s for w, s in zip(want, shape[1:], strict=True)
        ):
            shown = tuple("*" if w is None else w for w in want)
            raise BadInput(f"{what} shape {shape} does not match [batch, {', '.join(map(str, shown))}]")
        if not 1 <= shape[0] <= self.max_request_samples or 0 in shape:
            raise BadInput(
                f"{what}: batch of {shape[0]} outside [1, {self.max_request_samples}] or empty dims"
            )
        if x.numel() >= THREAD_CHECK_ELEMENTS:
            finite = await asyncio.to_thread(all_finite, x)
        else:
            finite = all_finite(x)
        if not finite:
            raise BadInput(f"{what} contains NaN or infinite values")

    # -- compute (worker thread) -----------------------------------------------------------------

    def _forward_batch(self, args: Sequence[torch.Tensor]) -> Sequence[Any]:
        x = args[0].to(self.device, torch.float32)
        if self.graphs is not None:
            try:
                y, graph = forward_keeping_graph(self.module, x)
                return [y.to("cpu"), graph]
            except torch.OutOfMemoryError:  # the GPU's share the volunteer allows is full: no graph
                self.stats.graphs_refused += 1
                logger.info(
                    "%s: no GPU memory for a forward graph of %d samples; it will be recomputed",
                    self.uid,
                    int(x.shape[0]),
                )
        with torch.inference_mode():
            return [self.module(x).to("cpu")]

    def _backward_requests(self, requests: list[tuple[Any, ...]]) -> list[tuple[torch.Tensor | None]]:
        """One optimizer step for a backward batch: kept graphs where they live, else recomputed."""
        self.optimizer.zero_grad(set_to_none=True)
        grads, recomputed = graph_backward(self.module, [BackwardRequest(*r) for r in requests], self.device)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.stats.steps += 1  # one writer: this worker thread
        self.stats.recomputed_samples += recomputed
        self._after_step()
        return [(None if g is None else g.to("cpu"),) for g in grads]

    # -- state -----------------------------------------------------------------------------------

    async def snapshot(self) -> Checkpoint:
        """A consistent copy of weights and optimizer state, taken on the worker thread between batches."""
        meta: dict[str, Any] = {"uid": self.uid, "spec": self.spec.to_fields(), "steps": self.stats.steps}
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, snapshot_state, self.module, self.optimizer, meta)

    async def weights(self) -> tuple[list[str], list[torch.Tensor], int]:
        """The module's state (names in its order, CPU copies) and the update steps it reflects, copied
        on the worker thread between batches (as :meth:`snapshot`): never half an optimizer step."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._weights)

    def _weights(self) -> tuple[list[str], list[torch.Tensor], int]:
        state = self.module.state_dict()
        tensors = [v.detach().to("cpu", copy=True).contiguous() for v in state.values()]
        return list(state), tensors, self.stats.steps

    async def restore(self, ckpt: Checkpoint) -> None:
        """Load a checkpoint written for this spec (the caller checked that)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self._restore, ckpt)

    def _restore(self, ckpt: Checkpoint) -> None:
        restore_state(self.module, self.optimizer, ckpt)
        self.module.to(self.device)
        self.stats.steps = int(ckpt.meta.get("steps", 0))

    async def close(self, drain_timeout: float = 10.0) -> None:
        """Take no new requests, finish queued ones (within ``drain_timeout``), drop cached inputs."""
        self.closed = True
        await self.forward_pool.drain(drain_timeout)
        await self.backward_pool.drain(drain_timeout)
        if self._own_executor:
            await asyncio.to_thread(self.executor.shutdown, True)


def _guarded_together(
    jobs: list[tuple[Any, list[tuple[Any, ...]]]],
) -> list[list[tuple[torch.Tensor | None]]]:
    """:func:`.fused.backward_together`, then each expert's probe check (``_after_step``)."""
    results = backward_together(jobs)
    for backend, _ in jobs:
        backend._after_step()
    return results


def _squared_norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x, dtype=torch.float32).square())


def _check_activation_id(activation_id: object) -> None:
    if not isinstance(activation_id, str) or not 0 < len(activation_id) <= MAX_ACTIVATION_ID:
        raise BadInput(f"activation id must be a str of 1..{MAX_ACTIVATION_ID} characters")


def parameter_count(module: torch.nn.Module) -> int:
    return sum(math.prod(p.shape) for p in module.parameters())
