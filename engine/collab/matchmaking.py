"""Matchmaking: the peers due for epoch ``e``'s step form one group, through the DHT and one leader.

1. Each peer declares itself under the DHT key ``<run>.group.<e>`` (its own signed slot: bandwidth,
   client flag, vector size) and waits ``gather_s`` so that the others' declarations land.
2. It reads the key. The smallest peer id declared is the leader. A follower calls the leader's
   ``collab.join``; the leader accepts joins for another ``gather_s``, then freezes the group: itself
   and every joiner, parts from :func:`~.partition.balance_parts` over their bandwidths. Every member gets
   the same :class:`~.group.Group` in the reply, so all agree on members and parts without a clock.
3. A leader that sees a smaller id than its own answers its joiners with a redirect (at most
   ``MAX_REDIRECTS`` are followed). A join after the freeze is refused: that peer, and any peer whose
   leader is unreachable, gets :class:`MatchmakingFailed` and steps with its local gradients (logged).

Wire::

    collab.join  {"run", "epoch", "bandwidth", "client", "size", "samples"}
                 ->  {"group": bytes} | {"redirect": id}

``samples`` (optional, default 0): what the joiner brings to the round; the group carries their sum, so
every member scales its step by the same epoch size.

Claims are bounded (:func:`freeze_group`): parts come from the claimed bandwidths under the share cap
of :func:`~.partition.balance_parts`, and each member's samples count for at most ``max_share(n)`` of
the target batch size (``target_batch_size``; 0: unbounded), so one member's claim moves the epoch's
size, and the step scale, by at most ``2 / n`` of the target (not to its 2x cap). A follower checks the
leader's group against the same bounds and refuses one that breaks them (:class:`~.errors.GroupRefused`):
a part above the share cap, samples above ``n`` capped shares. That a leader named only itself a
reducer, or left someone out, is not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from engine.dht import DHTError, DHTNode
from engine.p2p import CallContext, P2PError, Peer, RemoteError
from engine.wire import Compression, Kind, Message

from .errors import GroupClosed, GroupRefused, MatchmakingFailed, Refusals
from .group import MAX_GROUP_SIZE, Group, decode_group, encode_group
from .partition import balance_parts
from .robust import max_share

logger = logging.getLogger(__name__)

JOIN = "collab.join"
MAX_REDIRECTS = 3


class Declaration(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    bandwidth: float
    client: bool
    size: int


@dataclass
class MatchmakingConfig:
    gather_s: float = 2.0
    max_wait_s: float = 8.0  # a leader waits this long at most for the peers it expects
    join_timeout: float = 20.0
    ttl_s: float = 120.0
    compression: Compression = Compression.NONE
    target_batch_size: int = 0  # bounds each member's counted samples (0: unbounded); set by the optimizer


@dataclass
class _Lead:
    epoch: int
    size: int
    bandwidth: float
    client: bool
    expected: frozenset[str] = frozenset()
    joiners: dict[str, tuple[float, bool, int]] = field(default_factory=dict)
    samples: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    result: asyncio.Future[Group | str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def frozen(self) -> bool:
        return self.result.done()


def group_key(run: str, epoch: int) -> str:
    return f"{run}.group.{epoch}"


def samples_cap(n: int, target: int) -> int:
    """The most samples one of ``n`` members may count for in a group (``target`` 0: unbounded)."""
    return math.ceil(max_share(n) * target) if target > 0 else 2**53 - 1


def freeze_group(
    round_id: str,
    members: list[str],
    info: list[tuple[float, bool, int]],
    size: int,
    compression: Compression,
    target: int = 0,
) -> Group:
    """The group a leader hands out: ``info`` is each member's (bandwidth, client, samples) claim.
    Pure, so a benchmark or a test forms exactly the group the leader would."""
    bandwidths = [0.0 if client else max(bw, 1e-9) for bw, client, _ in info]
    if not any(bandwidths):
        bandwidths[0] = 1.0  # somebody must reduce: the leader does
    cap = samples_cap(len(members), target)
    samples = min(sum(min(n, cap) for _, _, n in info), 2**53 - 1)
    return Group(round_id, tuple(members), balance_parts(size, bandwidths), compression, samples)


def check_group(group: Group, target: int = 0) -> None:
    """GroupRefused if a leader's group breaks the bounds :func:`freeze_group` keeps."""
    n = len(group.members)
    reducers = sum(1 for p in group.parts if p > 0)
    limit = math.ceil(max_share(n, reducers) * group.vector_size)
    if group.parts and max(group.parts) > limit:
        raise GroupRefused(f"a part of {max(group.parts)} elements, above the share cap of {limit}")
    if target > 0 and group.samples > n * samples_cap(n, target):
        raise GroupRefused(f"{group.samples} samples, above {n} members' bound of {samples_cap(n, target)}")


class Matchmaker:
    def __init__(self, peer: Peer, dht: DHTNode, run: str, config: MatchmakingConfig | None = None) -> None:
        self.peer = peer
        self.dht = dht
        self.run = run
        self.config = config or MatchmakingConfig()
        self._leads: dict[int, _Lead] = {}
        self._started = asyncio.Event()
        self.refusals = Refusals()  # joins and groups refused, by kind and sender
        self.capped: dict[str, int] = {}  # joiners whose samples claim was cut to the bound, how often
        # Peers known gone (link lost, a call failed): never taken as leader nor waited for. The
        # owner (the optimizer) decides what "gone" means; ``unreachable`` tells it of a failed leader.
        self.is_gone: Callable[[str], bool] = lambda _peer: False
        self.unreachable: Callable[[str], None] = lambda _peer: None
        peer.handlers.add_unary(JOIN, self._serve_join)

    @property
    def me(self) -> str:
        return self.peer.peer_id

    def lost(self, peer_id: str) -> None:
        """``peer_id`` is gone: a leader waiting for it stops waiting now."""
        for lead in self._leads.values():
            if peer_id in lead.expected and not lead.frozen:
                lead.changed.set()

    async def form_group(
        self,
        epoch: int,
        size: int,
        bandwidth: float,
        client: bool = False,
        expected: Iterable[str] = (),
        samples: int = 0,
    ) -> Group:
        """Form epoch ``epoch``'s group; MatchmakingFailed if this peer could not get into one.

        ``expected``: the peers we believe are in this epoch too; as leader we wait for them to join
        (up to ``max_wait_s``) rather than leave anyone who is only a little late behind."""
        lead = _Lead(epoch, size, bandwidth, client, expected=frozenset(expected), samples=samples)
        self._leads[epoch] = lead
        self._started.set()
        self._started = asyncio.Event()
        for old in [e for e in self._leads if e < epoch - 2]:
            del self._leads[old]
        try:
            return await self._form(lead)
        finally:
            if not lead.result.done():
                lead.result.set_exception(MatchmakingFailed("the leader gave up"))
                lead.result.exception()

    async def _candidates(self, key: str, epoch: int) -> set[str]:
        candidates = {self.me}
        try:
            got = await self.dht.get(key)
            candidates.update(owner for owner, _ in got.records if not self.is_gone(owner))
        except DHTError as e:
            logger.warning("matchmaking epoch %d: reading declarations failed: %s", epoch, e)
        return candidates

    async def _form(self, lead: _Lead) -> Group:
        started = time.monotonic()
        key = group_key(self.run, lead.epoch)
        value = msgspec.msgpack.encode(Declaration(lead.bandwidth, lead.client, lead.size))
        try:
            await self.dht.store(key, value, self.dht.clock() + self.config.ttl_s)
        except DHTError as e:
            logger.warning("matchmaking epoch %d: declaring failed: %s", lead.epoch, e)
        await asyncio.sleep(self.config.gather_s)
        earliest_freeze = time.monotonic() + self.config.gather_s  # followers who just read us: time to call
        deadline = started + max(self.config.max_wait_s, 2 * self.config.gather_s)
        while True:
            leader = min(await self._candidates(key, lead.epoch))
            if leader != self.me:  # someone smaller declared (maybe after we took the lead): follow it
                lead.result.set_result(leader)  # our own joiners go there too
                return await self._join(leader, lead)
            now = time.monotonic()
            waiting_for = {p for p in lead.expected - set(lead.joiners) - {self.me} if not self.is_gone(p)}
            if now >= deadline or (not waiting_for and now >= earliest_freeze):
                if waiting_for:
                    logger.info(
                        "epoch %d: forming the group without %d expected peers", lead.epoch, len(waiting_for)
                    )
                group = self._freeze(lead)
                lead.result.set_result(group)
                return group
            lead.changed.clear()
            pause = min(self.config.gather_s / 2, max(0.01, deadline - now))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lead.changed.wait(), timeout=max(0.01, pause))

    def _freeze(self, lead: _Lead) -> Group:
        members = [self.me, *sorted(lead.joiners)]
        info = [(lead.bandwidth, lead.client, lead.samples), *(lead.joiners[m] for m in members[1:])]
        target = self.config.target_batch_size
        cap = samples_cap(len(members), target)
        for m, (_, _, n) in zip(members, info, strict=True):
            if n > cap:
                self.capped[m] = self.capped.get(m, 0) + 1
                logger.info("epoch %d: %s claims %d samples, counted as %d", lead.epoch, m, n, cap)
        round_id = f"{self.run}/{lead.epoch}/{self.me[:16]}"
        group = freeze_group(round_id, members, info, lead.size, self.config.compression, target)
        if len(members) > 1:
            logger.info("round %s: group of %d, parts %s", round_id, len(members), group.parts)
        return group

    async def _join(self, leader: str, lead: _Lead) -> Group:
        fields = {
            "run": self.run,
            "epoch": lead.epoch,
            "bandwidth": float(lead.bandwidth),
            "client": lead.client,
            "size": lead.size,
            "samples": lead.samples,
        }
        for _ in range(MAX_REDIRECTS + 1):
            try:
                reply = await self.peer.call(leader, JOIN, fields, timeout=self.config.join_timeout)
            except RemoteError as e:
                if e.code == "closed":
                    raise GroupClosed(f"epoch {lead.epoch}: leader {leader[:12]} formed its group") from e
                raise MatchmakingFailed(f"epoch {lead.epoch}: leader {leader[:12]} refused: {e}") from e
            except (P2PError, TimeoutError) as e:
                self.unreachable(leader)
                raise MatchmakingFailed(f"epoch {lead.epoch}: leader {leader[:12]} failed: {e}") from e
            redirect = reply.fields.get("redirect")
            if isinstance(redirect, str) and redirect != self.me:
                leader = redirect
                continue
            group = decode_group(reply.fields.get("group"))
            if self.me not in group.members or group.vector_size != lead.size:
                raise MatchmakingFailed(f"epoch {lead.epoch}: leader {leader[:12]} sent a group without us")
            try:
                check_group(group, self.config.target_batch_size)
            except GroupRefused as e:
                self.refusals.note(e, leader, logger)
                raise
            return group
        raise MatchmakingFailed(f"epoch {lead.epoch}: more than {MAX_REDIRECTS} redirects")

    async def _serve_join(self, msg: Message, ctx: CallContext) -> Message:
        f = msg.fields
        epoch, size, bandwidth, client = f.get("epoch"), f.get("size"), f.get("bandwidth"), f.get("client")
        samples = f.get("samples", 0)
        if (
            f.get("run") != self.run
            or not isinstance(epoch, int)
            or not isinstance(size, int)
            or not isinstance(bandwidth, int | float)
            or not math.isfinite(bandwidth)
            or bandwidth < 0
            or not isinstance(client, bool)
            or not isinstance(samples, int)
            or isinstance(samples, bool)
            or not 0 <= samples < 2**53
        ):
            why = "collab.join takes run, epoch, bandwidth, client, size, samples"
            self.refusals.note(MatchmakingFailed(why), ctx.peer_id, logger)
            raise RemoteError("bad_request", why)
        lead = await self._lead_for(epoch)
        if lead is None:
            raise RemoteError("not_matching", f"not matchmaking for epoch {epoch}")
        if lead.frozen:
            outcome = lead.result.result() if lead.result.exception() is None else None
            if isinstance(outcome, str):
                return Message(Kind.RESPONSE, 0, fields={"redirect": outcome})
            raise RemoteError("closed", f"epoch {epoch}'s group is already formed")
        if size != lead.size:
            raise RemoteError("bad_request", f"vector of {size} elements, the group averages {lead.size}")
        if len(lead.joiners) + 1 >= MAX_GROUP_SIZE:
            raise RemoteError("closed", "group is full")
        lead.joiners[ctx.peer_id] = (float(bandwidth), client, samples)
        lead.changed.set()
        try:
            outcome = await asyncio.wait_for(asyncio.shield(lead.result), self.config.join_timeout)
        except (TimeoutError, MatchmakingFailed) as e:
            raise RemoteError("closed", f"no group for epoch {epoch}: {e}") from e
        if isinstance(outcome, str):
            return Message(Kind.RESPONSE, 0, fields={"redirect": outcome})
        return Message(Kind.RESPONSE, 0, fields={"group": encode_group(outcome)})

    async def _lead_for(self, epoch: int) -> _Lead | None:
        deadline = time.monotonic() + self.config.join_timeout / 2
        while epoch not in self._leads:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self._started.wait(), timeout=left)
            except TimeoutError:
                return None
        return self._leads[epoch]
