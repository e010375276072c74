"""One request per host and layer: a mixture layer's calls to several experts of one host, together.

A language model's step routes every token, so with hundreds of experts per layer it touches most of
them; one RPC per expert would be hundreds of messages a step, each paying the transport's per-message
cost. :func:`forward_many` and :func:`backward_many` send all of one layer's calls to one host as one
``moe.forward_many`` / ``moe.backward_many`` message (the server's docstring has the format) and give
back one answer per expert: its tensor, or the :class:`ExpertCallFailed` that expert alone failed with.
A whole-message failure (timeout, connection) fails every expert of the message alike.

Replies are untrusted: a tensor per ``""`` code, in order, each of the shape its inputs had and finite;
anything else fails the experts concerned with ``bad_reply``. What the host says of its answers (its
countersignature, each expert's version) comes back beside them (:class:`HostReply`) and is read by
:func:`reply_proofs` and :func:`reply_versions`, which take nothing on trust either: a malformed
countersignature is no proof (the receipt goes without one and the coordinator refuses it, counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.p2p import P2PError, Peer, RemoteError, RpcTimeout
from engine.wire import all_finite
from engine.wire.statements import HostProof, host_proofs, receipt_id_of, served_leaf

from .client import WIRE_FORMATS
from .errors import ExpertCallFailed

__all__ = ["Answer", "HostReply", "backward_many", "forward_many", "reply_proofs", "reply_versions"]

Answer = torch.Tensor | ExpertCallFailed


@dataclass
class HostReply:
    """One expert per request's entry (its tensor or its failure) and the reply's fields."""

    answers: list[Answer]
    fields: Mapping[str, Any] = field(default_factory=dict)


def reply_proofs(
    fields: Mapping[str, Any], trainer_peer_id: str, backward: bool, served: Sequence[tuple[str, str, int]]
) -> list[HostProof] | None:
    """The host's countersignature of ``served`` ((activation id, uid, samples) of each expert that
    answered, in order), one proof per expert; None when the reply has none that is well formed."""
    at, key, sig = fields.get("served_at"), fields.get("host_key"), fields.get("host_sig")
    if not (isinstance(at, float) and isinstance(key, bytes) and isinstance(sig, bytes)):
        return None
    if len(key) != 32 or len(sig) != 64 or not served:
        return None
    leaves = [served_leaf(receipt_id_of(trainer_peer_id, aid, backward), uid, n) for aid, uid, n in served]
    return host_proofs(key, at, sig, leaves)


def reply_versions(fields: Mapping[str, Any], n: int) -> list[int]:
    """Each expert's stated version (update steps; -1: unknown) from ``version`` or ``versions``."""
    got = fields.get("versions", [fields.get("version")] if n == 1 else None)
    if not isinstance(got, list) or len(got) != n:
        return [-1] * n
    return [v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else -1 for v in got]


async def forward_many(
    peer: Peer,
    host: str,
    uids: Sequence[str],
    aids: Sequence[str],
    inputs: Sequence[torch.Tensor],
    *,
    wire: str,
    timeout: float,
) -> HostReply:
    """Each expert's outputs for its wire inputs (kept by the host for :func:`backward_many`)."""
    return await _many(peer, host, "moe.forward_many", uids, aids, inputs, wire, timeout)


async def backward_many(
    peer: Peer,
    host: str,
    uids: Sequence[str],
    aids: Sequence[str],
    grads: Sequence[torch.Tensor],
    *,
    wire: str,
    timeout: float,
) -> HostReply:
    """Each expert's input gradient for its output gradient; one whose inputs the host evicted fails
    with ``inputs_evicted`` (the caller re-sends them with a single ``moe.backward``)."""
    return await _many(peer, host, "moe.backward_many", uids, aids, grads, wire, timeout)


async def _many(
    peer: Peer,
    host: str,
    method: str,
    uids: Sequence[str],
    aids: Sequence[str],
    parts: Sequence[torch.Tensor],
    wire: str,
    timeout: float,
) -> HostReply:
    where = f"{method} of {len(uids)} experts on {host[:12]}"
    fields = {"uids": list(uids), "aids": list(aids), "rows": [len(p) for p in parts], "wire": wire}
    try:
        reply = await peer.call(
            host, method, fields, [torch.cat(list(parts))], timeout=timeout, compression=WIRE_FORMATS[wire]
        )
    except RemoteError as e:
        return HostReply(_all(uids, ExpertCallFailed(f"{where}: {e}", e.code)))
    except (RpcTimeout, TimeoutError) as e:
        return HostReply(_all(uids, ExpertCallFailed(f"{where}: no answer in time ({e})", "timeout")))
    except P2PError as e:
        return HostReply(_all(uids, ExpertCallFailed(f"{where}: {type(e).__name__}: {e}", "connection")))
    return HostReply(_answers(where, uids, parts, reply.fields, reply.tensors), reply.fields)


def _answers(
    where: str,
    uids: Sequence[str],
    parts: Sequence[torch.Tensor],
    fields: Mapping[str, Any],
    tensors: list[torch.Tensor],
) -> list[Answer]:
    codes = fields.get("codes")
    if not isinstance(codes, list) or len(codes) != len(uids) or not all(isinstance(c, str) for c in codes):
        return _all(
            uids, ExpertCallFailed(f"{where}: the reply's codes do not match the request", "bad_reply")
        )
    ok = [i for i, code in enumerate(codes) if code == ""]
    got = tensors[0] if len(tensors) == 1 else None
    rows = sum(len(parts[i]) for i in ok)
    if ok and (
        got is None
        or not got.is_floating_point()
        or tuple(got.shape) != (rows, *parts[ok[0]].shape[1:])
        or not all_finite(got)
    ):
        shape = None if got is None else tuple(got.shape)
        bad = ExpertCallFailed(f"{where}: replied {shape} for {rows} rows, or non-finite values", "bad_reply")
        return [bad if c == "" else _failed(where, uids[i], c) for i, c in enumerate(codes)]
    answers: list[Answer] = [_failed(where, uids[i], c) if c else torch.empty(0) for i, c in enumerate(codes)]
    if ok:
        assert got is not None
        for i, out in zip(ok, torch.split(got, [len(parts[i]) for i in ok]), strict=True):
            answers[i] = out
    return answers


def _failed(where: str, uid: str, code: str) -> ExpertCallFailed:
    return ExpertCallFailed(f"{where}: {uid} failed ({code[:32]})", code[:32])


def _all(uids: Sequence[str], error: ExpertCallFailed) -> list[Answer]:
    return [error for _ in uids]
