"""Where a process's CPU goes, by layer, from a py-spy profile in collapsed ("raw") format.

Each line of a raw profile is ``frame;frame;...;leaf count`` (outermost first; with ``--threads`` the
first frame names the thread). A sample is charged to the innermost frame whose file belongs to a known
layer, so time a Python function spends inside a C call (OpenSSL, uvloop, torch kernels, socket calls) is
charged to the layer that made the call. Layers:

    sctp       aiortc's SCTP association and the project's SCTP patches (incl. crc32c calls)
    dtls       aiortc's DTLS transport, pyOpenSSL, cryptography (record encryption, decryption), the
               project's DTLS patch and the compiled record layer it calls (seal, open, sendto)
    ice        aioice (STUN demux, the ICE connection's datagram path)
    datachannel aiortc's RTCDataChannel and pyee's event emitter (per message, not per packet)
    framing    the project's channel, framing, RPC and Peer (engine/p2p), msgspec, the wire codec
    loop       asyncio / uvloop themselves: scheduling, timers, selectors, futures (a sample whose
               innermost Python frame is the loop's runner is time inside uvloop's C code)
    torch      torch and the expert (engine/moe): compute, casts, the optimizer
    other      everything else (threading, logging, multiprocessing...)

    .venv/bin/python benchmarks/cpu_breakdown.py PROFILE.txt [...]   # prints one JSON object per file
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

# Checked from the innermost frame outwards; the first layer whose pattern matches a frame wins.
LAYERS: list[tuple[str, re.Pattern[str]]] = [
    (
        "sctp",
        re.compile(r"aiortc/rtcsctptransport\.py|engine/p2p/patches/(sctp\w*|congestion)\.py|crc32c"),
    ),
    (
        "dtls",
        re.compile(r"aiortc/rtcdtlstransport\.py|OpenSSL/|cryptography/|pylibsrtp|engine/p2p/(patches/dtls|native/)"),
    ),
    ("ice", re.compile(r"aioice/|aiortc/rtcicetransport\.py|engine/p2p/patches/ice\.py")),
    ("datachannel", re.compile(r"aiortc/rtcdatachannel\.py|pyee/")),
    ("framing", re.compile(r"engine/p2p/|engine/wire/|msgspec/")),
    ("loop", re.compile(r"asyncio/|uvloop|engine/p2p/eventloop\.py|engine/moe/loop_thread\.py")),
    ("torch", re.compile(r"torch/|engine/moe/")),
]


def layer_of(stack: list[str]) -> str:
    """The layer a sample belongs to: the innermost frame that names one (frames outermost first)."""
    for frame in reversed(stack):
        for name, pattern in LAYERS:
            if pattern.search(frame):
                return name
    return "other"


def parse_line(line: str) -> tuple[list[str], int] | None:
    """``a;b;c 12`` -> (["a", "b", "c"], 12); None for blank or malformed lines."""
    line = line.strip()
    stack, sep, count = line.rpartition(" ")
    if not sep or not count.isdigit() or not stack:
        return None
    return stack.split(";"), int(count)


def breakdown(path: Path, thread: str | None = None) -> dict[str, float]:
    """Share of samples per layer (sums to 1), plus ``samples``; only ``thread`` if given (a substring of
    the first frame, which py-spy's ``--threads`` sets to the thread's name and id)."""
    counts: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        stack, n = parsed
        if thread is not None and (not stack or thread not in stack[0]):
            continue
        counts[layer_of(stack)] += n
    total = sum(counts.values())
    out: dict[str, float] = {name: round(counts[name] / total, 3) if total else 0.0 for name, _ in LAYERS}
    out["other"] = round(counts["other"] / total, 3) if total else 0.0
    out["samples"] = total
    return out


def top_functions(path: Path, n: int = 15) -> list[tuple[str, int]]:
    """The ``n`` leaf frames with the most samples (self time), for reading alongside the layers."""
    counts: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        parsed = parse_line(line)
        if parsed is not None and parsed[0]:
            counts[parsed[0][-1]] += parsed[1]
    return counts.most_common(n)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps({"file": arg, **breakdown(Path(arg)), "top": top_functions(Path(arg), 10)}))
