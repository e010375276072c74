"""The language model through the swarm: :class:`~engine.lm.LanguageModel` with remote mixture blocks.

Each mixture block of a language-model experiment is a grid of its own (``<experiment>_b<block>``,
:func:`engine.lm.grid_name`), hosted, credited and spot-checked like any other: the layer here is a
:class:`~engine.moe.RemoteMixtureOfExperts` on the trainer's Peer and finder, routing every token of a
batch as one sample, with the node's observer (receipts, spot checks, host health) on every call. A
token whose experts all failed keeps its residual stream (``pass_short``): a batch of thousands of
tokens is not lost to one of them. :func:`local_lm` is the same model with every expert in process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from engine.lm import CallCounters, LanguageModel, LmConfig, grid_name
from engine.moe import LoopThread, RemoteMixtureOfExperts
from engine.moe.layer_calls import CallRecord
from engine.moe.local import LocalMixtureOfExperts
from engine.moe.mixture import ExpertFinder

from .node import TrainerNode
from .trainer import TrainerConfig, remote_mixture

__all__ = ["call_counters", "layer_config", "local_lm", "mixtures", "remote_lm", "trainer_threads"]


def trainer_threads() -> int:
    """Torch threads for a language model's trainer: its dense part computes while the volunteers wait
    for it, and they compute while it waits, so it may take the machine's cores for its phase (at most
    four: its matrices are small). One thread measured 15-20% slower through 4 volunteer processes on
    two cores (benchmarks/lm_quality.py's remote phase)."""
    return max(1, min(4, os.cpu_count() or 1))


def layer_config(lm: LmConfig, experiment: str, **overrides: Any) -> TrainerConfig:
    """The trainer side of ``lm``'s mixture layers: the grids' shape, the gating's top-k, finite
    timeouts long enough for a layer of hundreds of tokens, and 8-bit activations on the wire: a
    step sends every token's row to each of its k experts both ways, so bytes set the hosts' transport
    CPU, and blockwise int8 (``engine.wire.compression``) costs no validation loss we could measure
    (benchmarks/lm_quality.py). ``overrides``: any other field."""
    options: dict[str, Any] = {"timeout": 10.0, "grace_s": 0.3, "k_min": 1, "wire": "int8"} | overrides
    return TrainerConfig(
        uid_prefix=experiment, grid=lm.grid, dim=lm.dim, hidden=lm.expert_spec.hidden or 0,
        k_best=lm.k_best, **options,
    )  # fmt: skip


def remote_lm(
    peer: Any,
    finder: ExpertFinder,
    loop: LoopThread,
    lm: LmConfig,
    experiment: str,
    config: TrainerConfig,
    observer: Callable[[CallRecord], None] | None = None,
    seed: int = 0,
) -> LanguageModel:
    """The experiment's language model, its mixture blocks on the volunteers' grids."""
    torch.manual_seed(seed)
    return LanguageModel(
        lm, lambda block: remote_mixture(peer, finder, loop, config, grid_name(experiment, block), observer)
    )


def local_lm(lm: LmConfig, seed: int = 0) -> LanguageModel:
    """The same model with :class:`LocalMixtureOfExperts` in process: the swarm's baseline."""
    torch.manual_seed(seed)
    return LanguageModel(lm, lambda _: LocalMixtureOfExperts(lm.dim, lm.grid, lm.expert_spec, lm.k_best))


def mixtures(model: LanguageModel) -> list[RemoteMixtureOfExperts]:
    """The model's remote layers (to read their ``short_rows``)."""
    return [m for m in model.modules() if isinstance(m, RemoteMixtureOfExperts)]


def call_counters(node: TrainerNode) -> CallCounters:
    """The trainer's expert calls by outcome and the bytes its open links carried, for a metrics row."""
    req = node.stats.requests
    links = list(node.peer.links.values()) if node.peer is not None else []
    return CallCounters(
        calls_ok=req["ok"],
        calls_failed=sum(n for code, n in req.items() if code not in ("ok", "late")),
        calls_late=req["late"],
        bytes_sent=sum(lk.rpc.channel.bytes_sent for lk in links),
        bytes_received=sum(lk.rpc.channel.bytes_received for lk in links),
    )
