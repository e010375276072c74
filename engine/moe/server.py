"""ExpertServer: the RPC face of a node's experts, with stats, checkpoints and a clean shutdown.

Methods (all unary; fields are message fields, tensors in order)::

    moe.forward        {uid, aid}          [inputs]                    -> [outputs]
    moe.backward       {uid, aid}          [grad_outputs] (+[inputs])  -> [grad_inputs]
    moe.forward_many   {uids, aids, rows}  [inputs, concatenated]      -> {codes} [outputs of the ok]
    moe.backward_many  {uids, aids, rows}  [grad_outputs, concatenated] -> {codes} [grad_inputs of the ok]
    moe.info           {uid}               []     -> {arch, dim, hidden, heads, seq_len, input_shape}
    moe.state          {uid}               []     -> {names, steps, sha256} [the module's state, float32 raw]

``aid`` (activation id) is the trainer's name for one forward call; with the caller's peer id it keys
the cached inputs, so trainers cannot collide with each other. The ``_many`` methods carry one layer's
calls to several experts of this host in one message (a language model's step touches most of a
256-expert grid: a request per expert would be hundreds a step): ``rows[i]`` samples of the
concatenated tensor go to ``uids[i]`` under the activation id ``aids[i]``; each expert still batches
with other trainers' requests as a single call does, and fails alone (``codes[i]``: "" or its error
code; the reply holds the outputs of the experts that answered, in order). Replies travel in float16
by default (half the bytes; trainers accept that precision anyway). Requests arrive in whatever the
client chose.
``moe.state`` hands out an expert's current weights (``lah export``: a model that runs without the
swarm): the module's ``state_dict`` in its order (``names``), not the optimizer's, copied on the worker
thread between batches so that it never holds half an update, with the update ``steps`` that copy
reflects and the ``sha256`` of :func:`engine.moe.weights.weights_digest` (computed off the event loop).
It travels raw (no float16: it is the model, not an activation); a state over ``STATE_MAX_BYTES`` (a
link's message limit) is refused with ``too_large``. Any admitted peer may ask, as any may call forward.
Errors are ``RemoteError`` with the codes of :mod:`engine.moe.errors`.

Every answer says what it served, so that credit needs both ends: with a ``signer`` (the node's
identity) a forward or backward reply carries ``served_at``, ``host_key`` and ``host_sig``, one
signature over all the experts it answered (``engine.wire.statements``: a Merkle root of one leaf per
answered expert, its receipt id derived from the caller's peer id and activation id); the trainer's
receipts carry it to the coordinator. Forward replies also state each expert's version (``version``,
``versions`` for ``_many``): its update steps when it computed, or -1 when a step ran meanwhile, so a
spot check can recompute against that very state (``moe.state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from engine.p2p import CallContext, Handlers, RemoteError
from engine.wire import Compression, Kind, Message
from engine.wire.statements import Signer, countersign, receipt_id_of, served_leaf

from .backend import GRAPH_BYTES, ExpertBackend, default_device
from .cache import ActivationCache
from .checkpoint import CheckpointStore
from .errors import CheckpointError, ExpertRequestError, UnknownExpert
from .registry import ExpertSpec
from .weights import weights_digest, weights_nbytes

__all__ = ["UID_PATTERN", "ExpertServer"]

logger = logging.getLogger(__name__)

#: ``<grid name>.<coordinate>...``, e.g. ``ffn.3.7``; also safe as a directory name on every OS.
UID_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}(\.[0-9]{1,6}){0,4}$")
MAX_MANY = 1024  # experts in one moe.*_many call: a whole grid of one layer
#: The largest state ``moe.state`` sends in one reply: under a link's default 32 MiB message limit.
STATE_MAX_BYTES = 30 << 20
STATE_MAX_TENSORS = 64  # the wire's default tensors per message


class ExpertServer:
    """Hosts ``uid -> ExpertBackend``; register its methods on a :class:`Handlers` with :meth:`register`."""

    def __init__(
        self,
        experts: Mapping[str, ExpertBackend],
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_interval_s: float = 300.0,
        keep_checkpoints: int = 3,
        reply_compression: Compression = Compression.FLOAT16,
        signer: Signer | None = None,
    ) -> None:
        for uid in experts:
            if not UID_PATTERN.match(uid):
                raise ValueError(f"bad expert uid {uid!r}")
        self.experts = dict(experts)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_interval_s = checkpoint_interval_s
        self.keep_checkpoints = keep_checkpoints
        self.reply_compression = reply_compression
        self.signer = signer
        self.closing = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._timer: asyncio.Task[None] | None = None
        self._executors: list[ThreadPoolExecutor] = []

    @classmethod
    def create(
        cls,
        specs: Mapping[str, ExpertSpec],
        *,
        device: torch.device | str | None = None,
        cache_bytes: int = 1 << 30,
        cache_ttl_s: float = 120.0,
        graph_bytes: int = GRAPH_BYTES,
        backend_options: Mapping[str, Any] | None = None,
        **server_options: Any,
    ) -> ExpertServer:
        """Build backends for ``specs`` sharing one worker thread (this device), one activation cache
        (``cache_bytes`` of inputs) and one cache of kept forward graphs (``graph_bytes``)."""
        dev = torch.device(device) if device is not None else default_device()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"experts-{dev.type}")
        cache = ActivationCache(cache_bytes, cache_ttl_s)
        graphs = ActivationCache(graph_bytes, cache_ttl_s)
        options = dict(backend_options or {})
        backends = {
            uid: ExpertBackend(
                uid, spec, device=dev, executor=executor, cache=cache, graphs=graphs, **options
            )
            for uid, spec in specs.items()
        }
        server = cls(backends, **server_options)
        server._executors.append(executor)
        return server

    def register(self, handlers: Handlers) -> None:
        handlers.add_unary("moe.forward", self._forward)
        handlers.add_unary("moe.backward", self._backward)
        handlers.add_unary("moe.info", self._info)
        handlers.add_unary("moe.forward_many", self._forward_many)
        handlers.add_unary("moe.backward_many", self._backward_many)
        handlers.add_unary("moe.state", self._state)

    def stats(self) -> dict[str, dict[str, int]]:
        return {uid: b.stats.as_dict() for uid, b in self.experts.items()}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load each expert's newest valid checkpoint and start the checkpoint timer."""
        if self.checkpoint_dir is None:
            return
        for uid, backend in self.experts.items():
            ckpt = await asyncio.to_thread(self._store(uid).load_latest)
            if ckpt is None:
                continue
            if ckpt.meta.get("spec") != backend.spec.to_fields():
                logger.warning(
                    "checkpoint of %s is for spec %s, not %s: ignored",
                    uid,
                    ckpt.meta.get("spec"),
                    backend.spec.to_fields(),
                )
                continue
            try:
                await backend.restore(ckpt)
            except CheckpointError as e:
                logger.warning("cannot restore %s from its checkpoint: %s", uid, e)
                continue
            logger.info("restored %s at step %d", uid, backend.stats.steps)
        self._timer = asyncio.create_task(self._checkpoint_loop(), name="moe-checkpoints")

    async def checkpoint(self) -> list[Path]:
        """Write one checkpoint per expert now (snapshot on the worker thread, file I/O on another)."""
        if self.checkpoint_dir is None:
            return []
        paths = []
        for uid, backend in self.experts.items():
            ckpt = await backend.snapshot()
            paths.append(await asyncio.to_thread(self._store(uid).save, ckpt))
        return paths

    async def close(self, drain_timeout: float = 10.0) -> None:
        """Refuse new requests, wait for those in flight (bounded), checkpoint, stop the workers."""
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout):
                await self._idle.wait()
        for backend in self.experts.values():
            await backend.close(drain_timeout)
        try:
            await self.checkpoint()
        except OSError:
            logger.exception("final checkpoint failed")
        for executor in self._executors:
            await asyncio.to_thread(executor.shutdown, True)

    def _store(self, uid: str) -> CheckpointStore:
        assert self.checkpoint_dir is not None
        return CheckpointStore(self.checkpoint_dir / uid, self.keep_checkpoints)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_interval_s)
            try:
                await self.checkpoint()
            except (OSError, CheckpointError):
                logger.exception("periodic checkpoint failed; will retry")

    # -- handlers --------------------------------------------------------------------------------

    def _backend(self, msg: Message) -> ExpertBackend:
        if self.closing:
            raise RemoteError("unavailable", "host is shutting down")
        uid = msg.fields.get("uid")
        backend = self.experts.get(uid) if isinstance(uid, str) else None
        if backend is None:
            raise RemoteError(UnknownExpert.code, f"no expert {str(uid)[:64]!r} here")
        return backend

    def _reply_compression(self, msg: Message) -> Compression:
        """Replies travel as the request asks (``wire``: float16, the default, int8 or int4); see
        RemoteExpert. Checked before any compute, so a request with an unknown format costs nothing."""
        wire = msg.fields.get("wire", "float16")
        if wire == "int8":
            return Compression.INT8
        if wire == "int4":
            return Compression.INT4
        if wire == "float16":
            return self.reply_compression
        raise RemoteError("bad_input", f"unknown wire format {str(wire)[:32]!r}; known: float16, int8, int4")

    async def _forward(self, msg: Message, ctx: CallContext) -> Message:
        backend = self._backend(msg)
        compression = self._reply_compression(msg)
        if len(msg.tensors) != 1:
            raise RemoteError("bad_input", f"moe.forward takes 1 tensor, got {len(msg.tensors)}")
        aid = _aid(msg)
        with self._tracked():
            before = backend.stats.steps
            outputs = await _as_remote(backend.forward(ctx.peer_id, aid, msg.tensors[0]))
            version = before if backend.stats.steps == before else -1
        fields = {"version": version, **self._served(ctx.peer_id, False, [(aid, backend.uid, len(outputs))])}
        return Message(Kind.RESPONSE, 0, fields=fields, tensors=[outputs], compression=compression)

    async def _backward(self, msg: Message, ctx: CallContext) -> Message:
        backend = self._backend(msg)
        compression = self._reply_compression(msg)
        if len(msg.tensors) not in (1, 2):
            raise RemoteError("bad_input", f"moe.backward takes 1 or 2 tensors, got {len(msg.tensors)}")
        inputs = msg.tensors[1] if len(msg.tensors) == 2 else None
        aid = _aid(msg)
        with self._tracked():
            grads = await _as_remote(backend.backward(ctx.peer_id, aid, msg.tensors[0], inputs))
        fields = self._served(ctx.peer_id, True, [(aid, backend.uid, len(grads))])
        return Message(Kind.RESPONSE, 0, fields=fields, tensors=[grads], compression=compression)

    async def _forward_many(self, msg: Message, ctx: CallContext) -> Message:
        return await self._many(msg, ctx, backward=False)

    async def _backward_many(self, msg: Message, ctx: CallContext) -> Message:
        return await self._many(msg, ctx, backward=True)

    async def _many(self, msg: Message, ctx: CallContext, *, backward: bool) -> Message:
        if self.closing:
            raise RemoteError("unavailable", "host is shutting down")
        compression = self._reply_compression(msg)
        uids, aids, rows = (msg.fields.get(k) for k in ("uids", "aids", "rows"))
        if not (isinstance(uids, list) and isinstance(aids, list) and isinstance(rows, list)):
            raise RemoteError("bad_input", "uids, aids and rows must be lists of one length, at least one")
        if not uids or not len(uids) == len(aids) == len(rows):
            raise RemoteError("bad_input", "uids, aids and rows must be lists of one length, at least one")
        if len(uids) > MAX_MANY:
            raise RemoteError("bad_input", f"at most {MAX_MANY} experts in one call, not {len(uids)}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in rows):
            raise RemoteError("bad_input", "rows must be positive ints")
        if len(msg.tensors) != 1 or msg.tensors[0].dim() < 1 or msg.tensors[0].shape[0] != sum(rows):
            raise RemoteError("bad_input", "one tensor whose first dimension is the sum of rows")
        parts = torch.split(msg.tensors[0], rows)

        versions = [-1] * len(uids)

        async def one(i: int, uid: object) -> torch.Tensor:
            backend = self.experts.get(uid) if isinstance(uid, str) else None
            if backend is None:
                raise RemoteError(UnknownExpert.code, f"no expert {str(uid)[:64]!r} here")
            item = aids[i]
            if not isinstance(item, str):
                raise RemoteError("bad_input", "aids must be strs")
            if backward:
                return await _as_remote(backend.backward(ctx.peer_id, item, parts[i]))
            before = backend.stats.steps
            # a copy, so the activation cache holds (and counts) this expert's rows, not the message's
            out = await _as_remote(backend.forward(ctx.peer_id, item, parts[i].clone()))
            versions[i] = before if backend.stats.steps == before else -1
            return out

        with self._tracked():
            answers = await asyncio.gather(*(one(i, u) for i, u in enumerate(uids)), return_exceptions=True)
        codes: list[str] = []
        ok: list[torch.Tensor] = []
        served: list[tuple[str, str, int]] = []
        for i, answer in enumerate(answers):
            if isinstance(answer, torch.Tensor):
                codes.append("")
                ok.append(answer)
                served.append((str(aids[i]), str(uids[i]), len(answer)))
            elif isinstance(answer, RemoteError):
                codes.append(answer.code)
            elif isinstance(answer, Exception):
                logger.exception("an expert of a batched call failed", exc_info=answer)
                codes.append("internal")
            else:
                raise answer  # cancellation
        tensors = [torch.cat(ok)] if ok else []
        fields: dict[str, Any] = {"codes": codes, **self._served(ctx.peer_id, backward, served)}
        if not backward:
            fields["versions"] = versions
        return Message(Kind.RESPONSE, 0, fields=fields, tensors=tensors, compression=compression)

    def _served(self, trainer: str, backward: bool, served: list[tuple[str, str, int]]) -> dict[str, Any]:
        """The reply's countersignature of ``served`` ((activation id, uid, samples) that answered):
        one Ed25519 signature per reply, however many experts (see the module docstring)."""
        if self.signer is None or not served:
            return {}
        at = time.time()
        leaves = [served_leaf(receipt_id_of(trainer, aid, backward), uid, n) for aid, uid, n in served]
        signature = countersign(self.signer, trainer, backward, at, leaves)
        return {"served_at": at, "host_key": self.signer.public_key, "host_sig": signature}

    async def _info(self, msg: Message, ctx: CallContext) -> Message:
        backend = self._backend(msg)
        fields: dict[str, Any] = {**backend.spec.to_fields(), "input_shape": list(backend.input_shape)}
        return Message(Kind.RESPONSE, 0, fields=fields)

    async def _state(self, msg: Message, ctx: CallContext) -> Message:
        backend = self._backend(msg)
        nbytes, count = weights_nbytes(backend.module), len(backend.module.state_dict())
        if nbytes > STATE_MAX_BYTES or count > STATE_MAX_TENSORS:
            raise RemoteError(
                "too_large",
                f"{backend.uid}: {count} tensors of {nbytes} bytes in all; one reply carries at most "
                f"{STATE_MAX_TENSORS} tensors and {STATE_MAX_BYTES} bytes",
            )
        with self._tracked():
            names, tensors, steps = await backend.weights()
            digest = await asyncio.to_thread(weights_digest, names, tensors)
        fields = {"names": names, "steps": steps, "sha256": digest}
        return Message(Kind.RESPONSE, 0, fields=fields, tensors=tensors, compression=Compression.NONE)

    @contextlib.contextmanager
    def _tracked(self) -> Any:
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()


async def _as_remote(coro: Any) -> torch.Tensor:
    """Our typed errors become the RemoteError codes trainers act on."""
    try:
        result: torch.Tensor = await coro
    except ExpertRequestError as e:
        raise RemoteError(e.code, str(e)) from e
    return result


def _aid(msg: Message) -> str:
    aid = msg.fields.get("aid")
    if not isinstance(aid, str):
        raise RemoteError("bad_input", "field 'aid' (activation id) must be a str")
    return aid
