"""Compiled parts of the data path, each with the Python path beside it as fallback and test oracle.

Layers: ``_records`` (C, ``setup.py`` builds it against OpenSSL's libcrypto; ``records.h`` draws its
files' layers, ``_records.c`` is the module) seals and opens DTLS 1.2 application-data records and
sends them with one ``sendto`` (``dtls_record.c``); builds and parses the SCTP packets inside
(``sctp_packet.c``, ``sctp_calls.c``); sends a sender's burst of DATA chunks with one
``sendmmsg`` or UDP GSO message (``sctp_burst.c``); takes the receiver's in-order DATA chunk on aiortc's
own objects (``sctp_receive.c``); and runs the sender's two per-chunk loops there too (``sctp_send.c``,
twins of :mod:`engine.p2p.patches.sctp_loops`). :mod:`.keys` derives the records' keys from the session
OpenSSL negotiated; this module loads ``_records`` once and says why it could not. The handshake, every
other record type and every session whose suite is not AEAD stay in OpenSSL; the callers are
:mod:`engine.p2p.patches.dtls` and the SCTP patches beside it.

A missing or broken build (no compiler or OpenSSL headers where it was built, a wrong CPU, a library
that fails to load) is not an error: the node runs the Python path, slower, logs one warning, and the
app's About box and ``--self-test`` say so. ``LAH_NATIVE=0`` in the environment, or :func:`set_enabled`,
forces the Python path (benchmarks compare both; tests force the fallback).

May import: nothing
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

_module: ModuleType | None = None
_reason: str | None = None
_loaded = False
_enabled = os.environ.get("LAH_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def _load() -> None:
    global _module, _reason, _loaded
    _loaded = True
    try:
        _module = importlib.import_module("engine.p2p.native._records")
    except Exception as e:  # ImportError, or an OSError/undefined symbol from the shared library
        _module, _reason = None, f"{type(e).__name__}: {e}"
        logger.warning("compiled DTLS record layer not loaded, using the Python path (slower): %s", _reason)


def records() -> Any | None:
    """The ``_records`` module when it loaded and is enabled, else None (the Python path)."""
    if not _loaded:
        _load()
    return _module if _enabled else None


def set_enabled(enabled: bool) -> None:
    """Turn the compiled path on or off for links set up from now on (links already up keep theirs)."""
    global _enabled
    _enabled = enabled


def reload() -> Any | None:
    """Load again (tests that break the import and then restore it)."""
    global _loaded
    _loaded = False
    return records()


def status() -> str:
    """One line for the About box, ``--self-test`` and logs."""
    if not _loaded:
        _load()
    if _module is None:
        return f"Python (compiled record layer not loaded: {_reason})"
    version = _module.openssl_version()
    if not _enabled:
        return f"Python (compiled record layer turned off; built against {version})"
    return f"compiled DTLS records ({version})"
