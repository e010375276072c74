"""TrainerNode: a trainer's place in the swarm.

An account bound to its key, a Peer on the coordinator's signaling, a DHT node (a client: bootstrapped
from the coordinator's peer list) and the :class:`~engine.moe.dht_finder.DHTExpertFinder` on it, and
the receipt book and spot checker fed by the mixture layer's call observer.

With the experiment's ``target_batch_size``, :meth:`TrainerNode.collaborate` wraps the dense optimizer
in a :class:`~engine.collab.CollaborativeOptimizer` on the trainer's Peer and DHT, under the run
``<experiment>.dense``; every trainer of the experiment accumulates gradients on its own batches and
all take the same optimizer step once together they have processed the target. Expert calls, receipts
and spot checks are unchanged: every trainer credits the hosts that answered it. A
:class:`~.collab_status.CollabStatusReporter` on the loop tells the coordinator how the collaboration
goes and how many samples this trainer processed (the swarm page, the leaderboard's Trainers tab).

With ``hold_steps`` (``lah train`` sets it), the work a step observes is held until the training loop
settles the step (:meth:`TrainerNode.settle_step`): a good step's receipts go to the book, those of a
step that stopped the run for a non-finite loss or gradient are withheld (``receipts.stats.withheld``),
so no host is credited for work that trained nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.account.coordinator_api import CoordinatorApi
from engine.account.tokens import Credentials
from engine.collab import CollabConfig, CollaborativeOptimizer, MatchmakingConfig
from engine.dht import DHTError, DHTNode
from engine.dht.p2p_transport import PeerTransport
from engine.moe import ExpertSpec, LoopThread
from engine.moe.dht_finder import DHTExpertFinder
from engine.moe.gather import fetch_state
from engine.moe.layer_calls import CallRecord
from engine.moe.weights import ExpertState
from engine.p2p import Identity, LinkConfig, Peer

from .collab_status import CollabStatusReporter
from .model import DigitsDMoE
from .receipts import ReceiptBook, Work, sign_spot_check
from .spot_check import WIRE_TOLERANCE, SpotChecker
from .trainer import TrainerConfig, TrainStats, remote_model

__all__ = ["TrainerNode"]

#: Failures that say the host is unreachable or going away: the finder prefers its replicas for a while.
HOST_FAILURES = frozenset({"connection", "timeout", "unavailable", "unknown_expert"})
TOKEN_REFRESH_S = 3600.0  # refresh the account token when less than this is left of it


class TrainerNode:
    """A trainer's Peer, DHT node, expert finder, receipts and spot checks (all on ``loop``)."""

    def __init__(
        self,
        coordinator_url: str,
        name: str,
        *,
        loop: LoopThread,
        identity: Identity | None = None,
        config: TrainerConfig | None = None,
        link_config: LinkConfig | None = None,
        receipt_interval_s: float = 2.0,
        credentials: Credentials | None = None,
        on_credentials: Callable[[Credentials], None] | None = None,
        outbox_dir: Path | None = None,
    ) -> None:
        """``credentials``: an existing trainer account's (``lah train``; else ``start`` registers
        ``name``); ``on_credentials`` is told each refreshed token (the old one is revoked by then);
        ``outbox_dir``: where receipts and reports wait while the coordinator is away (the trainer's
        data dir; None: in memory)."""
        self.name, self.loop = name, loop
        self.identity = identity or Identity.generate()
        self.config = config or TrainerConfig()
        self.api = CoordinatorApi(coordinator_url)
        self.link_config = link_config or LinkConfig(connect_timeout=15)
        self.credentials: Credentials | None = credentials
        self.on_credentials = on_credentials
        self.peer: Peer | None = None
        self.dht: DHTNode | None = None
        self.finder: DHTExpertFinder | None = None
        self.receipts = ReceiptBook(
            self.identity,
            self._post_receipts,
            post_report=self._post_report,
            outbox_dir=outbox_dir,
            interval_s=receipt_interval_s,
        )
        self.spot: SpotChecker | None = None
        self.status: CollabStatusReporter | None = None
        self.stats = TrainStats()
        self.hold_steps = False
        #: What the experiment's experts are (the digits grid's ffn; ``lah train`` sets a language
        #: model's): spot checks recompute hosts' answers with it.
        self.expert_spec = ExpertSpec("ffn", self.config.dim, self.config.hidden)
        self._held: list[Work] = []  # this step's work, until settled (on the loop)

    async def start(self) -> None:
        """Register (unless given credentials) and bind (the account needs the ``trainer`` role for
        credit), join, find peers."""
        if self.credentials is None:
            self.credentials = await self.api.register(self.name)
        await self.api.bind_host(self.credentials, self.identity)
        self.peer = Peer(
            self.identity, self.api.signaling_url, config=self.link_config, token_provider=self.token
        )
        await self.peer.start()
        self.dht = DHTNode(
            PeerTransport(self.peer), signer=self.identity, rpc_timeout=10.0, client=self.config.dht_client
        )
        # An assignment with no capacity: no experts, but peers to join through and the key that
        # signs the assignment proofs in hosts' declarations (assigned hosts are preferred).
        joined = await self.api.assignment(await self.token(), self.identity.peer_id, "cpu", 0)
        seeds = list(joined.bootstrap)
        if seeds:
            try:
                await self.dht.bootstrap(seeds)
            except DHTError as e:
                raise RuntimeError(f"the trainer could not join the DHT: {e}") from e
        self.finder = DHTExpertFinder(self.dht, coordinator_key=joined.coordinator_key or None)
        self.spot = SpotChecker(
            self._state_on,
            self.spec_of,
            self._report,
            fraction=self.config.spot_check_fraction,
            tolerance=WIRE_TOLERANCE.get(self.config.wire, WIRE_TOLERANCE["int4"]),
        )
        self.receipts.start()

    async def token(self) -> str:
        """The account's token, refreshed when less than ``TOKEN_REFRESH_S`` of it is left."""
        assert self.credentials is not None, "start() first"
        c = self.credentials
        if c.expires_at - time.time() < TOKEN_REFRESH_S:
            self.credentials = await self.api.refresh(c)
            if self.on_credentials is not None:
                self.on_credentials(self.credentials)
        return self.credentials.token

    async def _post_receipts(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.api.post_receipts(await self.token(), batch)

    def model(self) -> DigitsDMoE:
        assert self.peer is not None and self.finder is not None, "start() first"
        return remote_model(self.peer, self.finder, self.loop, self.config, self.observe)

    async def collaborate(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, run: str | None = None
    ) -> CollaborativeOptimizer:
        """``optimizer`` (default: Adam) over ``model``'s dense parameters, stepping with the experiment's
        other trainers of the run ``run`` (default ``<experiment>.dense``: ``lah train``'s model; another
        model needs a run of its own); takes the collaboration's state if it is under way."""
        cfg = self.config
        if cfg.target_batch_size <= 0:
            raise ValueError("collaborative training needs target_batch_size > 0")
        assert self.peer is not None and self.dht is not None, "start() first"
        collab_config = CollabConfig(
            run=run or f"{cfg.uid_prefix}.dense",
            target_batch_size=cfg.target_batch_size,
            matchmaking=MatchmakingConfig(gather_s=cfg.gather_s, max_wait_s=4 * cfg.gather_s + 4.0),
        )
        if optimizer is None:
            optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        collab = CollaborativeOptimizer(model, optimizer, self.peer, self.dht, collab_config)
        await collab.join()
        self.status = CollabStatusReporter(
            self.api,
            self.token,
            collab,
            cfg.uid_prefix,
            self.identity.peer_id,
            interval_s=cfg.status_interval_s,
        )
        self.status.start()
        return collab

    def refused_line(self) -> str | None:
        """Why some declared hosts were never called (they hold no assignment), for the run's summary."""
        refused = self.finder.refused_hosts if self.finder is not None else {}
        if not refused:
            return None
        names = ", ".join(sorted(h[:12] for h in refused)[:5]) + (" ..." if len(refused) > 5 else "")
        return (
            f"{len(refused)} hosts declared experts without the coordinator's assignment and were not used: "
            f"{names}"
        )

    def observe(self, record: CallRecord) -> None:
        """The mixture's observer (on the loop): receipts, host health, spot checks, counters."""
        self.stats.requests["ok" if record.ok else record.code] += 1
        if record.ok:
            self.stats.served[record.host] += 1
            work = Work(
                record.host,
                record.uid,
                record.samples,
                record.backward,
                record.served_at,
                record.receipt_id or None,
                record.proof,
            )
            if self.hold_steps:
                self._held.append(work)
            else:
                self.receipts.add(work)
            if self.finder is not None:
                self.finder.report_success(record.uid, record.host)
            if self.spot is not None:
                self.spot.consider(record)
        elif record.code in HOST_FAILURES and self.finder is not None:
            self.finder.report_failure(record.uid, record.host)

    def settle_step(self, good: bool) -> None:
        """From the training thread, after each step: release its receipts, or withhold them."""
        self.loop.run(self._settle(good), 30)

    async def _settle(self, good: bool) -> None:
        held, self._held = self._held, []
        if good:
            for work in held:
                self.receipts.add(work)
        else:
            self.receipts.stats.withheld += len(held)

    def spec_of(self, uid: str) -> ExpertSpec | None:
        """The spec of this trainer's experts, every one of which it calls (spot checks recompute
        with it)."""
        return self.expert_spec

    async def _state_on(self, host: str, uid: str) -> ExpertState:
        assert self.peer is not None
        return await fetch_state(self.peer, host, uid, self.expert_spec, timeout=self.config.timeout)

    async def _report(self, host: str, uid: str, start: float, end: float, reason: str) -> None:
        """Sign a spot-check report and give it to the receipt book's outbox (delivered in order)."""
        self.receipts.add_report(sign_spot_check(self.identity, host, uid, start, end, reason))

    async def _post_report(self, report: dict[str, Any]) -> None:
        await self.api.post_spot_check(await self.token(), report)

    async def stop(self) -> None:
        await self._settle(True)  # work since the last settled step (an evaluation's, say)
        await self.receipts.close()
        if self.status is not None:
            await self.status.close()
        if self.spot is not None:
            await self.spot.close()
        if self.finder is not None:
            await self.finder.close()
        if self.dht is not None:
            await self.dht.stop()
        if self.peer is not None:
            await self.peer.stop()
        await self.api.close()
