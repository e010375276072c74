"""Client of the coordinator's signaling socket (see :mod:`engine.p2p.signaling_protocol`).

It authenticates with the node's identity (and, for a hub that requires accounts, a bearer token:
fixed, or fetched from ``token_provider`` before every connect so a refreshed token is used on
reconnect), keeps the socket up (reconnecting with capped backoff
after a network change), hands relayed descriptions to the connection layer and routes the hub's
errors back to whoever sent the message they refer to, so a dial to an offline peer fails at once
instead of waiting out its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import msgspec

from . import signaling_protocol as sp
from .descriptions import SignedDescription
from .errors import PeerUnreachable, SignalingError
from .identity import Identity

logger = logging.getLogger(__name__)

SignalHandler = Callable[[sp.Signal], None]
ErrorHandler = Callable[[sp.Error], None]
TokenProvider = Callable[[], Awaitable[str | None]]
MAX_WATCHED = 1024


class SignalingRefused(SignalingError):
    """The hub answered our hello with an error; ``code`` says why (see signaling_protocol)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"signaling refused us: {code}: {message}")
        self.code = code


class SignalingClient:
    def __init__(
        self,
        url: str,
        identity: Identity,
        on_signal: SignalHandler,
        *,
        connect_timeout: float = 10.0,
        max_backoff: float = 30.0,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
    ) -> None:
        self.url = url
        self.identity = identity
        self.token = token
        self.token_provider = token_provider
        self.on_signal = on_signal
        self.connect_timeout = connect_timeout
        self.max_backoff = max_backoff
        self.ice_servers: list[sp.IceServer] = []
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._watchers: OrderedDict[int, ErrorHandler] = OrderedDict()
        self._closed = False
        self._refreshing: asyncio.Future[bool] | None = None
        self._reconnect_now = False
        self.joins = 0  # successful joins, reconnects included
        self.connected = asyncio.Event()

    async def connect(self) -> None:
        """Connect and authenticate once; raise SignalingError if that fails."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        await self._open()
        self._reader = asyncio.create_task(self._run(), name="signaling-reader")

    async def _open(self) -> None:
        assert self._session is not None
        token = self.token
        if self.token_provider is not None:
            try:
                token = await asyncio.wait_for(self.token_provider(), self.connect_timeout)
            except Exception as e:
                raise SignalingError(f"cannot get a signaling token: {e!r}") from e
        try:
            async with asyncio.timeout(self.connect_timeout):
                ws = await self._session.ws_connect(self.url, max_msg_size=sp.MAX_FRAME_BYTES, heartbeat=20.0)
                challenge = sp.client_decoder.decode(await ws.receive_str())
                if not isinstance(challenge, sp.Challenge):
                    raise SignalingError(f"expected a challenge, got {type(challenge).__name__}")
                hello = sp.Hello(
                    public_key=self.identity.public_key,
                    signature=self.identity.sign(sp.DOMAIN + challenge.nonce),
                    token=token,
                )
                await ws.send_str(sp.encode(hello))
                reply = sp.client_decoder.decode(await ws.receive_str())
        except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError, TypeError) as e:
            raise SignalingError(f"cannot join signaling at {self.url}: {e!r}") from e
        if isinstance(reply, sp.Error):
            await ws.close()
            raise SignalingRefused(reply.code, reply.message)
        if not isinstance(reply, sp.Welcome) or reply.peer_id != self.identity.peer_id:
            await ws.close()
            raise SignalingError("signaling answered the hello with something else than our welcome")
        self.ice_servers = list(reply.ice_servers)
        self._ws = ws
        self.joins += 1
        self.connected.set()
        expiry = turn_expiry(self.ice_servers)
        if expiry is not None:
            # Reconnect a minute before the TURN credential lapses: the welcome brings a new one.
            delay = max(1.0, expiry - time.time() - 60.0)
            asyncio.get_running_loop().call_later(delay, self._refresh_socket, ws)

    async def _run(self) -> None:
        failures = 0
        spent = 0.0  # how long the last failed try took (a timeout: 10 s already waited)
        while not self._closed:
            ws = self._ws
            if ws is not None:
                await self._read(ws)
                self.connected.clear()
                self._ws = None
            if self._closed:
                return
            if not self._reconnect_now:
                await asyncio.sleep(reconnect_delay(failures, self.max_backoff, spent=spent))
            self._reconnect_now = False
            started = time.monotonic()
            try:
                await self._open()
                failures, spent = 0, 0.0
            except SignalingError as e:
                failures += 1
                spent = time.monotonic() - started
                logger.info("signaling reconnect failed (%s); try %d", e, failures)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                message = sp.client_decoder.decode(msg.data)
            except msgspec.DecodeError as e:
                logger.warning("ignoring a malformed signaling message: %s", e)
                continue
            if isinstance(message, sp.Signal):
                self.on_signal(message)
            elif isinstance(message, sp.Error):
                handler = self._watchers.pop(message.ref, None) if message.ref is not None else None
                if handler is not None:
                    handler(message)
                else:
                    logger.warning("signaling error: %s: %s", message.code, message.message)

    def refresh(self) -> None:
        """Reconnect now, to get fresh ICE servers (TURN credentials) in a new welcome."""
        if self._ws is not None:
            self._refresh_socket(self._ws)

    def _refresh_socket(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        if ws is self._ws and not ws.closed and not self._closed:
            self._reconnect_now = True
            self._refreshing = asyncio.ensure_future(ws.close())

    async def send(
        self, to: str, description: SignedDescription, on_error: ErrorHandler | None = None
    ) -> int:
        ws = self._ws
        if ws is None or ws.closed:
            raise SignalingError("not connected to signaling")
        msg_id = next(self._ids)
        if on_error is not None:
            self._watchers[msg_id] = on_error
            while len(self._watchers) > MAX_WATCHED:
                self._watchers.popitem(last=False)
        try:
            await ws.send_str(sp.encode(sp.Signal(id=msg_id, to=to, description=description)))
        except ConnectionError as e:
            self._watchers.pop(msg_id, None)
            raise SignalingError(f"signaling socket failed: {e}") from e
        return msg_id

    async def close(self) -> None:
        self._closed = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._session is not None:
            await self._session.close()


def reconnect_delay(
    failures: int, max_backoff: float, rand: Callable[[], float] = random.random, *, spent: float = 0.0
) -> float:
    """Seconds to wait before reconnecting after ``failures`` failed tries in a row: 1, 2, 4 ... s up to
    ``max_backoff``, of which a random half ("equal jitter"). Without the jitter, every peer of a
    coordinator replica that died reconnects in the same instant, and again in lockstep after each
    refusal; with it their hellos spread over the window and the survivors admit them in one pass.

    ``spent``: how long the failed try itself took. The backoff runs from the start of that try, as
    gRPC's connection backoff does: a try that failed after waiting out a 10 s timeout has already
    given the server its pause, and waiting a full backoff more on top stacked timeouts and waits
    into the ~60 s tail a failover's slowest peers took (four timeouts, then 1 + 2 + 4 + 8 s)."""
    ceiling = min(max_backoff, 2.0 ** max(0, failures))
    return max(0.0, ceiling * (0.5 + 0.5 * rand()) - max(0.0, spent))


def signaling_url_of(coordinator_url: str) -> str:
    """``http://host:port`` -> ``ws://host:port/ws/signal`` (https -> wss)."""
    parts = urlsplit(coordinator_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws/signal", "", ""))


def turn_expiry(servers: list[sp.IceServer]) -> float | None:
    """Earliest expiry among TURN credentials of the ``<unix expiry>:<peer id>`` form, if any."""
    expiries = []
    for server in servers:
        head = (server.username or "").split(":", 1)[0]
        if head.isdigit():
            expiries.append(float(head))
    return min(expiries, default=None)


def unreachable(error: sp.Error) -> PeerUnreachable:
    return PeerUnreachable(f"{error.code}: {error.message}")
