"""A model's state as a donor serves it and a downloader checks it, with no I/O.

A donor keeps a snapshot of its state after each step (:func:`take_snapshot`): the tensors' bytes back
to back (``blob``) and a :class:`Manifest` (tensor names, dtypes, shapes, and the SHA-256 of each
``part_bytes`` slice). It vouches for ``(epoch, sha256(manifest))`` with a :class:`StateRecord`, with
the previous snapshot's pair it still serves. Members that took identical steps hold bit-identical
state, so their records agree.

:func:`choose_state` takes the newest ``(epoch, manifest hash)`` that more than half of the donors
(distinct peers: the DHT gives each signer one slot) vouch for, as their current or previous snapshot,
not the highest epoch anyone claims: one record at epoch 10^9 is one vote, and three honest donors
outvote it. Donors mid-step (some at ``e + 1``, the rest at ``e``) all still vouch for ``e``. Without
such a majority nothing is taken (:class:`~.errors.NoStateMajority`): as many liars as honest donors
can stop a newcomer from taking state, not make it take theirs. Sybils (many peer ids of one attacker)
are the coordinator's accounts' business, not checked here.

A manifest is checked against this peer's own model before anything is allocated
(:func:`check_manifest`): every parameter named with this model's shape and dtype, and ``total_bytes``
the sum of its entries and at most :func:`state_bytes_bound` (the parameters plus at most
``OPTIMIZER_COPIES`` copies of them and a few scalars each; :class:`~.errors.ManifestRefused`
otherwise: a manifest of 2^50 bytes is refused, not allocated). :func:`load_snapshot` copies a verified
one into the model and its optimizer. Serving and downloading it over the network: :mod:`.state`.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass

import msgspec
import torch
from torch import nn

from .errors import ManifestRefused, NoStateMajority, StateDownloadFailed

PART_BYTES = 1 << 18
MAX_PART_BYTES = 1 << 24
OPTIMIZER_COPIES = 3  # floating state tensors per parameter at most (Adam: 2; AMSGrad: 3)
SCALAR_BYTES = 64  # per parameter, for its optimizer's scalar state (a step count)
MAX_UNCHECKED_BYTES = 1 << 34  # a download without a model to check against takes at most 16 GiB
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "int64": torch.int64}


class TensorEntry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    name: str
    dtype: str
    shape: list[int]


class Manifest(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    run: str
    epoch: int
    part_bytes: int
    total_bytes: int
    tensors: list[TensorEntry]
    part_hashes: list[bytes]


class StateRecord(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    epoch: int
    manifest_hash: bytes
    previous_epoch: int = -1  # the snapshot before, still served (-1: none)
    previous_hash: bytes = b""

    def vouches(self) -> list[tuple[int, bytes]]:
        out = [(self.epoch, self.manifest_hash)]
        if self.previous_epoch >= 0 and self.previous_epoch != self.epoch:
            out.append((self.previous_epoch, self.previous_hash))
        return out


def encode_manifest(m: Manifest) -> bytes:
    return msgspec.msgpack.encode(m)


def state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """Parameters by name, then each parameter's optimizer state by key: a fixed, shared order."""
    out = [(f"param.{name}", p.detach()) for name, p in model.named_parameters()]
    index = {id(p): i for i, p in enumerate(model.parameters())}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(v, torch.Tensor):
                    out.append((f"opt.{index[id(p)]}.{k}", v.detach()))
    return out


@dataclass
class Snapshot:
    manifest: Manifest
    blob: bytearray
    manifest_bytes: bytes
    manifest_hash: bytes

    def part(self, index: int) -> memoryview:
        a = index * self.manifest.part_bytes
        return memoryview(self.blob)[a : min(len(self.blob), a + self.manifest.part_bytes)]


def take_snapshot(
    run: str, epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer, part_bytes: int = PART_BYTES
) -> Snapshot:
    tensors = state_tensors(model, optimizer)
    entries = []
    for name, t in tensors:
        dtype = next((k for k, v in DTYPES.items() if v == t.dtype), None)
        if dtype is None:
            raise StateDownloadFailed(f"state tensor {name} has unsupported dtype {t.dtype}")
        entries.append(TensorEntry(name, dtype, list(t.shape)))
    # one copy of the state: each tensor's bytes go straight into the blob
    blob = bytearray(sum(t.numel() * t.element_size() for _, t in tensors))
    offset = 0
    for _, t in tensors:
        n = t.numel() * t.element_size()
        if n:
            view = torch.frombuffer(blob, dtype=torch.uint8, count=n, offset=offset)
            view.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        offset += n
    hashes = [
        hashlib.sha256(memoryview(blob)[a : a + part_bytes]).digest() for a in range(0, len(blob), part_bytes)
    ]
    manifest = Manifest(run, epoch, part_bytes, len(blob), entries, hashes)
    raw = encode_manifest(manifest)
    return Snapshot(manifest, blob, raw, hashlib.sha256(raw).digest())


def state_bytes_bound(model: nn.Module) -> int:
    """The most bytes a snapshot of ``model`` with its optimizer's state can take: the parameters, at
    most ``OPTIMIZER_COPIES`` tensors of each one's size, and ``SCALAR_BYTES`` each for scalars."""
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    return param_bytes * (1 + OPTIMIZER_COPIES) + SCALAR_BYTES * len(params)


def check_manifest(manifest: Manifest, run: str, epoch: int, model: nn.Module | None) -> None:
    """ManifestRefused unless ``manifest`` could describe ``model``'s state of ``run`` at ``epoch``:
    sizes bounded by the model's own before anything is allocated, parameters of its shapes. Without
    a model only its own consistency is checked (and its size against ``MAX_UNCHECKED_BYTES``)."""
    bound = state_bytes_bound(model) if model is not None else MAX_UNCHECKED_BYTES
    if manifest.run != run or manifest.epoch != epoch:
        raise ManifestRefused(f"manifest of {manifest.run!r} epoch {manifest.epoch}, not {run!r} {epoch}")
    if not 0 <= manifest.total_bytes <= bound:
        raise ManifestRefused(f"manifest of {manifest.total_bytes} bytes; this model's state is <= {bound}")
    if not 0 < manifest.part_bytes <= MAX_PART_BYTES:
        raise ManifestRefused(f"part size {manifest.part_bytes} out of (0, {MAX_PART_BYTES}]")
    if len(manifest.part_hashes) != -(-manifest.total_bytes // manifest.part_bytes):
        raise ManifestRefused("manifest part count does not match its size")
    if any(len(h) != 32 for h in manifest.part_hashes):
        raise ManifestRefused("part hashes are not SHA-256")
    params = dict(model.named_parameters()) if model is not None else {}
    total = 0
    seen: set[str] = set()
    for e in manifest.tensors:
        dtype = DTYPES.get(e.dtype)
        if dtype is None or any(d < 0 for d in e.shape) or e.name in seen:
            raise ManifestRefused(f"manifest entry {e.name} is malformed")
        seen.add(e.name)
        total += math.prod(e.shape) * torch.empty(0, dtype=dtype).element_size()
        if total > bound:
            raise ManifestRefused(f"manifest entries of more than {bound} bytes")
        if model is not None and e.name.startswith("param."):
            p = params.get(e.name[len("param.") :])
            if p is None or tuple(p.shape) != tuple(e.shape) or p.dtype != dtype:
                raise ManifestRefused(f"state parameter {e.name} does not fit this model")
    if total != manifest.total_bytes:
        raise ManifestRefused(f"entries of {total} bytes in a manifest of {manifest.total_bytes}")
    wanted = {f"param.{n}" for n in params}
    if wanted - seen:
        raise ManifestRefused(f"manifest lacks {len(wanted - seen)} of this model's parameters")


def load_snapshot(
    model: nn.Module, optimizer: torch.optim.Optimizer, manifest: Manifest, blob: bytearray
) -> None:
    """Copy a verified snapshot into ``model`` and ``optimizer``; StateDownloadFailed if shapes differ."""
    params = dict(model.named_parameters())
    plist = list(model.parameters())
    offset = 0
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    loads: list[tuple[torch.Tensor, torch.Tensor]] = []
    for e in manifest.tensors:
        dtype = DTYPES.get(e.dtype)
        if dtype is None or any(d < 0 for d in e.shape):
            raise StateDownloadFailed(f"manifest entry {e.name} is malformed")
        numel = math.prod(e.shape)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if offset + nbytes > len(blob):
            raise StateDownloadFailed("manifest describes more bytes than it covers")
        value = torch.frombuffer(blob, dtype=dtype, count=numel, offset=offset).reshape(e.shape).clone()
        offset += nbytes
        if e.name.startswith("param."):
            p = params.get(e.name[len("param.") :])
            if p is None or tuple(p.shape) != tuple(e.shape) or p.dtype != dtype:
                raise StateDownloadFailed(f"state parameter {e.name} does not fit this model")
            loads.append((p, value))
        elif e.name.startswith("opt."):
            _, idx, key = e.name.split(".", 2)
            if not idx.isdigit() or int(idx) >= len(plist):
                raise StateDownloadFailed(f"optimizer state {e.name} names no parameter")
            opt_state.setdefault(int(idx), {})[key] = value
        else:
            raise StateDownloadFailed(f"unknown state entry {e.name}")
    if offset != len(blob):
        raise StateDownloadFailed("manifest and state sizes differ")
    with torch.no_grad():
        for target, value in loads:
            target.copy_(value)
    sd = optimizer.state_dict()
    sd["state"] = opt_state
    optimizer.load_state_dict(sd)


def choose_state(records: dict[str, StateRecord]) -> tuple[int, bytes, list[str]]:
    """The newest (epoch, manifest hash) more than half of the donors vouch for, and those donors
    (each record one donor: the DHT gives each signer one slot). NoStateMajority if none. Pure."""
    if not records:
        raise StateDownloadFailed("no donor has published state")
    votes: Counter[tuple[int, bytes]] = Counter()
    for r in records.values():
        votes.update(set(r.vouches()))
    agreed = [pair for pair, n in votes.items() if 2 * n > len(records)]
    if not agreed:
        top = max(votes.values())
        raise NoStateMajority(
            f"no state is vouched for by more than half of {len(records)} donors (best: {top})"
        )
    epoch, best = max(agreed, key=lambda pair: (pair[0], votes[pair], pair[1]))
    donors = sorted(o for o, r in records.items() if (epoch, best) in r.vouches())
    return epoch, best, donors
