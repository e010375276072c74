"""What an experiment fixes, read from the coordinator's JSON (``GET /api/experiments/{name}``): pure.

A researcher's model is their own, but the experts it calls are everyone's: the grid's shape, the
experts' width and type, and the gating's top-k belong to the experiment, and so do the target batch
size of a collaboration and the batch and learning rate its trainers are meant to use. A classifier
experiment has one grid, named after it; a language model has one per mixture block,
``<experiment>_b<block>`` (:func:`engine.lm.grid_name`, the coordinator's ``layer_name``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.lm import LmConfig, LmError, grid_name

from .errors import Mismatch, SwarmError

__all__ = ["LAYER_TYPES", "Experiment", "Grid", "check_layer", "lm_config", "parse_experiment"]

#: Expert types whose input is one vector per sample, which a mixture over ``[tokens, dim]`` calls.
LAYER_TYPES = frozenset({"ffn"})


@dataclass(frozen=True)
class Grid:
    """One grid of the volunteers' experts: uids ``<name>.<i>.<j>...``."""

    name: str
    shape: tuple[int, ...]
    dim: int  # the experts' input and output width
    hidden: int  # the experts' hidden width (0: the registry's default)
    expert_type: str
    k_best: int  # experts each token is routed to

    @property
    def experts(self) -> int:
        return math.prod(self.shape)

    def uids(self) -> list[str]:
        return [".".join([self.name, *map(str, c)]) for c in itertools.product(*map(range, self.shape))]


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str  # "classifier" or "lm"
    grids: dict[str, Grid]  # in the experiment's order (a language model's: block by block)
    target_batch_size: int  # > 0: trainers step together once they processed this many samples
    batch_size: int  # samples (a language model's: windows) per trainer step the experiment suggests
    lr: float  # the learning rate it suggests
    raw: dict[str, Any]  # the coordinator's JSON, for what this does not name


def lm_config(raw: Mapping[str, Any]) -> LmConfig:
    """The model a language-model experiment's JSON describes (``lah train`` builds the same one).
    Raises KeyError, TypeError, ValueError or :class:`~engine.lm.LmError` for one it cannot read."""
    spec = raw["lm"]
    return LmConfig(
        vocab_size=int(spec["vocab_size"]),
        context=int(spec["context"]),
        layers=int(spec["layers"]),
        heads=int(spec["heads"]),
        dim=int(spec["dim"]),
        moe_every=int(spec["moe_every"]),
        grid=tuple(int(n) for n in raw["grid"]),
        k_best=int(spec["k_best"]),
        expert_hidden=int(spec.get("expert_hidden", 0)),
    )


def parse_experiment(raw: dict[str, Any]) -> Experiment:
    """The experiment's grids and training numbers; :class:`SwarmError` for a config it cannot read."""
    try:
        name, kind = str(raw["name"]), str(raw.get("kind", "classifier"))
        shape = tuple(int(n) for n in raw["grid"])
        target = int(raw.get("target_batch_size", 0))
        if kind == "lm":
            spec = raw["lm"]
            lm = lm_config(raw)
            hidden = lm.expert_spec.hidden or 0
            grids = [Grid(grid_name(name, b), shape, lm.dim, hidden, "ffn", lm.k_best) for b in lm.moe_blocks]
            batch, lr = int(spec["batch_size"]), float(spec["lr"])
        else:
            hp, dense = raw.get("hyperparams", {}), raw.get("dense", {})
            dim = int(hp.get("d_model", hp.get("dim", 64)))  # as the coordinator's assignment reads it
            hidden = int(hp.get("hidden", 0))
            k_best = int(dense.get("k_best", 4))
            grids = [Grid(name, shape, dim, hidden, str(raw["expert_type"]), k_best)]
            batch, lr = int(dense.get("batch_size", 64)), float(dense.get("lr", 3e-3))
    except (KeyError, TypeError, ValueError, AttributeError, LmError) as e:
        raise SwarmError(
            f"the coordinator's config of experiment {raw.get('name', '?')!r} is not one this version "
            f"of the engine understands ({type(e).__name__}: {e})"
        ) from e
    return Experiment(name, kind, {g.name: g for g in grids}, target, batch, lr, raw)


def check_layer(grid: Grid, dim: int | None = None, shape: tuple[int, ...] | None = None) -> None:
    """Refuse, before any call, a layer the grid's experts cannot serve (:class:`Mismatch`)."""
    if grid.expert_type not in LAYER_TYPES:
        raise Mismatch(
            f"grid {grid.name}'s experts are of type {grid.expert_type!r}, which do not take one vector per "
            "token: a mixture layer over [tokens, dim] calls ffn experts only"
        )
    if dim is not None and dim != grid.dim:
        raise Mismatch(
            f"grid {grid.name}'s experts take {grid.dim} features per token and give back as many; "
            f"this layer was asked for {dim}: make the layer's width {grid.dim} "
            f"(a Linear({dim}, {grid.dim}) before it and back after, if your model is {dim} wide)"
        )
    if shape is not None and tuple(shape) != grid.shape:
        raise Mismatch(
            f"grid {grid.name} is {'x'.join(map(str, grid.shape))} experts; this layer was asked for "
            f"{'x'.join(map(str, shape))}: the experiment fixes the grid"
        )
