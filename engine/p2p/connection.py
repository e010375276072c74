"""One WebRTC connection to one remote peer, and the offer/answer handshakes that make it.

A :class:`Link` is an RTCPeerConnection with one ordered, reliable data channel that carries all RPC
traffic to that peer (several channels share one SCTP association and move no more than one, so a
second channel buys nothing). Descriptions travel signed through the coordinator; after the DTLS
handshake the link checks that the certificate the remote presented is the one its signed SDP named.

ICE servers are always passed explicitly: aiortc's default is a public STUN server. Before each
connection the configured servers are filtered to live ones (:mod:`engine.p2p.ice_servers`), so a dead
STUN or TURN server costs one short probe, not aioice's 5 s wait on every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from cryptography.hazmat.primitives import hashes

from engine.wire import Limits

from .channel import FramedChannel, RateLimiter, TrafficCounter
from .descriptions import SignedDescription, sign_description, verify_description
from .errors import ConnectError, ConnectionLost, PeerMismatch
from .ice_servers import DEFAULT_PROBE, IceServerProbe
from .identity import Identity
from .patches import advertise_sack_frequency, agree_sack_frequency, set_congestion_control
from .rpc import DEFAULT_HANDLER_DEADLINE, DEFAULT_STREAM_WINDOW, RpcEndpoint
from .rpc_wire import Handlers
from .signaling_protocol import IceServer

logger = logging.getLogger(__name__)

RPC_LABEL = "lah-rpc"
RPC_PROTOCOL = "lah-rpc/2"  # /2: ABORT frames, CREDIT messages (a /1 peer would drop the link)
FALLBACK_MAX_MESSAGE = 65536  # RFC 8841: assume this when the remote advertises no max-message-size


@dataclass(frozen=True)
class LinkConfig:
    ice_servers: Sequence[IceServer] = ()
    connect_timeout: float = 15.0
    window: int = 64 << 20
    max_message_bytes: int = 32 << 20
    high_water: int = 1 << 20
    max_concurrent: int = 64
    max_queued: int = 1024  # requests waiting for a handler slot; more is a protocol error
    memory_budget: int | None = None  # received data a link may hold, decoded tensors included
    # (None: 1.5 windows, i.e. 96 MiB by default)
    handler_deadline: float = DEFAULT_HANDLER_DEADLINE  # a handler and its reply (per stream item)
    stream_window: int = DEFAULT_STREAM_WINDOW  # how far a served stream may run ahead of its reader
    close_timeout: float = 5.0
    ice_probe: IceServerProbe | None = None  # None: the process-wide one (engine.p2p.ice_servers)
    limits: Limits = field(default_factory=lambda: Limits(max_message_bytes=32 << 20))
    upload: RateLimiter | None = None  # shared by every link: the node's upload cap
    download: RateLimiter | None = None
    on_traffic: TrafficCounter | None = None  # (sent, received) bytes, for the monthly data cap
    congestion_control: str | None = None  # "bbr" or "cubic" (engine/p2p/patches); None: the default

    def rtc_configuration(self, servers: Sequence[IceServer] | None = None) -> RTCConfiguration:
        chosen = self.ice_servers if servers is None else servers
        return RTCConfiguration(
            iceServers=[
                RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in chosen
            ]
        )

    async def live_rtc_configuration(self) -> RTCConfiguration:
        """The configuration with dead STUN/TURN servers left out (probed within a deadline, cached)."""
        if not self.ice_servers:
            return self.rtc_configuration()
        probe = self.ice_probe or DEFAULT_PROBE
        return self.rtc_configuration(await probe.usable(self.ice_servers))


class Link:
    """An open, verified connection to ``remote_id`` carrying an RPC endpoint."""

    def __init__(
        self,
        remote_id: str,
        pc: RTCPeerConnection,
        channel: RTCDataChannel,
        early: EarlyFrames,
        config: LinkConfig,
        handlers: Handlers,
        on_closed: Callable[[Link], None],
    ) -> None:
        self.remote_id = remote_id
        self.pc = pc
        self.data_channel = channel
        self.created_at = time.monotonic()
        self.last_used = self.created_at
        self._on_closed = on_closed
        self._closing = False
        self.closed_here = False  # closed by this side (idle, evicted, stopping), not lost
        self._closer: asyncio.Future[None] | None = None
        self.close_timeout = config.close_timeout
        max_frame = (
            min(pc.sctp._remote_max_message_size or (1 << 18), 1 << 18) if pc.sctp else FALLBACK_MAX_MESSAGE
        )

        def make_channel(on_message: Callable[[bytearray], None]) -> FramedChannel:
            return FramedChannel(
                channel,
                on_message,
                max_frame=max_frame,
                window=config.window,
                max_message_bytes=config.max_message_bytes,
                high_water=config.high_water,
                upload=config.upload,
                download=config.download,
                on_traffic=config.on_traffic,
                memory_budget=config.memory_budget or config.window + config.window // 2,
            )

        self.rpc = RpcEndpoint(
            make_channel,
            handlers,
            peer_id=remote_id,
            limits=config.limits,
            max_concurrent=config.max_concurrent,
            max_queued=config.max_queued,
            handler_deadline=config.handler_deadline,
            stream_window=config.stream_window,
            on_failure=self._failed,
        )
        early.hand_over(channel, self.rpc.channel._on_frame)
        if config.congestion_control and pc.sctp:
            set_congestion_control(pc.sctp, config.congestion_control)
        pc.on("connectionstatechange", self._state_changed)

    @property
    def usable(self) -> bool:
        return not self._closing and self.rpc.channel.error is None and self.pc.connectionState == "connected"

    @property
    def busy(self) -> bool:
        return self.rpc.busy

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def _state_changed(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.rpc.channel.fail(
                ConnectionLost(f"connection to {self.remote_id[:12]} {self.pc.connectionState}")
            )

    def _failed(self, error: BaseException) -> None:
        logger.info("link to %s ends: %s", self.remote_id[:12], error)
        self._schedule_close()

    def _schedule_close(self) -> None:
        if not self._closing:
            self._closing = True
            self._on_closed(self)
            self._closer = asyncio.ensure_future(self._close_pc())

    async def _close_pc(self) -> None:
        """aiortc's close waits on its transports; bounded, so no caller waits on a dead peer for long."""
        try:
            async with asyncio.timeout(self.close_timeout):
                await self.pc.close()
        except TimeoutError:
            logger.warning("closing the link to %s took over %.3g s", self.remote_id[:12], self.close_timeout)

    async def close(self) -> None:
        """Close within ``close_timeout`` (plus a moment), whatever the remote does."""
        if not self._closing:
            self.closed_here = True
        self.rpc.close()
        self._schedule_close()
        if self._closer is not None:
            await asyncio.shield(self._closer)


def remote_certificate_fingerprint(pc: RTCPeerConnection) -> str:
    """SHA-256 fingerprint of the certificate the remote presented in the DTLS handshake."""
    dtls = pc.sctp.transport if pc.sctp else None
    ssl = getattr(dtls, "_ssl", None)
    if ssl is None:
        raise PeerMismatch("no DTLS session to check")
    cert = ssl.get_peer_certificate(as_cryptography=True)
    if cert is None:
        raise PeerMismatch("remote presented no certificate")
    return ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))


def check_fingerprint(pc: RTCPeerConnection, signed: list[tuple[str, str]], remote_id: str) -> None:
    actual = remote_certificate_fingerprint(pc)
    expected = [value for algorithm, value in signed if algorithm == "sha-256"]
    if actual not in expected:
        raise PeerMismatch(
            f"DTLS certificate of {remote_id[:12]} is not the one its signed description names"
        )


class EarlyFrames:
    """Holds frames that arrive between the channel opening and the link taking it over."""

    def __init__(self, channel: RTCDataChannel) -> None:
        self.frames: list[bytes] = []
        channel.on("message", self.frames.append)

    def hand_over(self, channel: RTCDataChannel, receiver: Callable[[bytes], None]) -> None:
        channel.remove_listener("message", self.frames.append)
        for frame in self.frames:
            receiver(frame)
        self.frames.clear()


SendDescription = Callable[[str, SignedDescription], Any]


async def _wait_open(channel: RTCDataChannel, timeout: float) -> None:
    if channel.readyState == "open":
        return
    opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_open() -> None:
        if not opened.done():
            opened.set_result(None)

    channel.on("open", on_open)
    async with asyncio.timeout(timeout):
        await opened


async def dial(
    identity: Identity,
    remote_id: str,
    config: LinkConfig,
    handlers: Handlers,
    send: SendDescription,
    answer: asyncio.Future[SignedDescription],
    session: str,
    on_closed: Callable[[Link], None],
) -> Link:
    """Offer a connection to ``remote_id``; ``answer`` is resolved by whoever reads signaling."""
    pc = RTCPeerConnection(await config.live_rtc_configuration())
    try:
        async with asyncio.timeout(config.connect_timeout):
            channel = pc.createDataChannel(RPC_LABEL, ordered=True, protocol=RPC_PROTOCOL)
            early = EarlyFrames(channel)
            await pc.setLocalDescription(await pc.createOffer())
            offer_sdp = advertise_sack_frequency(pc.localDescription.sdp)
            await send(remote_id, sign_description(identity, "offer", offer_sdp, remote_id, session))
            desc = await answer
            fingerprints = verify_description(desc, expected_sender=remote_id, me=identity.peer_id)
            if desc.type != "answer" or desc.session != session:
                raise PeerMismatch("answer does not belong to our offer")
            await pc.setRemoteDescription(RTCSessionDescription(sdp=desc.sdp, type="answer"))
            agree_sack_frequency(pc.sctp, offer_sdp, desc.sdp)
            await _wait_open(channel, config.connect_timeout)
            check_fingerprint(pc, fingerprints, remote_id)
    except TimeoutError as e:
        await pc.close()
        raise ConnectError(f"no connection to {remote_id[:12]} within {config.connect_timeout:.3g} s") from e
    except BaseException:
        await pc.close()
        raise
    return Link(remote_id, pc, channel, early, config, handlers, on_closed)


async def accept(
    identity: Identity,
    offer: SignedDescription,
    config: LinkConfig,
    handlers: Handlers,
    send: SendDescription,
    on_closed: Callable[[Link], None],
) -> Link:
    """Answer a verified offer and wait for the offerer's data channel."""
    remote_id = offer.sender
    fingerprints = verify_description(offer, expected_sender=remote_id, me=identity.peer_id)
    if offer.type != "offer":
        raise PeerMismatch("expected an offer")
    pc = RTCPeerConnection(await config.live_rtc_configuration())
    incoming: asyncio.Future[RTCDataChannel] = asyncio.get_running_loop().create_future()
    early_box: list[EarlyFrames] = []

    @pc.on("datachannel")  # type: ignore[untyped-decorator]
    def _on_channel(channel: RTCDataChannel) -> None:
        if channel.label == RPC_LABEL and channel.protocol == RPC_PROTOCOL and not incoming.done():
            early_box.append(EarlyFrames(channel))
            incoming.set_result(channel)
        else:
            channel.close()

    try:
        async with asyncio.timeout(config.connect_timeout):
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer.sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            answer_sdp = advertise_sack_frequency(pc.localDescription.sdp)
            agree_sack_frequency(pc.sctp, answer_sdp, offer.sdp)
            answer = sign_description(identity, "answer", answer_sdp, remote_id, offer.session)
            await send(remote_id, answer)
            channel = await incoming
            await _wait_open(channel, config.connect_timeout)
            check_fingerprint(pc, fingerprints, remote_id)
    except TimeoutError as e:
        await pc.close()
        raise ConnectError(f"{remote_id[:12]} offered but never opened its channel") from e
    except BaseException:
        await pc.close()
        raise
    return Link(remote_id, pc, channel, early_box[0], config, handlers, on_closed)


async def close_quietly(link: Link) -> None:
    with contextlib.suppress(Exception):
        await link.close()
