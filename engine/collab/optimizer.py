"""CollaborativeOptimizer: wraps a torch optimizer so that many trainers take the same steps.

Each call to :meth:`step` (after ``loss.backward()``) adds this batch's gradients, weighted by its size,
to one flat accumulator and updates the published progress. When the collaboration as a whole has
accumulated ``target_batch_size`` samples, the peers due form a group, average their mean gradients
weighted by their sample counts, and every member applies the same averaged gradient with its
optimizer: identical inputs, identical steps.

Epochs hit the target to within half a batch (:mod:`.stepping`): a batch held back keeps its ``.grad``
tensors aside (no extra copy) and counts towards the next epoch; a peer that stops to match publishes
its count with a rate of 0, so the others count it exactly rather than extrapolating samples it no
longer computes. Every ``average_state_every`` epochs the group also averages parameters and optimizer
state (:mod:`.state_averaging`). A peer that could not get into a group, or whose round lost a reducer,
steps with its local gradient for what was not averaged and logs so. After a step a donor snapshots
its state for newcomers (:mod:`.state`). A peer that finds the collaboration ahead of it downloads the
state instead of stepping.

Claims bounded: this peer's weight in a round is its samples, sent as at most ``2 x target_batch_size``
(``allreduce.max_weight``, unless set: every reducer refuses more, so no honest member is refused; a
round's step scale is capped at 2x too); reducers combine parts with CenteredClip (``allreduce.robust``);
the leader counts each member's samples for at most its share of the target
(``matchmaking.target_batch_size``); a state download takes the majority's state, bounded by this
model's size. :attr:`CollaborativeOptimizer.refusals` sums what was refused, by kind and sender.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from engine.dht import DHTNode
from engine.p2p import Peer
from engine.p2p.ice_stats import selected_candidate_types
from engine.wire import Compression

from .allreduce import AllReduceConfig, AllReduceService, RoundReport
from .codec import ErrorFeedback
from .errors import GroupClosed, MatchmakingFailed, Refusals, StateDownloadFailed
from .matchmaking import Matchmaker, MatchmakingConfig
from .progress import CollabProgress
from .reducer import MAX_WEIGHT
from .snapshot import load_snapshot, take_snapshot
from .state import DownloadReport, StateDonor, download_state
from .state_averaging import average_state, averaged_tensors
from .stepping import holds_back, scaled_learning_rate, step_scale
from .tracker import ProgressTracker

logger = logging.getLogger(__name__)

T = TypeVar("T")


def relayed_links(peer: Peer) -> list[str]:
    """The peers this one reaches only through a TURN relay (a relayed peer acts as a client)."""
    return [
        remote for remote, link in peer.links.items() if "relay" in (selected_candidate_types(link.pc) or ())
    ]


@dataclass
class CollabConfig:
    run: str
    target_batch_size: int
    compression: Compression = Compression.NONE
    client: bool = False
    bandwidth: float = 10e6  # bytes/s each way until a round has measured it
    min_reducer_bandwidth: float = 1e5  # below this (bytes/s) a peer only sends and receives
    publish_period_s: float = 1.0
    refresh_period_s: float = 0.5
    serve_state: bool = True
    average_state_every: int = 10  # epochs between parameter + optimizer state averaging; 0: never
    scale_by_samples: bool = True  # scale each step's learning rate by its samples / target (step_scale)
    allreduce: AllReduceConfig = field(default_factory=AllReduceConfig)
    matchmaking: MatchmakingConfig = field(default_factory=MatchmakingConfig)


@dataclass
class StepReport:
    epoch: int  # the epoch this step led into
    group_size: int
    samples: int  # this peer's contribution
    round: RoundReport | None
    alone_because: str | None = None
    state_round: RoundReport | None = None  # the parameter + optimizer state averaging, when due


class CollaborativeOptimizer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        peer: Peer,
        dht: DHTNode,
        config: CollabConfig,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.peer = peer
        self.dht = dht
        self.config = config
        config.matchmaking.compression = config.compression
        config.matchmaking.target_batch_size = config.target_batch_size
        if config.allreduce.max_weight == MAX_WEIGHT:  # not set: twice the target, the step scale's cap
            config.allreduce.max_weight = 2.0 * config.target_batch_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.size = sum(p.numel() for p in self.params)
        self.grad = torch.zeros(self.size, dtype=torch.float32)
        self.samples = 0
        self.samples_processed = 0  # every sample ever accumulated here (the trainer's own work)
        self.epoch = 0
        self.bandwidth = config.bandwidth
        self.tracker = ProgressTracker(dht, config.run, config.target_batch_size)
        self.tracker.local.client = config.client
        self.service = AllReduceService(peer, config.allreduce)
        self.matchmaker = Matchmaker(peer, dht, config.run, config.matchmaking)
        self.donor = StateDonor(peer, dht, config.run) if config.serve_state else None
        self.feedback = ErrorFeedback(self.size, config.compression)
        self.reports: list[StepReport] = []
        self.downloads: list[DownloadReport] = []
        self._last_publish = -math.inf
        self._last_refresh = -math.inf
        self._last_call: float | None = None  # when step() was last called
        self._blocked_s = 0.0  # since then, seconds spent matching, averaging and taking state
        self._diverged_at: float | None = None  # when we last stepped without the others
        self._behind_since: float | None = None  # when we first saw the others an epoch ahead
        self.matchmaker.is_gone = lambda peer_id: peer_id in self.tracker.view.gone
        self.matchmaker.unreachable = self.peer_gone
        peer.link_lost.append(self.peer_gone)

    @property
    def refusals(self) -> Refusals:
        """Every refusal of another peer's claim so far: chunks, joins and groups, state manifests."""
        out = Refusals()
        for part in (self.service.refusals, self.matchmaker.refusals, *(d.refusals for d in self.downloads)):
            out.by_kind.update(part.by_kind)
            out.by_sender.update(part.by_sender)
        return out

    def peer_gone(self, peer_id: str) -> None:
        """A peer's link was lost or a call to it failed: stop counting its progress, waiting for it in
        matchmaking and for its parts in a round now, not when its records expire or a round stalls."""
        if peer_id == self.peer.peer_id or peer_id in self.tracker.view.gone:
            return
        logger.info("peer %s is gone: dropped from progress, matchmaking and rounds", peer_id[:12])
        self.tracker.mark_gone(peer_id)
        self.matchmaker.lost(peer_id)
        self.service.member_lost(peer_id)

    # -- joining ---------------------------------------------------------------------------------

    async def join(self) -> DownloadReport | None:
        """Take the collaboration's state if anyone serves it (a newcomer); publish our progress."""
        report = None
        progress = await self.tracker.refresh()
        try:
            report = await self.download()
        except StateDownloadFailed as e:
            if progress.epoch > 0:
                logger.warning("joining at epoch %d without its state: %s", progress.epoch, e)
            self.epoch = max(self.epoch, progress.epoch)
        self._sync_tracker()
        await self.tracker.publish()
        self._last_publish = time.monotonic()
        return report

    async def download(self, min_epoch: int = 0, keep_grads: bool = False) -> DownloadReport:
        """Take the agreed state; ``keep_grads`` carries this epoch's accumulated gradients over."""
        unlike = b""
        if min_epoch and self.donor is not None and self.donor.snapshot is not None:
            unlike = self.donor.snapshot.manifest_hash
        manifest, blob, report = await download_state(
            self.peer, self.dht, self.config.run, min_epoch=min_epoch, unlike=unlike, model=self.model
        )
        load_snapshot(self.model, self.optimizer, manifest, blob)
        self.epoch = manifest.epoch
        if not keep_grads:
            self.grad.zero_()
            self.samples = 0
        self.downloads.append(report)
        logger.info(
            "took the state of epoch %d from %d donors in %.2f s (corrupt: %s)",
            manifest.epoch,
            len(report.parts_from),
            report.seconds,
            report.corrupt,
        )
        if self.donor is not None:
            await self.donor.publish(take_snapshot(self.config.run, self.epoch, self.model, self.optimizer))
        return report

    # -- training --------------------------------------------------------------------------------

    def accumulate(self, batch_size: int, grads: list[torch.Tensor | None] | None = None) -> None:
        """Add a batch's mean gradients (the parameters' ``.grad``, or ``grads`` held back earlier)."""
        offset = 0
        for i, p in enumerate(self.params):
            n = p.numel()
            g = p.grad if grads is None else grads[i]
            if g is not None:
                self.grad[offset : offset + n].add_(g.reshape(-1), alpha=float(batch_size))
            if grads is None:
                p.grad = None
            offset += n
        self.samples += batch_size
        self.samples_processed += batch_size

    def _sync_tracker(self) -> None:
        self.tracker.local.epoch = self.epoch
        self.tracker.local.samples = self.samples

    async def step(self, batch_size: int) -> StepReport | None:
        """Call after ``loss.backward()``; returns a report when a collaborative step was taken."""
        # Our rate is compute speed, batch by batch: the time between our calls less the time spent
        # in here matching, averaging and taking state (the others extrapolate our progress with it;
        # counting that time would make them think us slower, counting less would make them think
        # us faster, and step early).
        now = time.monotonic()
        if self._last_call is not None and batch_size > 0:
            compute = now - self._last_call - self._blocked_s
            rate = batch_size / max(compute, 1e-3, 0.1 * (now - self._last_call))
            c = self.tracker.local
            c.samples_per_second = (
                rate if c.samples_per_second == 0 else 0.7 * c.samples_per_second + 0.3 * rate
            )
        self._last_call, self._blocked_s = now, 0.0
        return await self._step(batch_size)

    def step_scale(self, samples: int) -> float:
        return step_scale(samples, self.config.target_batch_size) if self.config.scale_by_samples else 1.0

    def near_target(self, progress: CollabProgress, batch_size: int) -> bool:
        """Whether the target may be reached before our next periodic publish: from then on we publish
        (and read) after every batch, so that whoever decides to step sees our count as it is."""
        rate = progress.samples_per_second + self.tracker.local.samples_per_second
        ahead = rate * 2 * max(self.config.publish_period_s, self.config.refresh_period_s)
        return progress.ready or progress.samples + batch_size + ahead >= progress.target

    async def _step(self, batch_size: int) -> StepReport | None:
        now = time.monotonic()
        near = self.near_target(self.tracker.progress(), batch_size)
        refreshed = near or now - self._last_refresh >= self.config.refresh_period_s
        if refreshed:
            self._last_refresh = now
            self._sync_tracker()
            progress = await self.tracker.refresh()
        else:
            progress = self.tracker.progress()
        if progress.epoch > self.epoch:
            self.accumulate(batch_size)
            if refreshed:
                await self._blocking(self._catch_up(progress))
            return None
        if self._diverged_at is not None and now - self._diverged_at > self.config.matchmaking.gather_s * 3:
            await self._blocking(self._resync())
        if progress.due or holds_back(progress.samples, batch_size, progress.target):
            # The collaboration has its batch without this one (or is closer to it), or a peer has
            # already stopped to step: step first, and let this batch count towards the next epoch.
            held: list[torch.Tensor | None] = [p.grad for p in self.params]
            for p in self.params:
                p.grad = None
            report = await self._blocking(self.global_step())
            self.accumulate(batch_size, held)
            self._sync_tracker()
            return report
        self.accumulate(batch_size)
        self._sync_tracker()
        near = self.near_target(self.tracker.progress(), batch_size)
        if near or now - self._last_publish >= self.config.publish_period_s:
            self._last_publish = now
            await self.tracker.publish()
        if self.tracker.progress().ready:
            return await self._blocking(self.global_step())
        return None

    async def _blocking(self, work: Awaitable[T]) -> T:
        """Run ``work`` (matching, averaging, taking state), its time not counted as compute."""
        started = time.monotonic()
        try:
            return await work
        finally:
            self._blocked_s += time.monotonic() - started

    async def _catch_up(self, progress: CollabProgress) -> None:
        logger.info(
            "the collaboration is at epoch %d, we are at %d: taking its state", progress.epoch, self.epoch
        )
        now = time.monotonic()
        if self._behind_since is None:
            self._behind_since = now
        try:
            await self.download(min_epoch=progress.epoch, keep_grads=True)
        except StateDownloadFailed as e:
            patience = 3 * self.config.matchmaking.gather_s + self.config.allreduce.stall_timeout
            if now - self._behind_since < patience:
                return  # its donors may not have published yet: try again at the next refresh
            logger.warning(
                "could not take the state of epoch %d (%s); going on from our own", progress.epoch, e
            )
            self.epoch = progress.epoch
            self.grad.zero_()
            self.samples = 0
        self._behind_since = None
        self._sync_tracker()
        await self.tracker.publish()

    async def _resync(self) -> None:
        """After a step without the others our parameters differ from theirs: take the state most
        donors of our epoch agree on (when it is not ours), once they have published it."""
        self._diverged_at = None
        try:
            report = await self.download(min_epoch=self.epoch)
        except StateDownloadFailed as e:
            logger.info("epoch %d: no other state to resync with (%s)", self.epoch, e)
            return
        logger.info("epoch %d: resynced with %d donors after stepping alone", self.epoch, len(report.donors))

    async def global_step(self) -> StepReport:
        epoch = self.epoch + 1
        client = self.acts_as_client()
        bandwidth = 0.0 if client else self.bandwidth
        alone = None
        report = None
        samples = self.samples
        # We compute nothing while we match: say so, so that the others count our samples exactly
        # instead of extrapolating ones we will never add.
        rate = self.tracker.local.samples_per_second
        self.tracker.local.samples_per_second = 0.0
        self.tracker.local.samples = samples
        self.tracker.local.due = True  # and that the epoch is closed: the others stop and join us
        await self.tracker.publish()
        self.tracker.local.samples_per_second = rate
        self.tracker.local.due = False
        if samples > 0:
            self.grad.div_(samples)
        group = None
        try:
            group = await self.matchmaker.form_group(
                epoch, self.size, bandwidth, client, self._peers_here(), samples=samples
            )
        except GroupClosed as e:
            # The others are stepping without us: keep our gradients for the next epoch and take
            # their state once they publish it (step() sees their epoch ahead of ours).
            if samples > 0:
                self.grad.mul_(samples)
            logger.info("%s; skipping this step, will take its result", e)
            out = StepReport(self.epoch, 0, 0, None, str(e))
            self.reports.append(out)
            return out
        except MatchmakingFailed as e:
            alone = str(e)
            logger.warning("epoch %d: stepping with local gradients only: %s", epoch, e)
        else:
            if len(group.members) == 1:
                alone = "nobody else was due"
            else:
                report = await self.service.all_reduce(group, self.grad, float(samples), self.feedback)
                self._learn_bandwidth(report)
                if not report.complete:
                    logger.warning(
                        "epoch %d: round %s incomplete: excluded %s, failed reducers %s, %d elements local",
                        epoch,
                        group.round_id,
                        list(report.excluded),
                        list(report.failed_reducers),
                        report.local_elements,
                    )
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.grad[offset : offset + n].view_as(p).clone()
            offset += n
        in_step = group.samples if group is not None and alone is None and group.samples else samples
        with scaled_learning_rate(self.optimizer, self.step_scale(in_step)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        state_round = None
        every = self.config.average_state_every
        if group is not None and len(group.members) > 1 and every > 0 and epoch % every == 0:
            state = averaged_tensors(self.params, self.optimizer)
            state_round = await average_state(self.service, group, state)
        others = self.tracker.progress().peers > 1
        if others and (alone is not None or (report is not None and not report.complete)):
            self._diverged_at = time.monotonic()
        self.grad.zero_()
        self.samples = 0
        self.epoch = epoch
        if self.donor is not None:  # state first: whoever sees our new epoch can take it at once
            await self.donor.publish(take_snapshot(self.config.run, epoch, self.model, self.optimizer))
        self._sync_tracker()
        await self.tracker.publish()
        self._last_publish = time.monotonic()
        out = StepReport(epoch, report.group_size if report else 1, samples, report, alone, state_round)
        self.reports.append(out)
        return out

    def _peers_here(self) -> set[str]:
        """Peers whose latest progress says they are in our epoch: the group we expect to form."""
        active = self.tracker.view.active(time.monotonic())
        return {owner for owner, seen in active.items() if seen.progress.epoch == self.epoch}

    def acts_as_client(self) -> bool:
        """Clients send and receive but reduce nothing: peers told so, slow ones, and relayed ones (a
        relay's bandwidth is shared and paid for; reducing through it would slow the whole group)."""
        if self.config.client or self.bandwidth < self.config.min_reducer_bandwidth:
            return True
        return bool(relayed_links(self.peer))

    def _learn_bandwidth(self, report: RoundReport) -> None:
        moved = max(report.bytes_sent, report.bytes_received)
        if report.complete and report.seconds > 0 and moved > 1 << 20:
            self.bandwidth = 0.5 * self.bandwidth + 0.5 * moved / report.seconds
