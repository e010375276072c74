"""The seam between the DHT protocol and whatever carries its messages.

A transport knows its own peer id, calls a method on another peer with a dict of wire fields (scalars
and lists of scalars, as ``engine.wire`` allows) under a finite timeout, and serves methods. A handler
receives the caller's peer id *as the transport authenticated it*: the protocol derives the sender's
node id from it and never from the message. Any failure of a call raises ``CallFailed`` (``CallTimeout``
for timeouts). Two implementations: ``memory.MemoryNetwork`` (thousands of nodes in one process, with
delay, loss and dead nodes) and ``p2p_transport.PeerTransport`` (``engine.p2p.Peer`` over WebRTC).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

Fields = dict[str, Any]
Handler = Callable[[str, Fields], Awaitable[Fields]]


class DHTTransport(Protocol):
    @property
    def peer_id(self) -> str: ...

    async def call(self, peer_id: str, method: str, fields: Fields, *, timeout: float) -> Fields:
        """Call ``method`` on ``peer_id``; raise CallFailed / CallTimeout, never wait past ``timeout``."""
        ...

    def serve(self, method: str, handler: Handler) -> None: ...
