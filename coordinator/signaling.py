"""The signaling hub: relays signed offers and answers between authenticated peers.

A peer proves its id by signing a fresh nonce with its identity key, so ``sender`` on a relayed
message is always true. The hub never reads the SDP it relays; peers verify each other's signatures
themselves, so the hub cannot impersonate anyone either. A malformed frame is the client's fault: it
gets an Error and is disconnected; the hub goes on serving the others.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
from aiohttp import WSMsgType, web

from engine.p2p import signaling_protocol as sp
from engine.p2p.errors import IdentityError
from engine.p2p.identity import peer_id_of, verify

from .turn import TurnConfig, turn_server

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


@dataclass
class HubStats:
    relayed: int = 0
    unknown_peer: int = 0
    malformed: int = 0
    auth_failed: int = 0


@dataclass
class SignalingHub:
    ice_servers: Sequence[sp.IceServer] = ()
    turn: TurnConfig | None = None
    peers: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    stats: HubStats = field(default_factory=HubStats)

    def online(self) -> list[str]:
        return sorted(self.peers)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=sp.MAX_FRAME_BYTES, heartbeat=20.0)
        await ws.prepare(request)
        peer_id = await self._authenticate(ws)
        if peer_id is None:
            await ws.close()
            return ws
        previous = self.peers.get(peer_id)
        self.peers[peer_id] = ws
        if previous is not None:
            # The newest socket wins: a node that lost its network reconnects before the old socket dies.
            await previous.close(message=b"replaced by a newer connection")
        try:
            await self._relay_loop(peer_id, ws)
        finally:
            if self.peers.get(peer_id) is ws:
                del self.peers[peer_id]
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
            await self._refuse(ws, "auth_failed", str(e))
            return None
        await ws.send_str(sp.encode(sp.Welcome(peer_id=peer_id, ice_servers=self.ice_servers_for(peer_id))))
        return peer_id

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
            target = self.peers.get(signal.to)
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

    def stamp(self, signal: sp.Signal, sender: str) -> sp.Signal:
        """The relayed copy, with the authenticated sender; tests override it to play a hostile hub."""
        return msgspec.structs.replace(signal, sender=sender)

    @staticmethod
    async def _refuse(ws: web.WebSocketResponse, code: str, message: str) -> None:
        if not ws.closed:
            await ws.send_str(sp.encode(sp.Error(code=code, message=message)))
            await ws.close()
