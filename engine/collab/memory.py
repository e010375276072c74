"""Hand freed all-reduce buffers back to the OS, so a round's peak memory is what it holds, not what
the allocator kept from earlier rounds.

Why: glibc's malloc serves a large allocation with its own ``mmap`` (returned to the OS on ``free``)
only above a *dynamic* threshold: freeing an mmapped block of ``s`` bytes raises the threshold to ``s``
(up to 32 MiB on 64-bit). After one round has freed its accumulator or a 30 MiB vector, the next
round's buffers of that size come from the heap instead, interleaved with the transport's small
objects, and freed heap pages stay resident unless they happen to sit at the heap's top. Measured in
``benchmarks/allreduce.py`` (``mallinfo2``): the second round's vector landed in the heap. Pinning
``M_MMAP_THRESHOLD`` at glibc's own initial value turns the adjustment off, so every buffer of 128
KiB or more (vectors, accumulators, residuals, decoded chunks and frames) is mapped and unmapped
on its own; ``malloc_trim`` after a round returns the heap's free pages too.

Both are process-wide settings of the C allocator; they change where memory comes from, never what a
program computes. Elsewhere (macOS, Windows, musl) this module does nothing: their allocators do not
have glibc's ratchet, and the calls do not exist.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value: allocations at least this big are mapped alone

_libc: Any | None = None
_pinned = False


def _glibc() -> Any | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None)
            if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt"):
                _libc = libc
        except OSError:  # pragma: no cover - a Linux without a loadable C library
            return None
    return _libc


def pin_mmap_threshold() -> bool:
    """Turn glibc's dynamic mmap threshold off (once per process); False where there is no glibc."""
    global _pinned
    libc = _glibc()
    if libc is None:
        return False
    if not _pinned:
        _pinned = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        if not _pinned:
            logger.debug("mallopt(M_MMAP_THRESHOLD) refused; freed buffers may stay resident")
    return _pinned


def trim() -> bool:
    """Return the heap's free pages to the OS (glibc's ``malloc_trim``); False where there is none."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
