"""The allocator setting the all-reduce relies on: freed large buffers leave the process's memory.

Each case runs in a fresh interpreter, as the setting is process-wide and once set stays set. Linux
(glibc) only, as CI is; elsewhere the module does nothing by design."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Allocates and frees a 16 MiB tensor three times; prints RSS growth over the start after each free.
SCRIPT = """
import sys, psutil, torch
from engine.collab import memory
pinned = memory.pin_mmap_threshold() if sys.argv[1] == "pin" else None
trimmed = memory.trim()
proc = psutil.Process()
base = proc.memory_info().rss
growth = []
for _ in range(3):
    t = torch.ones(4 << 20)
    del t
    growth.append((proc.memory_info().rss - base) >> 20)
print(pinned, trimmed, max(growth))
"""


def run(mode: str) -> tuple[str, str, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    return out[0], out[1], int(out[2])


def test_pinned_threshold_returns_freed_buffers_to_the_os() -> None:
    pinned, trimmed, growth = run("pin")
    assert pinned == "True" and trimmed == "True"
    assert growth < 8  # MiB: each 16 MiB tensor was unmapped when freed

    # the reason for the setting: left alone, glibc keeps such buffers resident after the first
    _, _, growth = run("default")
    assert growth >= 16
