"""``DHTTransport`` over ``engine.p2p.Peer``: the four DHT methods as unary RPCs on WebRTC links.

The handler's sender is ``CallContext.peer_id``: the peer id the link proved with its signed offer and
DTLS fingerprint, so a DHT node cannot pose as another. Every p2p and wire failure of a call becomes
``CallFailed`` (``CallTimeout`` for timeouts), which is all the protocol needs to know.
"""

from __future__ import annotations

from engine.p2p import CallContext, P2PError, Peer, RemoteError, RpcTimeout
from engine.wire import Kind, Message, WireError

from .errors import BadRequest, CallFailed, CallTimeout
from .transport import Fields, Handler


class PeerTransport:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    @property
    def peer_id(self) -> str:
        return self.peer.peer_id

    async def call(self, peer_id: str, method: str, fields: Fields, *, timeout: float) -> Fields:
        try:
            reply = await self.peer.call(peer_id, method, fields, timeout=timeout)
        except (RpcTimeout, TimeoutError) as e:
            raise CallTimeout(f"{method} to {peer_id[:12]}: {e}") from e
        except (P2PError, WireError) as e:
            raise CallFailed(f"{method} to {peer_id[:12]}: {type(e).__name__}: {e}") from e
        return reply.fields

    def serve(self, method: str, handler: Handler) -> None:
        async def unary(msg: Message, ctx: CallContext) -> Message:
            try:
                fields = await handler(ctx.peer_id, msg.fields)
            except BadRequest as e:
                raise RemoteError("bad_request", str(e)) from e
            return Message(Kind.RESPONSE, 0, fields=fields)

        self.peer.handlers.add_unary(method, unary)
