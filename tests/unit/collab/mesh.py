"""Peers for the collab services without sockets: every pair joined by an in-memory channel pair
(:mod:`tests.memchannel`) carrying the real framing, wire codec and RPC (``RpcEndpoint``), so an
:class:`~engine.collab.AllReduceService` or a :class:`~engine.collab.state.StateDonor` runs on it as on
``engine.p2p.Peer`` (the services use ``peer_id``, ``handlers`` and ``call``); and :class:`FakeDHT`,
one slot per signer and key, as the DHT keeps records (signatures are the DHT's business, tested
there). Also used by ``benchmarks/byzantine.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.p2p.channel import FramedChannel
from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_wire import CompressionArg, Handlers
from engine.wire import Compression, Limits, Message
from tests.memchannel import MemoryChannel, channel_pair

WINDOW = 8 << 20


class MemPeer:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.handlers = Handlers()
        self.endpoints: dict[str, RpcEndpoint] = {}

    async def call(
        self,
        peer_id: str,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = 30.0,
        compression: CompressionArg = Compression.NONE,
    ) -> Message:
        return await self.endpoints[peer_id].call(
            method, fields, tensors, timeout=timeout, compression=compression
        )

    def close(self) -> None:
        for endpoint in self.endpoints.values():
            endpoint.close()


def _endpoint(channel: MemoryChannel, handlers: Handlers, remote: str) -> RpcEndpoint:
    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(
            channel, on_message, max_frame=16384, window=WINDOW, max_message_bytes=WINDOW // 2
        )

    return RpcEndpoint(make, handlers, peer_id=remote, limits=Limits(max_message_bytes=WINDOW // 2))


def mesh(ids: Sequence[str], rate: int = 8 << 20) -> list[MemPeer]:
    """Peers with these ids, every pair linked (``rate``: bytes per loop turn on each channel)."""
    peers = [MemPeer(i) for i in ids]
    for i, a in enumerate(peers):
        for b in peers[i + 1 :]:
            ca, cb = channel_pair(max_message_size=16384, rate=rate)
            a.endpoints[b.peer_id] = _endpoint(ca, a.handlers, b.peer_id)
            b.endpoints[a.peer_id] = _endpoint(cb, b.handlers, a.peer_id)
    return peers


@dataclass
class FakeRecord:
    value: bytes


@dataclass
class FakeGot:
    records: dict[tuple[str, str], FakeRecord]


class FakeDHT:
    """Each signer's one slot per key; :meth:`node` is one signer's view (store, get, clock)."""

    def __init__(self) -> None:
        self.slots: dict[str, dict[str, bytes]] = {}

    def node(self, owner: str) -> Any:
        dht = self

        class Node:
            peer_id = owner

            def clock(self) -> float:
                return time.time()

            async def store(self, key: str, value: bytes, expiration: float) -> None:
                dht.slots.setdefault(key, {})[owner] = value

            async def get(self, key: str) -> FakeGot:
                got = dht.slots.get(key, {})
                return FakeGot({(o, ""): FakeRecord(v) for o, v in got.items()})

        return Node()
