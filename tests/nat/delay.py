"""Added latency for the NAT testbed: an NFQUEUE consumer that accepts each packet later.

This machine's kernel has no netem qdisc, so ``iptables ... -j NFQUEUE --queue-num N`` hands packets to this
process, which holds each for ``ms`` ± ``jitter`` milliseconds and then accepts it. Release times never
go backwards (a packet leaves no earlier than the one before it), so jitter varies the delay without
reordering packets, as on one real path. Prints ``{"event":"ready"}`` once bound; ends when stdin closes.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import random
import select
import socket
import sys
import time
from typing import Any

from netfilterqueue import NetfilterQueue


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--ms", type=float, required=True)
    parser.add_argument("--jitter", type=float, default=0.0)
    args = parser.parse_args()
    held: list[tuple[float, int, Any]] = []
    order = itertools.count()
    last = 0.0

    def hold(pkt: Any) -> None:
        nonlocal last
        delay = max(0.0, args.ms + random.uniform(-args.jitter, args.jitter)) / 1000
        due = max(time.monotonic() + delay, last)
        last = due
        heapq.heappush(held, (due, next(order), pkt))

    nfq = NetfilterQueue()
    nfq.bind(args.queue, hold, max_len=65536)
    sock = socket.fromfd(nfq.get_fd(), socket.AF_NETLINK, socket.SOCK_RAW)
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    print(json.dumps({"event": "ready", "queue": args.queue}), flush=True)
    try:
        while True:
            wait = max(0.0, held[0][0] - time.monotonic()) if held else 1.0
            readable, _, _ = select.select([sock, stdin], [], [], wait)
            if stdin in readable and not os.read(stdin, 4096):
                break
            if sock in readable:
                nfq.run(block=False)
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
    finally:
        for _, _, pkt in held:
            pkt.accept()
        nfq.unbind()


if __name__ == "__main__":
    main()
