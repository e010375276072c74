"""An in-memory network of DHT transports: many nodes in one process, with delay, loss and death.

Like aiortc's test ``utils`` pair, but for a whole swarm: every call is delivered through the event
loop after a random one-way ``delay`` (each direction), each direction is lost with probability
``loss`` (the caller then waits its full timeout, as on a real network), and a dead node never
answers (or refuses at once with ``fail_fast``). ``validate`` pushes every request and reply through
the real wire codec, so fields that could not travel between real peers fail here too. All nodes share
one CPU here, so a delivered call may overrun its timeout by ``cpu_grace`` s of queueing behind other
nodes' work (on a real network each node has its own); delay, loss and death cost the exact timeout.
``stats``
counts each injected fault, so tests can assert that the faults they asked for really happened.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from engine.wire import EncodeError, Kind, Message, decode_message, encode_message_bytes

from .errors import CallFailed, CallTimeout
from .ids import ID_BITS, peer_id_of_node
from .transport import Fields, Handler


@dataclass
class NetStats:
    calls: int = 0
    answered: int = 0
    lost: int = 0
    to_dead: int = 0
    remote_errors: int = 0


class MemoryNetwork:
    def __init__(
        self,
        *,
        delay: tuple[float, float] = (0.0, 0.0),
        loss: float = 0.0,
        seed: int = 0,
        validate: bool = False,
        fail_fast: bool = False,
        cpu_grace: float = 10.0,
    ) -> None:
        self.delay = delay
        self.loss = loss
        self.rng = random.Random(seed)
        self.validate = validate
        self.fail_fast = fail_fast
        self.cpu_grace = cpu_grace
        self.nodes: dict[str, MemoryTransport] = {}
        self.dead: set[str] = set()
        self.stats = NetStats()

    def add(self, peer_id: str | None = None) -> MemoryTransport:
        if peer_id is None:
            peer_id = peer_id_of_node(self.rng.getrandbits(ID_BITS))
        transport = MemoryTransport(self, peer_id)
        self.nodes[peer_id] = transport
        self.dead.discard(peer_id)
        return transport

    def kill(self, peer_id: str) -> None:
        self.dead.add(peer_id)

    def alive(self, peer_id: str) -> bool:
        return peer_id in self.nodes and peer_id not in self.dead

    def _delay(self) -> float:
        lo, hi = self.delay
        return lo if hi <= lo else self.rng.uniform(lo, hi)

    def _lost(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss


def _roundtrip(method: str, fields: Fields) -> Fields:
    try:
        raw = encode_message_bytes(Message(Kind.REQUEST, 1, method, fields))
    except EncodeError as e:
        raise CallFailed(f"{method}: fields cannot travel: {e}") from e
    return decode_message(raw).fields


class MemoryTransport:
    def __init__(self, network: MemoryNetwork, peer_id: str) -> None:
        self.network = network
        self._peer_id = peer_id
        self.handlers: dict[str, Handler] = {}

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def serve(self, method: str, handler: Handler) -> None:
        self.handlers[method] = handler

    async def call(self, peer_id: str, method: str, fields: Fields, *, timeout: float) -> Fields:
        net = self.network
        net.stats.calls += 1
        if not net.alive(self._peer_id):
            raise CallFailed("this node is down")
        if not net.alive(peer_id):
            net.stats.to_dead += 1
            if net.fail_fast:
                raise CallFailed(f"{peer_id[:12]} refused")
            return await _time_out(method, peer_id, timeout)
        if net._lost():
            net.stats.lost += 1
            return await _time_out(method, peer_id, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout(timeout + net.cpu_grace):
                reply = await self._deliver(peer_id, method, fields)
        except TimeoutError as e:
            raise CallTimeout(f"{method} to {peer_id[:12]}: no answer within {timeout:.3g} s") from e
        if net._lost() or not net.alive(peer_id):
            net.stats.lost += 1
            return await _time_out(method, peer_id, max(0.0, deadline - loop.time()))
        net.stats.answered += 1
        return reply

    async def _deliver(self, peer_id: str, method: str, fields: Fields) -> Fields:
        net = self.network
        if (d := net._delay()) > 0:
            await asyncio.sleep(d)
        if net.validate:
            fields = _roundtrip(method, fields)
        handler = net.nodes[peer_id].handlers.get(method)
        if handler is None:
            raise CallFailed(f"{peer_id[:12]} serves no {method!r}")
        try:
            reply = await handler(self._peer_id, fields)
        except Exception as e:  # what a remote handler error looks like to a real caller
            net.stats.remote_errors += 1
            raise CallFailed(f"{method} on {peer_id[:12]} failed: {type(e).__name__}: {e}") from e
        if net.validate:
            reply = _roundtrip(method, reply)
        if (d := net._delay()) > 0:
            await asyncio.sleep(d)
        return reply


async def _time_out(method: str, peer_id: str, timeout: float) -> Fields:
    await asyncio.sleep(timeout)
    raise CallTimeout(f"{method} to {peer_id[:12]}: no answer within {timeout:.3g} s")
