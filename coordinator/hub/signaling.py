"""The signaling hub: relays signed offers and answers between authenticated peers.

A peer proves its id by signing a fresh nonce with its identity key, so ``sender`` on a relayed
message is always true. The hub never reads the SDP it relays; peers verify each other's signatures
themselves, so the hub cannot impersonate anyone either. A malformed frame is the client's fault: it
gets an Error and is disconnected; the hub goes on serving the others.

With accounts (``authorize`` set; the full coordinator), the hello must also carry a bearer token
that is valid (not expired, forged or revoked) for an account to which the proven key is bound as a
host; otherwise the peer gets an Error (``token_required``, ``token_invalid``, ``token_expired``,
``token_revoked``, ``host_not_bound``, ``account_disabled``) and a close code in the 4000 range. Built
without ``authorize`` the hub admits any key holder (tests, demos). ``limiter`` caps concurrent and
new sockets per remote address: over the limit, the upgrade is refused with HTTP 429.

Each authenticated sender's offers pass a token bucket (``offers``): an offer over the rate is not
relayed and its sender gets ``Error(rate_limited, ref=id)``, which fails that dial at once; the socket
stays open. An offer the hub relayed within the last two minutes (same sender, same signed
description) is dropped silently, so replaying one never costs its recipient a second connection attempt.

``recheck`` (the full coordinator: accounts) is asked every ``recheck_s`` which online peers must go
(account disabled, host unbound); their sockets are closed with ``account_disabled`` at once.
``address_of`` says which client address a request counts against (trusted reverse proxies).

With ``group`` set (a ``coordinator.hub.presence.ReplicaGroup``: replicas sharing PostgreSQL) a peer's
socket is claimed in the shared presence table before its welcome (the latest connection wins on
any replica), a signal for a peer on another replica is forwarded through PostgreSQL NOTIFY, and
``online_all`` lists every live replica's peers. Without it (SQLite, one process) nothing leaves
this process. A signal that cannot be forwarded because the database is away gets
``Error(unavailable, ref=id)``: nothing is dropped without its sender hearing of it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web

from engine.p2p import signaling_protocol as sp
from engine.p2p.errors import IdentityError
from engine.p2p.identity import peer_id_of, verify

from ..http.ratelimit import ConnectionLimiter
from .offer_gate import RATE_LIMITED, OfferGate
from .presence import ReplicaGroup, new_conn_id
from .turn import TurnConfig, turn_server

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0

# WebSocket close codes (application range) for refused peers; the Error frame before says more.
CLOSE_POLICY = 1008
CLOSE_UNAUTHORIZED = 4401  # no, bad, expired or revoked token; bad key proof
CLOSE_FORBIDDEN = 4403  # host not bound to the account, or account disabled
CLOSE_TRY_AGAIN = 1013
UNAVAILABLE = "unavailable"
_CLOSE_FOR = {
    UNAVAILABLE: CLOSE_TRY_AGAIN,
    sp.AUTH_FAILED: CLOSE_UNAUTHORIZED,
    sp.TOKEN_REQUIRED: CLOSE_UNAUTHORIZED,
    sp.TOKEN_INVALID: CLOSE_UNAUTHORIZED,
    sp.TOKEN_EXPIRED: CLOSE_UNAUTHORIZED,
    sp.TOKEN_REVOKED: CLOSE_UNAUTHORIZED,
    sp.HOST_NOT_BOUND: CLOSE_FORBIDDEN,
    sp.ACCOUNT_DISABLED: CLOSE_FORBIDDEN,
}


class PeerRefused(Exception):
    """Raised by an authorizer: ``code`` goes to the peer in an Error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# authorize(token, peer_id): return to admit, raise PeerRefused to refuse. token may be None.
PeerAuthorizer = Callable[[str | None, str], Awaitable[None]]
# recheck(online peer ids) -> those to disconnect now.
PeerRecheck = Callable[[list[str]], Awaitable[set[str]]]
RECHECK_S = 5.0


@dataclass
class HubStats:
    relayed: int = 0
    unknown_peer: int = 0
    malformed: int = 0
    auth_failed: int = 0
    rate_limited: int = 0
    offers_limited: int = 0
    duplicates: int = 0


@dataclass
class SignalingHub:
    ice_servers: Sequence[sp.IceServer] = ()
    turn: TurnConfig | None = None
    peers: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    stats: HubStats = field(default_factory=HubStats)
    authorize: PeerAuthorizer | None = None
    require_token: bool | None = None  # None: required exactly when ``authorize`` is set
    limiter: ConnectionLimiter | None = None
    offers: OfferGate = field(default_factory=OfferGate)
    recheck: PeerRecheck | None = None
    recheck_s: float = RECHECK_S
    address_of: Callable[[web.Request], str] | None = None
    group: ReplicaGroup | None = None
    _conns: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # peer id -> conn
    _closing: bool = field(default=False, init=False, repr=False)
    _sweeper: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.require_token is None:
            self.require_token = self.authorize is not None
        if self.require_token and self.authorize is None:
            raise ValueError("require_token needs an authorize callable to check the tokens")

    def online(self) -> list[str]:
        """The peers on this replica (all of them without a replica group)."""
        return sorted(self.peers)

    async def online_all(self) -> list[str]:
        """The peers on every live replica of the group (``online`` without one)."""
        if self.group is None:
            return self.online()
        return sorted(set(await self.group.online()) | set(self.peers))

    def healthy(self) -> bool:
        """False while this replica cannot relay to or from the others (for ``/healthz``)."""
        return self.group is None or self.group.healthy()

    async def sweep_everywhere(self) -> None:
        """``sweep`` here now, and ask every other replica to do the same."""
        await self.sweep()
        if self.group is not None:
            try:
                await self.group.request_sweep()
            except Exception:  # their own periodic sweep comes within recheck_s anyway
                logger.exception("cannot ask the other replicas to sweep")

    def local_peers(self) -> dict[str, str]:
        return dict(self._conns)

    async def deliver_local(self, peer_id: str, frame: str) -> bool:
        ws = self.peers.get(peer_id)
        if ws is None or ws.closed:
            return False
        try:
            await ws.send_str(frame)
        except ConnectionError:
            return False
        self.stats.relayed += 1
        return True

    async def evict_local(self, peer_id: str, conn: str) -> None:
        """The peer reconnected to another replica: close this replica's socket ``conn`` of it."""
        if self._conns.get(peer_id) != conn:
            return
        ws = self.peers.pop(peer_id, None)
        self._conns.pop(peer_id, None)
        if ws is not None:
            await ws.close(message=b"replaced by a newer connection")

    async def sweep(self) -> int:
        """Close the sockets of online peers that ``recheck`` refuses now; returns how many."""
        if self.recheck is None or not self.peers:
            return 0
        try:
            gone = await self.recheck(list(self.peers))
        except Exception:  # the database is down: keep serving, try again next time
            logger.exception("cannot recheck online peers")
            return 0
        for peer_id in gone:
            ws = self.peers.pop(peer_id, None)
            self._conns.pop(peer_id, None)
            if ws is not None:
                await self._refuse(ws, sp.ACCOUNT_DISABLED, "this account is disabled")
        return len(gone)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.recheck_s)
            await self.sweep()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.recheck is not None and (self._sweeper is None or self._sweeper.done()):
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="signaling-recheck")
        address = self.address_of(request) if self.address_of is not None else (request.remote or "?")
        if self.limiter is not None:
            if not self.limiter.acquire(address):
                self.stats.rate_limited += 1
                retry = max(1, int(self.limiter.retry_after(address)))
                return web.json_response(
                    {"error": "rate_limited", "message": "too many signaling connections from this address"},
                    status=429,
                    headers={"Retry-After": str(retry)},
                )
            try:
                return await self._handle(request)
            finally:
                self.limiter.release(address)
        return await self._handle(request)

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=sp.MAX_FRAME_BYTES, heartbeat=20.0)
        await ws.prepare(request)
        peer_id = await self._authenticate(ws)
        if peer_id is None:
            await ws.close()
            return ws
        conn = new_conn_id()
        previous = self.peers.get(peer_id)
        self.peers[peer_id] = ws
        self._conns[peer_id] = conn
        if previous is not None:
            # The newest socket wins: a node that lost its network reconnects before the old socket dies.
            await previous.close(message=b"replaced by a newer connection")
        try:
            if self.group is not None:
                try:
                    await self.group.claim(peer_id, conn)
                except Exception:
                    logger.exception("cannot claim the presence of %s", peer_id[:12])
                    await self._refuse(
                        ws, UNAVAILABLE, "the coordinator cannot reach its database; retry later"
                    )
                    return ws
            welcome = sp.Welcome(peer_id=peer_id, ice_servers=self.ice_servers_for(peer_id))
            await ws.send_str(sp.encode(welcome))
            await self._relay_loop(peer_id, ws)
        finally:
            if self.peers.get(peer_id) is ws:
                del self.peers[peer_id]
                self._conns.pop(peer_id, None)
            if self.group is not None and not self._closing:  # closing: the replica's row takes them all
                try:  # only this socket's row: a newer one elsewhere keeps its own
                    await self.group.release(peer_id, conn)
                except Exception:  # the row dies with this replica's heartbeat, or the next claim
                    logger.warning("cannot release the presence of %s", peer_id[:12])
        return ws

    async def _authenticate(self, ws: web.WebSocketResponse) -> str | None:
        nonce = secrets.token_bytes(32)
        await ws.send_str(sp.encode(sp.Challenge(nonce=nonce)))
        try:
            msg = await asyncio.wait_for(ws.receive(), HELLO_TIMEOUT_S)
        except TimeoutError:
            await self._refuse(ws, "timeout", f"no hello within {HELLO_TIMEOUT_S:.0f} s")
            return None
        if msg.type != WSMsgType.TEXT:
            return None
        try:
            hello = sp.server_decoder.decode(msg.data)
            if not isinstance(hello, sp.Hello):
                raise IdentityError("expected a hello first")
            verify(hello.public_key, sp.DOMAIN + nonce, hello.signature)
            peer_id = peer_id_of(hello.public_key)
        except (msgspec.DecodeError, IdentityError) as e:
            self.stats.auth_failed += 1
            await self._refuse(ws, sp.AUTH_FAILED, str(e))
            return None
        if hello.token is not None or self.require_token:
            refusal = await self._authorize(hello.token, peer_id)
            if refusal is not None:
                self.stats.auth_failed += 1
                await self._refuse(ws, refusal.code, refusal.message)
                return None
        return peer_id  # the caller welcomes it once its presence is recorded

    async def _authorize(self, token: str | None, peer_id: str) -> PeerRefused | None:
        if token is None:
            return PeerRefused(sp.TOKEN_REQUIRED, "this hub admits account holders only: send a token")
        if self.authorize is None:
            return None  # a token offered to a hub without accounts is ignored
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                await self.authorize(token, peer_id)
        except PeerRefused as e:
            return e
        except Exception:  # the database is down or slow: the peer may retry later
            logger.exception("cannot check a signaling token")
            return PeerRefused(UNAVAILABLE, "the coordinator cannot check tokens right now; retry later")
        return None

    def ice_servers_for(self, peer_id: str) -> list[sp.IceServer]:
        """STUN as configured, plus TURN with a credential minted for this peer (if TURN is set up)."""
        servers = list(self.ice_servers)
        if self.turn is not None:
            servers.append(turn_server(self.turn, peer_id))
        return servers

    async def _relay_loop(self, peer_id: str, ws: web.WebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                self.stats.malformed += 1
                await self._refuse(ws, "malformed", "signaling frames are JSON text")
                return
            try:
                signal = sp.server_decoder.decode(msg.data)
                if not isinstance(signal, sp.Signal):
                    raise msgspec.ValidationError("only signal messages after the hello")
            except msgspec.DecodeError as e:
                self.stats.malformed += 1
                await self._refuse(ws, "malformed", str(e))
                return
            verdict = self.offers.check(peer_id, signal)
            if verdict == "duplicate":
                self.stats.duplicates += 1
                continue
            if verdict == RATE_LIMITED:
                self.stats.offers_limited += 1
                wait = self.offers.retry_after(peer_id)
                error = sp.Error(
                    code=RATE_LIMITED, message=f"too many offers: retry in {wait:.1f} s", ref=signal.id
                )
                await ws.send_str(sp.encode(error))
                continue
            target = self.peers.get(signal.to)
            if (target is None or target.closed) and self.group is not None:
                await self._forward(ws, peer_id, signal)
                continue
            if target is None or target.closed:
                self.stats.unknown_peer += 1
                error = sp.Error(
                    code="unknown_peer", message=f"peer {signal.to[:12]} is not online", ref=signal.id
                )
                await ws.send_str(sp.encode(error))
                continue
            relayed = self.stamp(signal, peer_id)
            try:
                await target.send_str(sp.encode(relayed))
                self.stats.relayed += 1
            except ConnectionError:
                error = sp.Error(
                    code="unknown_peer", message=f"peer {signal.to[:12]} went away", ref=signal.id
                )
                await ws.send_str(sp.encode(error))

    async def _forward(self, ws: web.WebSocketResponse, peer_id: str, signal: sp.Signal) -> None:
        """Relay ``signal`` to a peer on another replica, or tell its sender why not."""
        assert self.group is not None
        frame = sp.encode(self.stamp(signal, peer_id))
        try:
            found = await self.group.forward(signal.to, frame, sender=peer_id, ref=signal.id)
        except Exception:
            logger.exception("cannot forward a signal to another replica")
            error = sp.Error(
                code=UNAVAILABLE, message="the coordinator cannot relay right now", ref=signal.id
            )
            await ws.send_str(sp.encode(error))
            return
        if not found:
            self.stats.unknown_peer += 1
            error = sp.Error(
                code="unknown_peer", message=f"peer {signal.to[:12]} is not online", ref=signal.id
            )
            await ws.send_str(sp.encode(error))

    async def close_all(self) -> None:
        """Going away: close every socket (1001) so clients reconnect at once, not after a timeout."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._closing = True
        sockets = list(self.peers.values())
        self.peers.clear()
        self._conns.clear()
        await asyncio.gather(
            *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"coordinator restarting") for ws in sockets),
            return_exceptions=True,
        )

    def stamp(self, signal: sp.Signal, sender: str) -> sp.Signal:
        """The relayed copy, with the authenticated sender; tests override it to play a hostile hub."""
        return msgspec.structs.replace(signal, sender=sender)

    @staticmethod
    async def _refuse(ws: web.WebSocketResponse, code: str, message: str) -> None:
        if not ws.closed:
            await ws.send_str(sp.encode(sp.Error(code=code, message=message)))
            await ws.close(code=_CLOSE_FOR.get(code, CLOSE_POLICY), message=code.encode()[:120])


HUB_KEY = web.AppKey("hub", SignalingHub)
