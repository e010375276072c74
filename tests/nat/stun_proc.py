"""A second, minimal STUN server for the NAT testbed: ``python -m tests.nat.stun_proc --host H --port P``.

Answers Binding requests with the sender's address (what a home peer needs to learn its public
mapping), nothing else. With it the testbed has STUN apart from coturn, so coturn down means "no
TURN" without also meaning "no STUN". Prints one JSON line when it listens; runs until stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aioice import stun


class Responder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            request = stun.parse_message(data)
        except ValueError:
            return
        if request.message_method != stun.Method.BINDING or request.message_class != stun.Class.REQUEST:
            return
        reply = stun.Message(stun.Method.BINDING, stun.Class.RESPONSE, request.transaction_id)
        reply.attributes["XOR-MAPPED-ADDRESS"] = addr
        assert self.transport is not None
        self.transport.sendto(bytes(reply), addr)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(Responder, local_addr=(args.host, args.port))
    print(json.dumps({"event": "ready"}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    transport.close()


if __name__ == "__main__":
    asyncio.run(main())
