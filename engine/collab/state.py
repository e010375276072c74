"""State sharing: a newcomer (or a peer that fell behind) downloads parameters and optimizer state from
several donors at once, in parts, each checked against a hash the donors' signed records agree on.

A donor keeps a snapshot of its state after each step: the tensors' bytes back to back (``blob``) and a
:class:`Manifest` (tensor names, dtypes, shapes, and the SHA-256 of each ``part_bytes`` slice). It
publishes ``(epoch, sha256(manifest))`` in its own signed slot under ``<run>.state``, with the previous
snapshot's pair it still serves. Members that took identical steps hold bit-identical state, so their
records agree.

The downloader takes the newest ``(epoch, manifest hash)`` that more than half of the donors (distinct
peers: the DHT gives each signer one slot) vouch for, as their current or previous snapshot, not the
highest epoch anyone claims: one record at epoch 10^9 is one vote, and three honest donors outvote
it. Donors mid-step (some at ``e + 1``, the rest at ``e``) all still vouch for ``e``. Without such a
majority nothing is taken (:class:`~.errors.NoStateMajority`): as many liars as honest donors can stop
a newcomer from taking state, not make it take theirs. Sybils (many peer ids of one attacker) are the
coordinator's accounts' business, not checked here.

The manifest is fetched from one of those donors (checked against the agreed hash) and then checked
against this peer's own model before anything is allocated (:func:`check_manifest`): every parameter
named with this model's shape and dtype, and ``total_bytes`` the sum of its entries and at most
:func:`state_bytes_bound` (the parameters plus at most ``OPTIMIZER_COPIES`` copies of them and a few
scalars each; :class:`~.errors.ManifestRefused` otherwise: a manifest of 2^50 bytes is refused, not
allocated). Then parts are fetched from every such donor in parallel. A part whose hash differs came
from a corrupt donor: it is named in the log, never asked again, and the part is fetched from another.

Wire::

    collab.state_manifest  {"run", "epoch"}           -> {"manifest": bytes}
    collab.state_part      {"run", "epoch", "index"}  -> [uint8 tensor]
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import torch
from torch import nn

from engine.dht import DHTError, DHTNode
from engine.p2p import CallContext, P2PError, Peer, RemoteError
from engine.wire import Kind, Message, WireError

from .errors import CorruptPart, ManifestRefused, NoStateMajority, Refusals, StateDownloadFailed

logger = logging.getLogger(__name__)

STATE_MANIFEST = "collab.state_manifest"
STATE_PART = "collab.state_part"
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


def state_key(run: str) -> str:
    return f"{run}.state"


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


class StateDonor:
    """Serves this peer's latest snapshot and vouches for it in the DHT."""

    def __init__(self, peer: Peer, dht: DHTNode, run: str, ttl_s: float = 120.0) -> None:
        self.peer = peer
        self.dht = dht
        self.run = run
        self.ttl_s = ttl_s
        self.snapshots: dict[int, Snapshot] = {}  # the latest two: a download may straddle a step
        self.parts_served = 0
        peer.handlers.add_unary(STATE_MANIFEST, self._serve_manifest)
        peer.handlers.add_unary(STATE_PART, self._serve_part)

    @property
    def snapshot(self) -> Snapshot | None:
        return self.snapshots[max(self.snapshots)] if self.snapshots else None

    async def publish(self, snapshot: Snapshot) -> None:
        self.snapshots[snapshot.manifest.epoch] = snapshot
        for old in sorted(self.snapshots)[:-2]:
            del self.snapshots[old]
        before = [s for e, s in self.snapshots.items() if e < snapshot.manifest.epoch]
        prev = (before[-1].manifest.epoch, before[-1].manifest_hash) if before else (-1, b"")
        record = msgspec.msgpack.encode(
            StateRecord(snapshot.manifest.epoch, snapshot.manifest_hash, prev[0], prev[1])
        )
        try:
            await self.dht.store(state_key(self.run), record, self.dht.clock() + self.ttl_s)
        except DHTError as e:
            logger.warning("publishing the state record failed: %s", e)

    def _current(self, msg: Message) -> Snapshot:
        epoch = msg.fields.get("epoch")
        s = self.snapshots.get(epoch) if isinstance(epoch, int) else None
        if s is None or msg.fields.get("run") != self.run:
            raise RemoteError("no_state", "no snapshot of that run and epoch here")
        return s

    async def _serve_manifest(self, msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={"manifest": self._current(msg).manifest_bytes})

    async def _serve_part(self, msg: Message, ctx: CallContext) -> Message:
        s = self._current(msg)
        index = msg.fields.get("index")
        if not isinstance(index, int) or not 0 <= index < len(s.manifest.part_hashes):
            raise RemoteError("bad_request", "part index out of range")
        self.parts_served += 1
        part = torch.frombuffer(s.part(index), dtype=torch.uint8) if len(s.part(index)) else torch.empty(0)
        return Message(Kind.RESPONSE, 0, tensors=[part.to(torch.uint8)])


@dataclass
class DownloadReport:
    epoch: int
    donors: list[str]
    corrupt: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    parts_from: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    refusals: Refusals = field(default_factory=Refusals)  # manifests refused, by kind and donor


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


async def read_state_records(dht: DHTNode, run: str, exclude: str) -> dict[str, StateRecord]:
    try:
        got = await dht.get(state_key(run))
    except DHTError as e:
        raise StateDownloadFailed(f"reading state records failed: {e}") from e
    out = {}
    for (owner, _), record in got.records.items():
        if owner == exclude:
            continue
        try:
            out[owner] = msgspec.msgpack.decode(record.value, type=StateRecord)
        except msgspec.DecodeError:
            logger.warning("undecodable state record from %s", owner)
    return out


async def download_state(
    peer: Peer,
    dht: DHTNode,
    run: str,
    *,
    timeout: float = 30.0,
    min_epoch: int = 0,
    unlike: bytes = b"",
    model: nn.Module | None = None,
) -> tuple[Manifest, bytearray, DownloadReport]:
    """``min_epoch``: refuse older state; ``unlike``: nothing to do if the agreed hash is this one;
    ``model``: the model the state is for, which bounds the manifest (:func:`check_manifest`)."""
    started = time.monotonic()
    epoch, digest, donors = choose_state(await read_state_records(dht, run, exclude=peer.peer_id))
    if epoch < min_epoch:
        raise StateDownloadFailed(f"the newest state donors vouch for is epoch {epoch}, not {min_epoch}")
    if digest == unlike:
        raise StateDownloadFailed("the donors vouch for the state we already hold")
    report = DownloadReport(epoch, donors)
    fields: dict[str, object] = {"run": run, "epoch": epoch}
    manifest = None
    for donor in donors:
        try:
            reply = await peer.call(donor, STATE_MANIFEST, fields, timeout=timeout)  # type: ignore[arg-type]
            raw = reply.fields.get("manifest")
            if not isinstance(raw, bytes) or hashlib.sha256(raw).digest() != digest:
                raise CorruptPart(f"manifest from {donor} does not match the agreed hash")
            got = msgspec.msgpack.decode(raw, type=Manifest)
            check_manifest(got, run, epoch, model)
            manifest = got
            break
        except ManifestRefused as e:
            # the majority vouches for it, so every such donor serves the same one: stop here
            report.refusals.note(e, donor, logger)
            raise
        except CorruptPart as e:
            logger.warning("state download: %s", e)
            report.corrupt.append(donor)
        except (P2PError, WireError, TimeoutError, msgspec.DecodeError) as e:
            report.failed[donor] = str(e)
    if manifest is None:
        raise StateDownloadFailed(f"no donor of epoch {epoch} served the agreed manifest")
    n_parts = len(manifest.part_hashes)
    blob = bytearray(manifest.total_bytes)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n_parts):
        queue.put_nowait(i)
    done = [False] * n_parts
    fields = {"run": run, "epoch": epoch}

    async def worker(donor: str) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            try:
                reply = await peer.call(donor, STATE_PART, {**fields, "index": i}, timeout=timeout)  # type: ignore[dict-item]
                a = i * manifest.part_bytes
                b = min(manifest.total_bytes, a + manifest.part_bytes)
                data = reply.tensors[0] if len(reply.tensors) == 1 else torch.empty(0)
                raw = data.numpy().tobytes() if data.dtype == torch.uint8 else b""
                if len(raw) != b - a or hashlib.sha256(raw).digest() != manifest.part_hashes[i]:
                    raise CorruptPart(f"part {i} from {donor} does not match its hash")
            except CorruptPart as e:
                queue.put_nowait(i)
                report.corrupt.append(donor)
                logger.warning("state download: %s; asking another donor", e)
                return
            except (P2PError, WireError, TimeoutError) as e:
                queue.put_nowait(i)
                report.failed[donor] = f"{type(e).__name__}: {e}"
                return
            blob[a:b] = raw
            done[i] = True
            report.parts_from[donor] += 1

    pending = [d for d in donors if d not in report.corrupt]
    while not all(done) and pending:
        await asyncio.gather(*(worker(d) for d in pending))
        pending = [d for d in pending if d not in report.corrupt and d not in report.failed]
    if not all(done):
        raise StateDownloadFailed(
            f"{done.count(False)} of {n_parts} parts could not be fetched "
            f"(corrupt: {report.corrupt}, failed: {list(report.failed)})"
        )
    report.seconds = time.monotonic() - started
    return manifest, blob, report
