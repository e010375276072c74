"""Volunteer: the node process's core. Account, signaling, assignment, experts, DHT, governor hooks.

``start()`` runs the join flow (each step retried until ``start_timeout``, with a clear error after):
credentials from the token store (registering an account on first run), the host key bound to the
account (idempotent), the signaling hub joined with a token that refreshes itself near expiry, an
assignment sized by the memory budget, an ExpertServer for it, a DHT node bootstrapped from the
assignment's peers, and a Declarer keeping the experts declared while the node works.

An upkeep task re-asks for the assignment before it lapses and after every signaling reconnect (sleep,
network change), re-declares after reconnects, and retries a DHT bootstrap that found nobody.

As the governor's :class:`~engine.resources.WorkHooks`: ``on_stop_work`` closes the work gate at once
(new requests get ``unavailable``), stops declaring, drains what is in flight (bounded) and frees memory;
``on_resume_work`` restores memory, reopens the gate and declares again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from engine.account.coordinator_api import Assignment, CoordinatorApi
from engine.account.errors import AccountError, CoordinatorError, CoordinatorUnreachable
from engine.account.tokens import Credentials, TokenStore
from engine.dht import AssignmentProof, Declarer, DHTError, DHTNode
from engine.dht.p2p_transport import PeerTransport
from engine.moe import default_device
from engine.moe.batching import DutyCycle
from engine.p2p import Handlers, Identity, P2PError, Peer
from engine.p2p.signaling import signaling_url_of
from engine.resources import Decision, EnergyMeter, Governor, SensorSource, Settings
from engine.resources.limits import cpu_pause_after

from .config import VolunteerConfig
from .gate import WorkGate
from .hosting import Hosting
from .memory import memory_budget
from .reports import Reports
from .status import build_status

logger = logging.getLogger(__name__)

CREDIT_MIN_AGE_S = 3.0  # a reading asked for by a person (refresh_credit): at most this often


class Volunteer:
    def __init__(
        self,
        identity: Identity,
        coordinator_url: str,
        token_store: TokenStore,
        settings: Settings,
        data_dir: Path,
        *,
        device: torch.device | str | None = None,
        account_name: str | None = None,
        team: str | None = None,
        invite: str | None = None,
        sensors: SensorSource | None = None,
        config: VolunteerConfig | None = None,
    ) -> None:
        self.identity = identity
        self.config = config if config is not None else VolunteerConfig()
        self.coordinator_url = coordinator_url.rstrip("/")
        self.token_store = token_store
        self.settings = settings
        self.data_dir = Path(data_dir)
        self.device = torch.device(device) if device is not None else _device_for(settings)
        self.account_name = account_name
        self.team = team
        self.invite = invite
        # With sensors, a Governor decides when this node works; the node is its WorkHooks.
        self.governor: Governor | None = None
        if sensors is not None:
            options = {"energy": EnergyMeter(), **self.config.governor_options}
            self.governor = Governor(settings, sensors, self, **options)
        self.api = CoordinatorApi(self.coordinator_url, timeout=self.config.http_timeout)
        self.handlers = Handlers()
        self.gate = WorkGate()
        # The volunteer's CPU cap: after each batch, rest long enough that our share stays under it.
        duty = (
            DutyCycle(lambda busy: cpu_pause_after(busy, self.settings))
            if self.device.type == "cpu"
            else None
        )
        self.hosting = Hosting(
            self.handlers,
            self.gate,
            self.data_dir,
            self.device,
            checkpoint_interval_s=self.config.checkpoint_interval_s,
            duty=duty,
            signer=self.identity,
        )
        self._peer = Peer(
            identity,
            signaling_url_of(self.coordinator_url),
            handlers=self.handlers,
            config=self.config.link,
            token_provider=self._token,
        )
        self.credentials: Credentials | None = None
        self.assignment: Assignment | None = None
        self.assignment_at = 0.0  # wall time of the last assignment
        self.dht: DHTNode | None = None
        self.declarer: Declarer | None = None
        self.errors: deque[dict[str, Any]] = deque(maxlen=20)
        self.attempts = 0  # coordinator calls that failed during start (retries)
        self.started = False
        self.stopping = False
        self._working = self.governor is None
        self._joins_seen = 0
        self._upkeep: asyncio.Task[None] | None = None
        self.credit: float | None = None  # set when the coordinator reports it
        self.rank: int | None = None  # the account's place on the leaderboard (1 = first)
        self.credit_at: float | None = None  # wall time of the last reading
        self.credit_error: str | None = None  # why the last reading failed (the old one stays shown)
        self._credit_task: asyncio.Task[None] | None = None
        self.energy_reported_kwh = 0.0
        self.reports = Reports(self.data_dir / "outbox", self.api.report_energy)
        self._accounted_at = -math.inf

    # -- what callers use -------------------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def peer(self) -> Peer:
        return self._peer

    @property
    def hosted_uids(self) -> list[str]:
        return self.hosting.uids

    @property
    def token_key(self) -> str:
        return self.coordinator_url

    def status(self) -> dict[str, Any]:
        return build_status(self)

    def note_error(self, message: str) -> None:
        logger.warning("%s", message)
        self.errors.append({"time": time.time(), "message": message[:500]})

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        self.credentials = await self._retrying(self._ensure_account, deadline)
        await self._retrying(self._bind, deadline)
        await self._retrying(self._join_signaling, deadline)
        self._joins_seen = self._peer.signaling.joins
        assignment = await self._retrying(self._ask_assignment, deadline)
        await self.hosting.apply(assignment.specs)
        self.dht = DHTNode(PeerTransport(self._peer), signer=self.identity, rpc_timeout=10.0)
        await self._bootstrap()
        self.dht.start()
        self.declarer = Declarer(
            self.dht,
            self.hosted_uids,
            ttl=self.config.declare_ttl,
            period=self.config.declare_period,
            proofs=_proofs(assignment),
        )
        if self._working:
            self.gate.reopen()
            self.declarer.start()
        self.started = True
        self._upkeep = asyncio.create_task(self._run_upkeep(), name="volunteer-upkeep")
        if self.governor is not None:
            self.governor.start()

    async def stop(self) -> None:
        """Refuse new work, let in-flight requests finish (bounded), checkpoint, leave."""
        if self.stopping:
            return
        self.stopping = True
        self.gate.close("shutting down")
        if self.governor is not None:
            await self.governor.stop()
        for task in (self._upkeep, self._credit_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.declarer is not None:
            await self.declarer.stop()
        await self.gate.drain(self.config.drain_timeout)
        await self.hosting.close()
        if self.dht is not None:
            await self.dht.stop()
        await self._peer.stop()
        await self.api.close()

    async def __aenter__(self) -> Volunteer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- WorkHooks --------------------------------------------------------------------------------

    async def on_stop_work(self, decision: Decision) -> None:
        self.gate.close(decision.human_reason)  # first: no new work from this instant
        self._working = False
        if self.declarer is not None:
            await self.declarer.stop()
        await self.gate.drain(self.config.drain_timeout)
        await self.hosting.release_memory()

    async def on_resume_work(self, decision: Decision) -> None:
        self._working = True
        if self.stopping or not self.started:
            return
        await self.hosting.restore_memory()
        self.gate.reopen()
        if self.declarer is not None:
            self.declarer.start()

    # -- steps ------------------------------------------------------------------------------------

    async def _retrying(self, step: Any, deadline: float) -> Any:
        """Run ``step`` until it works; retry while the coordinator is unreachable, until ``deadline``."""
        while True:
            try:
                return await step()
            except (CoordinatorUnreachable, P2PError, TimeoutError) as e:
                self.attempts += 1
                self.note_error(f"{step.__name__.strip('_')}: {e}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CoordinatorUnreachable(
                        f"could not reach the coordinator at {self.coordinator_url} "
                        f"after {self.attempts} attempts: {e}"
                    ) from e
                await asyncio.sleep(min(self.config.retry_s, left))

    async def _ensure_account(self) -> Credentials:
        stored = self.token_store.get(self.token_key)
        creds = Credentials.loads(stored) if stored else None
        if creds is None:
            name = self.account_name or f"volunteer-{self.peer_id[:8]}"
            creds = await self.api.register(name, self.team, self.invite)
            self.token_store.set(self.token_key, creds.dumps())
            logger.info("registered account %s (id %d)", name, creds.account_id)
        elif creds.expires_at - time.time() < self.config.refresh_margin_s:
            creds = await self.api.refresh(creds)
            self.token_store.set(self.token_key, creds.dumps())
        return creds

    async def _bind(self) -> None:
        assert self.credentials is not None
        await self.api.bind_host(self.credentials, self.identity)

    async def _join_signaling(self) -> None:
        await self._peer.start()

    async def _token(self) -> str | None:
        """The token provider for signaling: refreshed when it is within the margin of expiring."""
        creds = self.credentials
        if creds is None:
            return None
        if creds.expires_at - time.time() < self.config.refresh_margin_s:
            try:
                creds = await self.api.refresh(creds)
            except AccountError as e:
                self.note_error(f"token refresh failed: {e}")
                return creds.token
            self.credentials = creds
            self.token_store.set(self.token_key, creds.dumps())
        return creds.token

    async def _ask_assignment(self) -> Assignment:
        token = await self._token()
        assert token is not None
        budget = memory_budget(self.settings, self.device)
        upload = self.settings.max_upload_kib_s * 1024
        assignment = await self.api.assignment(token, self.peer_id, self.device.type, budget, upload)
        self.assignment, self.assignment_at = assignment, time.time()
        return assignment

    async def _bootstrap(self) -> None:
        assert self.dht is not None
        peers = list(self.assignment.bootstrap) if self.assignment else []
        if not peers:
            return
        try:
            await self.dht.bootstrap(peers)
        except DHTError as e:
            self.note_error(f"DHT bootstrap: {e}")

    # -- upkeep -----------------------------------------------------------------------------------

    async def _run_upkeep(self) -> None:
        while True:
            await asyncio.sleep(self.config.upkeep_interval)
            try:
                await self._upkeep_once()
            except (AccountError, DHTError, P2PError, TimeoutError, OSError) as e:
                self.note_error(f"upkeep: {e}")
            except Exception as e:  # an answer or a bug nobody foresaw: said, and the upkeep goes on
                logger.exception("upkeep failed")
                self.note_error(f"upkeep: unexpected {type(e).__name__}: {e}")

    def _assignment_due(self) -> bool:
        if self.assignment is None:
            return True
        return time.time() >= self.assignment_at + self.assignment.ttl_s / 2

    async def _upkeep_once(self) -> None:
        if time.monotonic() >= self._accounted_at + ACCOUNTING_INTERVAL_S:
            await self._account()
        joins = self._peer.signaling.joins
        reconnected = joins != self._joins_seen
        if reconnected or self._assignment_due():
            self._joins_seen = joins
            await self._reassign()
            if self.dht is not None and not len(self.dht.table):
                await self._bootstrap()
            if reconnected and self._working and self.declarer is not None:
                await self.declarer.declare_now()
        elif self.dht is not None and not len(self.dht.table):
            await self._bootstrap()

    async def _account(self) -> None:
        """Read the account's credit (for `lah status` and the tray) and report energy spent: once a
        minute, not every upkeep tick, since every node of the swarm does it."""
        self._accounted_at = time.monotonic()
        token = await self._token()
        if token is None:
            return
        try:
            await self._read_credit(token)
            await self._report_energy(token)
        except AccountError as e:  # unreachable too: the rest of upkeep still runs
            self.note_error(f"credit: {e}")

    async def _read_credit(self, token: str) -> None:
        try:
            self.credit, self.rank = await self.api.credit(token)
        except AccountError as e:
            self.credit_error = str(e)
            raise
        self.credit_at, self.credit_error = time.time(), None

    def refresh_credit(self, min_age_s: float = CREDIT_MIN_AGE_S) -> bool:
        """Read the account's credit now, in the background, for someone looking at it (the tray's status
        window): upkeep reads it once a minute for every node of the swarm, which leaves a fresh volunteer
        looking at the credit of before its first receipts. At most one reading at a time and one per
        ``min_age_s``; the new value arrives with the next status. Returns whether a reading started."""
        recent = self.credit_at is not None and time.time() - self.credit_at < min_age_s
        busy = self._credit_task is not None and not self._credit_task.done()
        if recent or busy or not self.started or self.stopping:
            return False

        async def read() -> None:
            token = await self._token()
            if token is not None:
                with contextlib.suppress(AccountError):  # kept in credit_error, shown beside the old value
                    await self._read_credit(token)

        self._credit_task = asyncio.create_task(read(), name="credit-read")
        return True

    async def _report_energy(self, token: str) -> None:
        """Energy spent on contributed work goes to the coordinator with the host's contributions; a
        report waits in the node's outbox until delivered (``engine.node.reports``)."""
        meter = self.governor.energy if self.governor is not None else None
        if meter is not None:
            delta = meter.totals.kwh - self.energy_reported_kwh
            if delta >= ENERGY_REPORT_MIN_KWH:
                self.reports.energy(self.peer_id, delta)
                self.energy_reported_kwh += delta
        await self.reports.deliver(token)

    async def _reassign(self) -> None:
        try:
            assignment = await self._ask_assignment()
        except CoordinatorError as e:
            self.note_error(f"assignment: {e}")
            return
        if self.declarer is not None:  # renewed proofs go out with the next declaration
            self.declarer.proofs = _proofs(assignment)
        if await self.hosting.apply(assignment.specs):
            if not self._working:
                self.gate.close(self.gate.reason or "paused")
                await self.hosting.release_memory()
            if self.declarer is not None:
                self.declarer.uids = self.hosted_uids
                if self._working:
                    await self.declarer.declare_now()


ACCOUNTING_INTERVAL_S = 60.0
ENERGY_REPORT_MIN_KWH = 1e-4  # 0.1 Wh: report only once there is something to say


def _proofs(assignment: Assignment) -> dict[str, AssignmentProof]:
    """The coordinator's assignment proofs, for the DHT declarations (trainers prefer assigned hosts)."""
    return {e.uid: AssignmentProof(e.expires_at, e.proof) for e in assignment.experts if e.proof}


def _device_for(settings: Settings) -> torch.device:
    if not settings.use_gpu:
        return torch.device("cpu")
    device = default_device()
    if device.type == "cuda" and settings.gpu_index < torch.cuda.device_count():
        return torch.device("cuda", settings.gpu_index)
    return device


async def close_quietly(volunteer: Volunteer) -> None:
    with contextlib.suppress(Exception):
        await volunteer.stop()
