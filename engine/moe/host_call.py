"""One request per host and layer: a mixture layer's calls to several experts of one host, together.

A language model's step routes every token, so with hundreds of experts per layer it touches most of
them; one RPC per expert would be hundreds of messages a step, each paying the transport's per-message
cost. :func:`forward_many` and :func:`backward_many` send all of one layer's calls to one host as one
``moe.forward_many`` / ``moe.backward_many`` message (the server's docstring has the format) and give
back one answer per expert: its tensor, or the :class:`ExpertCallFailed` that expert alone failed with.
A whole-message failure (timeout, connection) fails every expert of the message alike.

Replies are untrusted: a tensor per ``""`` code, in order, each of the shape its inputs had and finite;
anything else fails the experts concerned with ``bad_reply``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.p2p import P2PError, Peer, RemoteError, RpcTimeout
from engine.wire import all_finite

from .client import WIRE_FORMATS
from .errors import ExpertCallFailed

__all__ = ["Answer", "backward_many", "forward_many"]

Answer = torch.Tensor | ExpertCallFailed


async def forward_many(
    peer: Peer,
    host: str,
    uids: Sequence[str],
    aids: Sequence[str],
    inputs: Sequence[torch.Tensor],
    *,
    wire: str,
    timeout: float,
) -> list[Answer]:
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
) -> list[Answer]:
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
) -> list[Answer]:
    where = f"{method} of {len(uids)} experts on {host[:12]}"
    fields = {"uids": list(uids), "aids": list(aids), "rows": [len(p) for p in parts], "wire": wire}
    try:
        reply = await peer.call(
            host, method, fields, [torch.cat(list(parts))], timeout=timeout, compression=WIRE_FORMATS[wire]
        )
    except RemoteError as e:
        return _all(uids, ExpertCallFailed(f"{where}: {e}", e.code))
    except (RpcTimeout, TimeoutError) as e:
        return _all(uids, ExpertCallFailed(f"{where}: no answer in time ({e})", "timeout"))
    except P2PError as e:
        return _all(uids, ExpertCallFailed(f"{where}: {type(e).__name__}: {e}", "connection"))
    codes = reply.fields.get("codes")
    if not isinstance(codes, list) or len(codes) != len(uids) or not all(isinstance(c, str) for c in codes):
        return _all(
            uids, ExpertCallFailed(f"{where}: the reply's codes do not match the request", "bad_reply")
        )
    ok = [i for i, code in enumerate(codes) if code == ""]
    got = reply.tensors[0] if len(reply.tensors) == 1 else None
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
