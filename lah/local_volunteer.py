"""One volunteer node of a local swarm in a process of its own (``python -m lah.local_volunteer``).

Local swarms (``lah demo --experiment lm``, ``benchmarks/lm_quality.py``) start volunteers this way so
that each has its own interpreter, event loop and CPU, as volunteers on other machines do, rather than
sharing the trainer's. The node registers a fresh account, binds a new identity kept in ``--data-dir``,
hosts what the coordinator assigns (``engine.node.join_local``), prints one JSON line (its peer id and
experts), and serves until its standard input closes: a parent that dies takes its volunteers with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

__all__ = ["main"]


async def _serve(coordinator: str, name: str, data_dir: Path, ram_mib: int) -> None:
    from engine.node.join import join_local
    from engine.resources import Settings

    volunteer = await join_local(coordinator, name, data_dir, Settings(ram_budget_mib=ram_mib), device="cpu")
    try:
        print(json.dumps({"peer_id": volunteer.peer_id, "hosted": volunteer.hosted_uids}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin (or dies)
    finally:
        await volunteer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lah.local_volunteer", description=__doc__)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--ram-mib", type=int, default=256, help="memory for experts")
    args = parser.parse_args(argv)
    import torch

    from engine.p2p import eventloop
    from engine.p2p.patches import install, pin_host_addresses

    torch.set_num_threads(1)  # many small experts: threads only contend with the other processes
    install()
    pin_host_addresses([a for a in os.environ.get("LAH_HOST_ADDRESSES", "127.0.0.1").split(",") if a])
    eventloop.run(_serve(args.coordinator, args.name, args.data_dir, args.ram_mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
