"""A node on the network: identity, signaling, a bounded pool of links, and the methods it serves.

The pool keeps one link per remote peer and reuses it for every call. Links idle for
``idle_timeout`` are closed, and when more than ``max_links`` are open the least recently used idle
one goes first: each open RTCPeerConnection costs timers and keepalive traffic. A link that fails is
dropped from the pool; the next call to that peer dials a fresh one.

When two peers dial each other at once (glare) the offer of the peer with the smaller id wins: the
other side drops its own attempt and answers, and its waiting callers get the answered link.

Inbound offers are verified before anything is spent on them, then admitted by
:class:`~engine.p2p.admission.InboundAdmission` (a cap per peer and in total on attempts in flight,
replays dropped); ``offer_stats`` counts what was dropped and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.wire import Compression, Message

from . import signaling_protocol as sp
from .admission import InboundAdmission, OfferStats, Verdict
from .connection import Link, LinkConfig, accept, close_quietly, dial
from .descriptions import SignedDescription, new_session_id, verify_description
from .errors import ConnectError, P2PError, PeerMismatch
from .ice_servers import DEFAULT_PROBE
from .identity import Identity
from .patches.ice import recent_turn_failures
from .rpc import DEFAULT_TIMEOUT
from .rpc_wire import CompressionArg, Handlers
from .signaling import SignalingClient, TokenProvider, unreachable

logger = logging.getLogger(__name__)


class Peer:
    def __init__(
        self,
        identity: Identity,
        signaling_url: str,
        *,
        handlers: Handlers | None = None,
        config: LinkConfig | None = None,
        max_links: int = 64,
        idle_timeout: float = 120.0,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        max_inbound_per_peer: int = 2,
        max_inbound: int = 32,
    ) -> None:
        """``token``/``token_provider``: the account token a coordinator that admits only account
        holders asks for (the provider is called before every join, so it can refresh).
        ``max_inbound_per_peer``/``max_inbound``: offers answered at once, per remote peer and in all."""
        self.identity = identity
        self.handlers = handlers or Handlers()
        self._base_config = config or LinkConfig()
        self.max_links = max_links
        self.idle_timeout = idle_timeout
        self.signaling = SignalingClient(
            signaling_url, identity, self._on_signal, token=token, token_provider=token_provider
        )
        self.links: dict[str, Link] = {}
        self._connecting: dict[str, asyncio.Future[Link]] = {}
        self._dial_tasks: dict[str, asyncio.Task[Link]] = {}
        self._answers: dict[str, asyncio.Future[SignedDescription]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self.rejected_offers = 0
        # Links made since start, by who began them: a volunteer's status tells whether anyone could
        # reach it at all (links_in) apart from the links it opened itself (links_out).
        self.links_in = 0
        self.links_out = 0
        self.admission = InboundAdmission(per_peer=max_inbound_per_peer, total=max_inbound)
        # called with the remote's id when a link in the pool fails or the remote closes it (not
        # when this side closes it): the remote is likely gone, and whoever waits on it need not
        self.link_lost: list[Callable[[str], None]] = []

    @property
    def offer_stats(self) -> OfferStats:
        return self.admission.stats

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def config(self) -> LinkConfig:
        """The coordinator's latest ICE servers (TURN credentials expire and are renewed on every
        signaling reconnect), unless the caller pinned its own list."""
        if self._base_config.ice_servers:
            return self._base_config
        return replace(self._base_config, ice_servers=tuple(self.signaling.ice_servers))

    async def start(self) -> None:
        await self.signaling.connect()
        self._reaper = asyncio.create_task(self._reap_idle(), name="link-reaper")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for task in list(self._dial_tasks.values()) + list(self._tasks):
            task.cancel()
        await asyncio.gather(*(close_quietly(link) for link in list(self.links.values())))
        self.links.clear()
        await self.signaling.close()

    # -- calls -----------------------------------------------------------------------------------

    async def connect(self, peer_id: str) -> Link:
        link = self.links.get(peer_id)
        if link is not None and link.usable:
            link.touch()
            return link
        if peer_id == self.peer_id:
            raise ConnectError("a peer does not connect to itself")
        pending = self._connecting.get(peer_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._connecting[peer_id] = pending
            task = asyncio.create_task(self._dial(peer_id), name=f"dial-{peer_id[:8]}")
            self._dial_tasks[peer_id] = task
            task.add_done_callback(lambda t: self._dial_done(peer_id, t))
        return await asyncio.shield(pending)

    async def call(
        self,
        peer_id: str,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        compression: CompressionArg = Compression.NONE,
    ) -> Message:
        """Call ``method`` on ``peer_id``; connecting counts against ``timeout`` too."""
        deadline = time.monotonic() + timeout
        async with asyncio.timeout(timeout):
            link = await self.connect(peer_id)
        link.touch()
        return await link.rpc.call(
            method, fields, tensors, timeout=max(0.001, deadline - time.monotonic()), compression=compression
        )

    async def stream(
        self,
        peer_id: str,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        compression: CompressionArg = Compression.NONE,
    ) -> AsyncIterator[Message]:
        async with asyncio.timeout(timeout):
            link = await self.connect(peer_id)
        async for item in link.rpc.stream(method, fields, tensors, timeout=timeout, compression=compression):
            link.touch()
            yield item

    # -- dialing and answering -------------------------------------------------------------------

    async def _dial(self, peer_id: str) -> Link:
        session = new_session_id()
        answer: asyncio.Future[SignedDescription] = asyncio.get_running_loop().create_future()
        self._answers[session] = answer

        async def send(to: str, desc: SignedDescription) -> None:
            def refused(error: sp.Error) -> None:
                if not answer.done():
                    answer.set_exception(unreachable(error))

            await self.signaling.send(to, desc, on_error=refused)

        started = time.monotonic()
        try:
            return await dial(
                self.identity, peer_id, self.config, self.handlers, send, answer, session, self._forget
            )
        except ConnectError as e:
            (self._base_config.ice_probe or DEFAULT_PROBE).forget()  # what answered may be gone
            turn = recent_turn_failures(started)
            if not turn:
                raise
            # Expired or wrong TURN credentials: fetch fresh ones for the next attempt, and say why.
            self.signaling.refresh()
            raise ConnectError(f"{e}; {'; '.join(turn)}") from e
        finally:
            self._answers.pop(session, None)

    def _dial_done(self, peer_id: str, task: asyncio.Task[Link]) -> None:
        self._dial_tasks.pop(peer_id, None)
        pending = self._connecting.pop(peer_id, None)
        if task.cancelled():
            if pending is not None and not pending.done():
                pending.set_exception(ConnectError(f"dial to {peer_id[:12]} was abandoned"))
            return
        error = task.exception()
        if error is not None:
            if pending is not None and not pending.done():
                pending.set_exception(error)
            return
        link = task.result()
        self._register(link)
        self.links_out += 1
        if pending is not None and not pending.done():
            pending.set_result(link)

    def _on_signal(self, signal: sp.Signal) -> None:
        desc = signal.description
        if desc.sender != signal.sender:
            logger.warning(
                "dropping a description whose sender %s is not the socket's peer", desc.sender[:12]
            )
            return
        if desc.type == "answer":
            answer = self._answers.get(desc.session)
            if answer is not None and not answer.done():
                answer.set_result(desc)
            return
        if desc.type != "offer":
            return
        if signal.sender in self._dial_tasks and self.peer_id < signal.sender:
            return  # glare: our offer wins, theirs is dropped on their side
        try:
            verify_description(desc, expected_sender=signal.sender, me=self.peer_id)
        except PeerMismatch as e:
            self.rejected_offers += 1
            logger.warning("refused an offer from %s: %s", signal.sender[:12], e)
            return
        verdict = self.admission.admit(signal.sender, desc.session, desc.sdp)
        if verdict is not Verdict.ANSWER:
            logger.info("dropped an offer from %s: %s", signal.sender[:12], verdict.value)
            return
        task = asyncio.create_task(self._accept(desc), name=f"accept-{signal.sender[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        sender = signal.sender
        task.add_done_callback(lambda _: self.admission.done(sender))

    async def _accept(self, offer: SignedDescription) -> None:
        remote = offer.sender
        losing_dial = self._dial_tasks.get(remote)
        try:
            link = await accept(
                self.identity, offer, self.config, self.handlers, self.signaling.send, self._forget
            )
        except PeerMismatch as e:
            self.rejected_offers += 1
            logger.warning("refused an offer from %s: %s", remote[:12], e)
            return
        except (P2PError, OSError) as e:
            logger.info("answering %s failed: %s", remote[:12], e)
            return
        self._register(link)
        self.links_in += 1
        pending = self._connecting.pop(remote, None)
        if losing_dial is not None:
            losing_dial.cancel()
        if pending is not None and not pending.done():
            pending.set_result(link)

    # -- the pool --------------------------------------------------------------------------------

    def _register(self, link: Link) -> None:
        old = self.links.get(link.remote_id)
        self.links[link.remote_id] = link
        if old is not None and old is not link:
            self._spawn(close_quietly(old))
        while len(self.links) > self.max_links:
            idle = [lk for lk in self.links.values() if not lk.busy and lk is not link]
            if not idle:
                break
            victim = min(idle, key=lambda lk: lk.last_used)
            self.links.pop(victim.remote_id)
            self._spawn(close_quietly(victim))

    def _forget(self, link: Link) -> None:
        if self.links.get(link.remote_id) is link:
            del self.links[link.remote_id]
            if not link.closed_here:
                for listener in list(self.link_lost):
                    try:
                        listener(link.remote_id)
                    except Exception:
                        logger.exception("a link_lost listener failed")

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.idle_timeout / 4))
            cutoff = time.monotonic() - self.idle_timeout
            for link in list(self.links.values()):
                if link.last_used < cutoff and not link.busy:
                    self.links.pop(link.remote_id, None)
                    await close_quietly(link)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = ["Peer"]
