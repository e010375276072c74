"""State sharing over the network: a donor serves its snapshots (:mod:`.snapshot`), and a newcomer (or a
peer that fell behind) downloads parameters and optimizer state from several donors at once, in parts,
each checked against a hash the donors' signed records agree on.

A donor (:class:`StateDonor`) keeps its latest two snapshots and publishes a :class:`~.snapshot.StateRecord`
in its own signed slot under ``<run>.state``. The downloader (:func:`download_state`) reads those
records, takes the state the majority vouches for (:func:`~.snapshot.choose_state`), fetches its
manifest from one of those donors (checked against the agreed hash, then against this peer's model:
:func:`~.snapshot.check_manifest`), and then fetches parts from every such donor in parallel. A part
whose hash differs came from a corrupt donor: it is named in the log, never asked again, and the part
is fetched from another.

Wire::

    collab.state_manifest  {"run", "epoch"}           -> {"manifest": bytes}
    collab.state_part      {"run", "epoch", "index"}  -> [uint8 tensor]
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import torch
from torch import nn

from engine.dht import DHTError, DHTNode
from engine.p2p import CallContext, P2PError, Peer, RemoteError
from engine.wire import Kind, Message, WireError

from .errors import CorruptPart, ManifestRefused, Refusals, StateDownloadFailed
from .snapshot import Manifest, Snapshot, StateRecord, check_manifest, choose_state

logger = logging.getLogger(__name__)

STATE_MANIFEST = "collab.state_manifest"
STATE_PART = "collab.state_part"


def state_key(run: str) -> str:
    return f"{run}.state"


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
