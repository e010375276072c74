"""Expert architectures by name: the only code a host ever runs for an expert.

A host builds experts from a :class:`ExpertSpec` (a name plus integer sizes) and this registry; nothing
that arrives over the network can add code, so a spec is plain data: it can be logged, compared with a
checkpoint's, and sent to trainers in ``moe.info``. Every architecture maps ``[batch, *input_shape]`` to
the same shape, so a trainer can treat experts as interchangeable residual blocks of a layer.

``stage`` (:mod:`.stage`) is ``depth`` causal transformer blocks over ``[batch, seq, dim]``: the one
architecture with a depth. ``depth`` is 0 for every other one and is then left out of the spec's fields,
so the fields of an ``ffn`` or ``transformer`` spec (checkpoint metadata, ``moe.info``) are unchanged.

``wire_rank`` r (0: off, the default) puts any architecture behind a low-rank boundary
(:mod:`.low_rank`): the expert takes and returns rows of r numbers, lifting them to ``dim`` inside, so
the wire carries r per token. Like ``depth`` it is left out of the fields when 0.

Dropout is deliberately absent: a host recomputes the forward pass for a backward whose graph it could
not keep (:mod:`.graphs`), and that recomputation must be exactly the function the trainer saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import SpecError
from .low_rank import LowRankExpert
from .stage import StageExpert

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "ExpertSpec",
    "FeedForwardExpert",
    "StageExpert",
    "TransformerExpert",
    "build",
    "input_shape",
    "register",
]

#: Upper bound on any size in a spec: a spec from a peer (``moe.info``) must not make us allocate wildly.
MAX_SIZE = 1 << 16
#: Upper bound on a stage's depth (a 24 GB GPU holds about 80 blocks of d=1024: :mod:`.stage_fit`).
MAX_DEPTH = 512


@dataclass(frozen=True)
class ExpertSpec:
    """What to build: an architecture name and its sizes.

    ``dim`` is the model width (input and output features); ``hidden`` the FFN width (``4 * dim`` when 0);
    ``heads`` the attention heads of ``transformer`` and ``stage``; ``seq_len`` a fixed sequence length,
    or 0 for any; ``depth`` a ``stage``'s blocks (at least 1 there, 0 for every other architecture);
    ``wire_rank`` the width of the expert's input and output rows when it sits behind a low-rank
    boundary (1 to ``dim``), 0 for none.
    """

    arch: str
    dim: int
    hidden: int = 0
    heads: int = 1
    seq_len: int = 0
    depth: int = 0
    wire_rank: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise SpecError(f"unknown expert architecture {self.arch!r}; known: {sorted(ARCHITECTURES)}")
        for name in ("dim", "hidden", "heads", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
                raise SpecError(f"{name} must be an int in [0, {MAX_SIZE}], got {value!r}")
        if self.dim < 1 or self.heads < 1:
            raise SpecError("dim and heads must be at least 1")
        if self.dim % self.heads:
            raise SpecError(f"dim {self.dim} is not divisible by heads {self.heads}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int):
            raise SpecError(f"depth must be an int, got {self.depth!r}")
        if ARCHITECTURES[self.arch].deep:
            if not 1 <= self.depth <= MAX_DEPTH:
                raise SpecError(f"a {self.arch} needs a depth in [1, {MAX_DEPTH}], got {self.depth}")
        elif self.depth:
            raise SpecError(f"a {self.arch} expert has no depth (got {self.depth}); only stages do")
        rank = self.wire_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= self.dim:
            raise SpecError(f"wire_rank must be an int in [0, dim={self.dim}] (0: none), got {rank!r}")

    @property
    def hidden_size(self) -> int:
        return self.hidden or 4 * self.dim

    def to_fields(self) -> dict[str, str | int]:
        """The spec as flat message fields (and checkpoint metadata); ``depth`` and ``wire_rank`` only
        where they are set."""
        fields: dict[str, str | int] = {
            "arch": self.arch,
            "dim": self.dim,
            "hidden": self.hidden,
            "heads": self.heads,
            "seq_len": self.seq_len,
        }
        if self.depth:
            fields["depth"] = self.depth
        if self.wire_rank:
            fields["wire_rank"] = self.wire_rank
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> ExpertSpec:
        """Parse untrusted fields; every failure is a :class:`SpecError`."""
        try:
            return cls(
                arch=_typed(fields, "arch", str),
                dim=_typed(fields, "dim", int),
                hidden=_typed(fields, "hidden", int),
                heads=_typed(fields, "heads", int),
                seq_len=_typed(fields, "seq_len", int),
                depth=_typed(fields, "depth", int) if "depth" in fields else 0,
                wire_rank=_typed(fields, "wire_rank", int) if "wire_rank" in fields else 0,
            )
        except KeyError as e:
            raise SpecError(f"spec lacks field {e}") from None


def _typed(fields: Mapping[str, Any], key: str, kind: type) -> Any:
    value = fields[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SpecError(f"spec field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


class FeedForwardExpert(nn.Module):
    """Pre-norm residual FFN: ``x + W2 gelu(W1 layernorm(x))``; the paper's default expert."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(nn.functional.gelu(self.up(self.norm(x))))
        return out


class TransformerExpert(nn.Module):
    """One pre-norm transformer encoder block over ``[batch, seq, dim]`` (more compute per wire byte)."""

    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            dim,
            heads,
            dim_feedforward=hidden,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        return out


@dataclass(frozen=True)
class Architecture:
    """How to build one architecture and which trailing input dims it takes (``None``: any length);
    ``deep``: its spec has a depth (at least 1)."""

    build: Callable[[ExpertSpec], nn.Module]
    input_shape: Callable[[ExpertSpec], tuple[int | None, ...]]
    deep: bool = False


ARCHITECTURES: dict[str, Architecture] = {}


def register(name: str, arch: Architecture) -> None:
    """Add an architecture (built-in code only: tests and the package itself call this)."""
    ARCHITECTURES[name] = arch


def build(spec: ExpertSpec) -> nn.Module:
    """A freshly initialised expert on the CPU, in float32 (behind its low-rank boundary if it has one)."""
    inner = ARCHITECTURES[spec.arch].build(spec)
    return LowRankExpert(inner, spec.dim, spec.wire_rank) if spec.wire_rank else inner


def input_shape(spec: ExpertSpec) -> tuple[int | None, ...]:
    """Trailing input dims (batch excluded); outputs have the same shape. The last is ``wire_rank``
    for an expert behind a low-rank boundary."""
    shape = ARCHITECTURES[spec.arch].input_shape(spec)
    return (*shape[:-1], spec.wire_rank) if spec.wire_rank else shape


def sample_nbytes(spec: ExpertSpec, seq_len: int = 1) -> int:
    """Float32 bytes of one sample, for sizing batches and caches (``seq_len`` fills a free length)."""
    return 4 * math.prod(seq_len if d is None else d for d in input_shape(spec))


register("ffn", Architecture(lambda s: FeedForwardExpert(s.dim, s.hidden_size), lambda s: (s.dim,)))
register(
    "transformer",
    Architecture(
        lambda s: TransformerExpert(s.dim, s.hidden_size, s.heads),
        lambda s: (s.seq_len or None, s.dim),
    ),
)
register(
    "stage",
    Architecture(
        lambda s: StageExpert(s.dim, s.hidden_size, s.heads, s.depth),
        lambda s: (s.seq_len or None, s.dim),
        deep=True,
    ),
)
