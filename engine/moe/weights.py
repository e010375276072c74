"""An expert's weights as a host reports them: the registry's order, and one digest both ends compute.

``moe.state`` (:mod:`.server`) sends a module's ``state_dict`` (parameters and buffers, no optimizer
state) in the order the registry's module lists it; the trainer (:mod:`.gather`) checks names, dtypes
and shapes against a module it builds itself from the spec, never against anything the host describes.
The digest covers what a copy must preserve: each tensor's name, dtype, shape and raw little-endian
bytes, length-prefixed so that no two different states encode alike. It proves the bytes arrived as
the host encoded them (a buggy encoder, a truncated copy, a file altered afterwards), not that an
honest host computed them: a host can hash whatever it sends.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .registry import ExpertSpec, build

__all__ = [
    "DIGEST_FORMAT",
    "ExpertState",
    "Layout",
    "dtype_name",
    "state_layout",
    "weights_digest",
    "weights_nbytes",
]

DIGEST_FORMAT = b"lah-expert-weights/1\n"

#: ``(name, dtype name, shape)`` of each tensor, in the module's order.
Layout = tuple[tuple[str, str, tuple[int, ...]], ...]


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def weights_digest(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> str:
    """sha256 (hex) of the canonical encoding; CPU tensors (a host hashes its copy, off the loop)."""
    if len(names) != len(tensors):
        raise ValueError(f"{len(names)} names for {len(tensors)} tensors")
    h = hashlib.sha256(DIGEST_FORMAT)
    for name, t in zip(names, tensors, strict=True):
        flat = t.detach().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        head = json.dumps([name, dtype_name(t), list(t.shape), raw.numel()], separators=(",", ":")).encode()
        h.update(len(head).to_bytes(4, "little"))
        h.update(head)
        h.update(raw.numpy().data)  # the bytes in place: no copy of a large tensor
    return h.hexdigest()


def weights_nbytes(module: torch.nn.Module) -> int:
    """Bytes of the module's state, from shapes alone (no copy)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


@functools.lru_cache(maxsize=32)
def state_layout(spec: ExpertSpec) -> Layout:
    """What a module of ``spec`` holds, built here on the meta device (no memory, no host's word)."""
    with torch.device("meta"):
        module = build(spec)
    return tuple((name, dtype_name(t), tuple(t.shape)) for name, t in module.state_dict().items())


@dataclass(frozen=True)
class ExpertState:
    """One replica's weights, as fetched and checked (``digest`` recomputed here, equal to the host's)."""

    uid: str
    host: str
    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    steps: int
    digest: str

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def as_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.tensors, strict=True))
