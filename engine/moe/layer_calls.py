"""One mixture layer's requests to the experts a batch chose, and what its observer is told of them.

The calls to one host travel as one request (:mod:`.host_call`'s ``forward_many``/``backward_many``;
a single expert takes the plain call, which any host version answers). Forward waits until every sample
has ``k_min`` answers, then at most ``grace_s`` more, and drops the rest; backward skips an expert that
fails or is late, and re-sends the inputs a host evicted through the plain call. Every request, answered
or not, becomes a :class:`CallRecord` for the layer's observer (receipts, spot checks, host health),
with what the host said of it: its countersignature (the receipt's proof) and the expert's version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.p2p import Peer
from engine.wire.statements import HostProof, receipt_id_of

from .client import RemoteExpert
from .errors import ExpertCallFailed
from .host_call import Answer, HostReply, backward_many, forward_many, reply_proofs, reply_versions

__all__ = ["CallObserver", "CallRecord", "ExpertCalls", "PlannedCall", "by_host", "evicted"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallRecord:
    """One expert request of a mixture layer, as its observer sees it (receipts, spot checks, health).

    ``ok`` is False for a failed call (``code``: the host's error code, ``"timeout"``, ``"connection"``)
    and for one dropped after the grace period (``"late"``). Forward records carry the wire inputs and
    the reply, so a spot check can recompute exactly what the host computed, and the ``version`` the
    host stated (-1: unknown). ``receipt_id`` and ``proof`` (the host's countersignature; None when its
    reply had none) are what the receipt of an answered request carries.
    """

    uid: str
    host: str
    samples: int
    backward: bool
    ok: bool
    code: str
    served_at: float  # unix time the request was sent
    elapsed_s: float
    inputs: torch.Tensor | None = None
    outputs: torch.Tensor | None = None
    receipt_id: str = ""
    proof: HostProof | None = None
    version: int = -1


#: Called on the layer's event loop for every request; must be quick and must not raise.
CallObserver = Callable[[CallRecord], None]


@dataclass
class PlannedCall:
    """One expert's share of a batch: which samples, in which of their k slots."""

    expert: RemoteExpert
    rows: torch.Tensor  # sample indices
    slots: torch.Tensor  # which of the k slots of those samples


class ExpertCalls:
    """The requests of one layer (its peer, wire format, timeout, ``k_min``, grace and observer)."""

    def __init__(
        self,
        peer: Peer,
        *,
        wire: str,
        timeout: float,
        k_min: int,
        grace_s: float,
        observer: CallObserver | None,
    ) -> None:
        self.peer, self.wire, self.timeout = peer, wire, timeout
        self.k_min, self.grace_s, self.observer = k_min, grace_s, observer

    async def forward(
        self, plan: list[PlannedCall], wire: list[torch.Tensor], aids: list[str], n_samples: int
    ) -> dict[int, torch.Tensor]:
        """Results by plan index: wait for k_min answers per sample, then ``grace_s``, then drop the rest.
        The calls to one host travel as one request (:mod:`.host_call`)."""
        loop = asyncio.get_running_loop()
        tasks = {
            loop.create_task(self._host_forward(plan, wire, aids, group)): group
            for group in by_host(plan).values()
        }
        counts = torch.zeros(n_samples, dtype=torch.long)
        results: dict[int, torch.Tensor] = {}
        deadline = time.monotonic() + self.timeout
        pending = set(tasks)
        try:
            while pending and (remaining := deadline - time.monotonic()) > 0:
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.exception() is not None:
                        continue
                    for i, y in task.result().items():
                        if y.shape == wire[i].shape:
                            results[i] = y
                            counts[plan[i].rows] += 1
                if bool((counts >= self.k_min).all()) and deadline > time.monotonic() + self.grace_s:
                    deadline = time.monotonic() + self.grace_s
        finally:
            for task in pending:
                task.cancel()
        return results

    async def backward(
        self, plan: list[PlannedCall], aids: list[str], grads: list[torch.Tensor], wire: list[torch.Tensor]
    ) -> dict[int, torch.Tensor]:
        """Input gradients by plan index, one request per host; a failed or late expert is skipped."""
        groups = list(by_host(plan).values())
        coros = [
            asyncio.wait_for(self._host_backward(plan, aids, grads, wire, group), self.timeout)
            for group in groups
        ]
        answers: dict[int, torch.Tensor] = {}
        for got in await asyncio.gather(*coros, return_exceptions=True):
            if isinstance(got, dict):
                answers.update((i, a) for i, a in got.items() if a.shape == grads[i].shape)
        return answers

    async def _host_forward(
        self, plan: list[PlannedCall], wire: list[torch.Tensor], aids: list[str], group: list[int]
    ) -> dict[int, torch.Tensor]:
        if len(group) == 1:  # one expert: the plain call (any host version answers it)
            i = group[0]
            try:
                return {
                    i: await self._observed(
                        plan[i], plan[i].expert.forward_reply(aids[i], wire[i]), False, aids[i], wire[i]
                    )
                }
            except ExpertCallFailed:
                return {}
        answers = await self._send_group(forward_many, plan, group, aids, wire, False, wire)
        return {i: a for i, a in zip(group, answers, strict=True) if isinstance(a, torch.Tensor)}

    async def _host_backward(
        self,
        plan: list[PlannedCall],
        aids: list[str],
        grads: list[torch.Tensor],
        wire: list[torch.Tensor],
        group: list[int],
    ) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        retry = group
        if len(group) > 1:
            answers = await self._send_group(backward_many, plan, group, aids, grads, True, None)
            out = {i: a for i, a in zip(group, answers, strict=True) if isinstance(a, torch.Tensor)}
            retry = [i for i, a in zip(group, answers, strict=True) if evicted(a)]
        for i in retry:  # the plain call re-sends the inputs the host evicted
            coro = plan[i].expert.backward_reply(aids[i], grads[i], wire[i])
            try:
                out[i] = await self._observed(plan[i], coro, True, aids[i])
            except ExpertCallFailed:
                continue
        return out

    async def _send_group(
        self,
        many: Any,
        plan: list[PlannedCall],
        group: list[int],
        aids: list[str],
        tensors: list[torch.Tensor],
        backward: bool,
        inputs: list[torch.Tensor] | None,
    ) -> list[Answer]:
        """One host's request for ``group`` (``forward_many`` or ``backward_many``), observed per expert;
        an expert whose inputs were evicted is observed by the plain call that re-sends them."""
        served_at, t0 = time.time(), time.monotonic()
        answers: list[Answer] | None = None
        reply: HostReply | None = None
        try:
            reply = await many(
                self.peer,
                plan[group[0]].expert.host_peer_id,
                [plan[i].expert.uid for i in group],
                [aids[i] for i in group],
                [tensors[i] for i in group],
                wire=self.wire,
                timeout=self.timeout,
            )
            answers = reply.answers
            return answers
        finally:
            got: list[Answer | None] = list(answers) if answers is not None else [None] * len(group)
            kept = [(i, a) for i, a in zip(group, got, strict=True) if not evicted(a)]
            self._observe_group(
                plan,
                [i for i, _ in kept],
                None if answers is None else [a for _, a in kept if a is not None],
                backward,
                served_at,
                time.monotonic() - t0,
                inputs,
                self._said(reply, plan, group, aids, backward) if self.observer is not None else {},
                aids,
            )

    def _said(
        self,
        reply: HostReply | None,
        plan: list[PlannedCall],
        group: list[int],
        aids: list[str],
        backward: bool,
    ) -> dict[int, tuple[HostProof | None, int, float | None]]:
        """By plan index: the host's proof, version and time of serving of each expert that answered."""
        if reply is None:
            return {}
        answered = [(n, i) for n, i in enumerate(group) if isinstance(reply.answers[n], torch.Tensor)]
        served = [(aids[i], plan[i].expert.uid, len(plan[i].rows)) for _, i in answered]
        proofs = reply_proofs(reply.fields, self.peer.peer_id, backward, served)
        versions = reply_versions(reply.fields, len(group)) if not backward else [-1] * len(group)
        return {
            i: (
                proofs[k] if proofs else None,
                versions[n],
                proofs[k].served_at if proofs else None,
            )
            for k, (n, i) in enumerate(answered)
        }

    def _observe_group(
        self,
        plan: list[PlannedCall],
        group: list[int],
        answers: list[Answer] | None,
        backward: bool,
        served_at: float,
        elapsed: float,
        inputs: list[torch.Tensor] | None,
        said: dict[int, tuple[HostProof | None, int, float | None]],
        aids: list[str],
    ) -> None:
        """One record per expert of a host's request (``answers`` None: it was cancelled, late)."""
        if self.observer is None:
            return
        for n, i in enumerate(group):
            answer = None if answers is None else answers[n]
            ok = isinstance(answer, torch.Tensor)
            code = "" if ok else "late" if answer is None else (answer.code or "error")  # type: ignore[union-attr]
            expert = plan[i].expert
            proof, version, at = said.get(i, (None, -1, None))
            record = CallRecord(
                expert.uid,
                expert.host_peer_id,
                len(plan[i].rows),
                backward,
                ok,
                code,
                served_at if at is None else at,
                elapsed,
                None if inputs is None else inputs[i],
                answer if ok else None,  # type: ignore[arg-type]
                receipt_id_of(self.peer.peer_id, aids[i], backward),
                proof,
                version,
            )
            self._tell(record)

    async def _observed(
        self, call: PlannedCall, coro: Any, backward: bool, aid: str, inputs: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Await one request (a ``*_reply`` coroutine) and tell the observer how it went (cancellation:
        ``"late"``)."""
        if self.observer is None:
            result: torch.Tensor = (await coro)[0]
            return result
        served_at, t0 = time.time(), time.monotonic()
        ok, code, out = False, "late", None
        proof: HostProof | None = None
        version = -1
        try:
            out, fields = await coro
            ok, code = True, ""
            served = [(aid, call.expert.uid, len(call.rows))]
            proofs = reply_proofs(fields, self.peer.peer_id, backward, served)
            if proofs:
                proof, served_at = proofs[0], proofs[0].served_at
            version = -1 if backward else reply_versions(fields, 1)[0]
            return out  # type: ignore[no-any-return]
        except ExpertCallFailed as e:
            code = e.code or "error"
            raise
        finally:
            expert = call.expert
            self._tell(
                CallRecord(
                    expert.uid,
                    expert.host_peer_id,
                    len(call.rows),
                    backward,
                    ok,
                    code,
                    served_at,
                    time.monotonic() - t0,
                    inputs,
                    out,
                    receipt_id_of(self.peer.peer_id, aid, backward),
                    proof,
                    version,
                )
            )

    def _tell(self, record: CallRecord) -> None:
        assert self.observer is not None
        try:
            self.observer(record)
        except Exception:  # an observer's bug must not break training
            logger.exception("mixture observer failed")


def evicted(answer: object) -> bool:
    return isinstance(answer, ExpertCallFailed) and answer.code == "inputs_evicted"


def by_host(plan: list[PlannedCall]) -> dict[str, list[int]]:
    """Plan indices grouped by host, in plan order."""
    groups: dict[str, list[int]] = {}
    for i, call in enumerate(plan):
        groups.setdefault(call.expert.host_peer_id, []).append(i)
    return groups
