"""RemoteExpert: a hosted expert used like a local ``nn.Module`` from synchronous training code.

Autograd calls :class:`_RemoteCall`'s ``forward`` and ``backward`` on the training thread; both hand one
coroutine to the :class:`LoopThread` that runs the Peer, and wait a bounded time. Bytes are what a remote
expert costs, so:

- inputs go out in ``wire_dtype`` (float16 by default: half of float32), and the host replies in float16;
  an experiment may choose ``wire="int8"`` (:data:`WIRE_FORMATS`): inputs, outputs and both gradients then
  travel as 8-bit blockwise absmax (``engine.wire.compression``), about half of float16's bytes, and the
  host answers in the format the request asks for; ``wire="int4"`` halves that again (4-bit, 7 levels a
  side: benchmarks/activation_compression.py measures what it costs the language model). Error feedback
  does not apply here: every call carries other samples, so there is no residual to carry into the next
  one;
- the forward's activation id lets the host keep the inputs, so backward sends only the output gradient;
  only if the host answers ``inputs_evicted`` are the inputs sent again (the copy kept here is the exact
  wire tensor, so the host recomputes exactly what it answered).

Every failure surfaces as :class:`ExpertCallFailed` carrying the host's error code, or ``"timeout"`` /
``"connection"`` for transport failures, within the call's timeout.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import torch
from torch import nn

from engine.p2p import P2PError, Peer, RemoteError, RpcTimeout
from engine.wire import Compression, all_finite

from .errors import ExpertCallFailed
from .loop_thread import LoopThread
from .registry import ExpertSpec

__all__ = ["WIRE_FORMATS", "RemoteExpert", "new_activation_id"]

#: What an experiment may choose for expert calls: the name (sent in each request's ``wire`` field, so the
#: host replies alike) and how the request's tensors are encoded on top of ``wire_dtype``.
WIRE_FORMATS: dict[str, Compression] = {
    "float16": Compression.NONE,
    "int8": Compression.INT8,
    "int4": Compression.INT4,
}

#: Slack for the outer wait in the training thread, over the RPC's own timeout, so the RPC's clearer
#: error (with the method and the host) wins the race.
_OUTER_SLACK_S = 2.0


def new_activation_id() -> str:
    return secrets.token_hex(8)


class RemoteExpert(nn.Module):
    """Calls expert ``uid`` on ``host_peer_id`` through ``peer`` (which runs on ``loop``)."""

    def __init__(
        self,
        peer: Peer,
        host_peer_id: str,
        uid: str,
        *,
        loop: LoopThread,
        timeout: float = 30.0,
        wire_dtype: torch.dtype = torch.float16,
        wire: str = "float16",
    ) -> None:
        super().__init__()
        if wire not in WIRE_FORMATS:
            raise ValueError(f"unknown wire format {wire!r}; known: {sorted(WIRE_FORMATS)}")
        self.wire = wire
        self.peer = peer
        self.host_peer_id = host_peer_id
        self.uid = uid
        self.loop = loop
        self.timeout = timeout
        self.wire_dtype = wire_dtype
        self.resends = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RemoteCall.apply(self, x)  # type: ignore[no-untyped-call]
        return out

    def info(self) -> ExpertSpec:
        """The host's spec for this expert (from ``moe.info``)."""
        reply = self._run(self._call("moe.info", {"uid": self.uid}, []), "info")
        return ExpertSpec.from_fields(reply[1])

    # -- wire tensors: prepared on the training thread, sent from the loop ----------------------

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        """Detached, CPU, contiguous, in ``wire_dtype``: the conversion stays off the event loop."""
        return t.detach().to("cpu", self.wire_dtype).contiguous()

    async def call_forward(self, activation_id: str, wire_inputs: torch.Tensor) -> torch.Tensor:
        return (await self.forward_reply(activation_id, wire_inputs))[0]

    async def forward_reply(
        self, activation_id: str, wire_inputs: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The outputs and the reply's fields (its countersignature and version: ``host_call``)."""
        _, fields, tensors = await self._call(
            "moe.forward", {"uid": self.uid, "aid": activation_id, "wire": self.wire}, [wire_inputs]
        )
        return _one_tensor(tensors, self.uid), fields

    async def call_backward(
        self, activation_id: str, wire_grad: torch.Tensor, wire_inputs: torch.Tensor
    ) -> torch.Tensor:
        return (await self.backward_reply(activation_id, wire_grad, wire_inputs))[0]

    async def backward_reply(
        self, activation_id: str, wire_grad: torch.Tensor, wire_inputs: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Input gradient and the reply's fields; re-sends the inputs once if the host evicted them."""
        deadline = time.monotonic() + self.timeout
        fields = {"uid": self.uid, "aid": activation_id, "wire": self.wire}
        try:
            _, reply, tensors = await self._call("moe.backward", fields, [wire_grad])
        except ExpertCallFailed as e:
            if e.code != "inputs_evicted":
                raise
            self.resends += 1
            remaining = max(0.001, deadline - time.monotonic())
            _, reply, tensors = await self._call("moe.backward", fields, [wire_grad, wire_inputs], remaining)
        return _one_tensor(tensors, self.uid), reply

    async def _call(
        self, method: str, fields: dict[str, Any], tensors: list[torch.Tensor], timeout: float | None = None
    ) -> tuple[str, dict[str, Any], list[torch.Tensor]]:
        where = f"{method} {self.uid} on {self.host_peer_id[:12]}"
        try:
            reply = await self.peer.call(
                self.host_peer_id,
                method,
                fields,
                tensors,
                timeout=timeout if timeout is not None else self.timeout,
                compression=WIRE_FORMATS[self.wire],  # NONE: already in wire_dtype
            )
        except RemoteError as e:
            raise ExpertCallFailed(f"{where}: {e}", e.code) from e
        except (RpcTimeout, TimeoutError) as e:
            raise ExpertCallFailed(f"{where}: no answer in time ({e})", "timeout") from e
        except P2PError as e:
            raise ExpertCallFailed(f"{where}: {type(e).__name__}: {e}", "connection") from e
        return method, reply.fields, reply.tensors

    def _run(self, coro: Any, what: str) -> Any:
        try:
            return self.loop.run(coro, self.timeout + _OUTER_SLACK_S)
        except TimeoutError as e:
            raise ExpertCallFailed(f"{what} {self.uid} on {self.host_peer_id[:12]}: {e}", "timeout") from e


def _one_tensor(tensors: list[torch.Tensor], uid: str) -> torch.Tensor:
    """A host's reply is untrusted: one floating tensor of finite values, or the call failed."""
    if len(tensors) != 1:
        raise ExpertCallFailed(f"{uid}: host sent {len(tensors)} tensors, expected 1", "bad_reply")
    got = tensors[0]
    if not got.is_floating_point() or not all_finite(got):
        raise ExpertCallFailed(
            f"{uid}: host replied non-finite or non-float values ({got.dtype})", "bad_reply"
        )
    return got


class _RemoteCall(torch.autograd.Function):
    """Forward and backward of one remote expert call, as autograd sees them."""

    @staticmethod
    def forward(ctx: Any, expert: RemoteExpert, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        aid = new_activation_id()
        wire_x = expert.to_wire(x)
        out = expert._run(expert.call_forward(aid, wire_x), "forward")
        _check_reply(out, x, expert.uid)
        ctx.expert, ctx.aid, ctx.wire_x = expert, aid, wire_x
        ctx.like = (x.device, x.dtype)
        result: torch.Tensor = out.to(x.device, x.dtype)
        return result

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, torch.Tensor]:  # type: ignore[override]
        expert: RemoteExpert = ctx.expert
        wire_grad = expert.to_wire(grad_out)
        grad = expert._run(expert.call_backward(ctx.aid, wire_grad, ctx.wire_x), "backward")
        _check_reply(grad, ctx.wire_x, expert.uid)
        device, dtype = ctx.like
        return None, grad.to(device, dtype)


def _check_reply(got: torch.Tensor, like: torch.Tensor, uid: str) -> None:
    """A host's reply is untrusted: a wrong shape must not reach the trainer's graph."""
    if got.shape != like.shape or not got.is_floating_point():
        raise ExpertCallFailed(
            f"{uid}: host replied {got.dtype} {tuple(got.shape)} for input {tuple(like.shape)}", "bad_reply"
        )
