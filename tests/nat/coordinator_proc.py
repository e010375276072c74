"""The coordinator with STUN and TURN, for the NAT testbed: ``python -m tests.nat.coordinator_proc``.

``lah coordinator`` has no TURN flags; this starts :func:`coordinator.server.app.start` with coturn's address
as STUN server and short-lived TURN credentials (``TurnConfig``). Prints one JSON line when it listens
and runs until stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from coordinator.hub.turn import TurnConfig
from coordinator.server.app import start
from engine.p2p.signaling_protocol import IceServer


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--turn", help="HOST:PORT of coturn (STUN and TURN); none: no ICE servers")
    parser.add_argument("--stun", action="append", default=[], help="HOST:PORT of a further STUN server")
    parser.add_argument("--secret", default="")
    parser.add_argument("--ttl", type=int, default=600)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    ice: list[IceServer] = []
    turn = None
    if args.turn:
        ice = [IceServer(urls=[f"stun:{args.turn}", *(f"stun:{s}" for s in args.stun)])]
        turn = TurnConfig(urls=(f"turn:{args.turn}?transport=udp",), secret=args.secret, ttl_s=args.ttl)
    running = await start(args.host, args.port, ice_servers=ice, turn=turn)
    print(json.dumps({"event": "ready", "url": running.signaling_url}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin (or dies)
    await running.stop()


if __name__ == "__main__":
    asyncio.run(main())
