"""Every change this project makes to aiortc's and aioice's behaviour, in one place.

aiortc is correct but not built for bulk tensors: its costs are per SCTP packet (see FACTS.md). The
changes here stay inside what the standards allow, so a browser or any other WebRTC stack still
interoperates with us: packet sizes, the SCTP wire format and the SDP are untouched.

The module is pinned: :data:`PINNED` names the versions it was written against, and :func:`apply`
refuses to run on others. ``tests/unit/test_aiortc_patches.py`` also hashes the source of every
function replaced here (:data:`ORIGINAL_SOURCE_SHA256`), so an upgrade that changes one fails
loudly instead of silently running our copy of old code.

Host candidate pinning: aioice never offers 127.0.0.1 and offers every interface address otherwise.
Tests and the local demo must only use loopback (or addresses of namespaces they made), so
:func:`pin_host_addresses` makes aioice gather host candidates on exactly the given addresses.

Speed patches installed by :func:`apply` (numbers: benchmarks/sctp_probe.py, 2 cores, loopback;
see the end of this docstring):

1. Delayed SACK (``RTCSctpTransport._send_sack``). Stock aiortc SACKs every DATA packet. We SACK
   every second packet carrying DATA, and at once when the SACK reports a gap or a duplicate, when
   the previous SACK reported a gap (it is now filled), on FORWARD TSN, or outside ESTABLISHED;
   otherwise a timer sends it within :data:`SACK_DELAY` s. That is RFC 9260 section 6.2 exactly
   (ack at least every second packet, delay < 500 ms, 200 ms recommended; immediate on gaps and
   duplicates). The SACK chunk itself is unchanged. Halves the receiver's packets sent and the
   sender's SACK processing.
2. Reassembly without rescans (``InboundStream``). Stock ``pop_messages`` rescans every buffered
   fragment on every arrival (quadratic per message). A fragment appended after all buffered ones
   that is not a LAST fragment cannot complete a message, so we skip the scan then; every other case
   runs the stock scan. Local only; the output equals the stock class's (randomized oracle test).
3. In-order fast path in ``_mark_received``: with no gaps or duplicates pending, the next TSN only
   advances the cumulative TSN (stock sorts and rebuilds two containers per packet). Local only.
4. Fast path in ``_update_advanced_peer_ack_point`` (run on every SACK): with nothing abandoned and
   no FORWARD TSN pending it only advances the ack point (stock rebuilds a dict per SACK).
5. aioice ``StunProtocol.datagram_received``: a datagram whose first byte is 20..63 is DTLS
   (RFC 7983 demultiplexing) and goes straight to the connection instead of first failing a STUN
   parse (an exception per packet). STUN (first byte 0..3) is handled as before.
6. Sender SACK processing without queue scans (``_receive_sack_chunk``): the sent queue holds
   consecutive TSNs, so gap blocks and the holes before the highest newly acked TSN are indexed
   instead of scanning the queue twice per SACK; same updates in the same order (oracle test against
   the stock method on random lossy runs). Malformed gap lists fall back to the stock code.
7. ``_transmit`` skips its scan of the whole sent queue for ``_retransmit`` chunks when no path that
   can mark one (gap strike, T3 expiry) has run since the last complete scan (flag ``_rtx_pending``).

Figures (benchmarks/sctp_probe.py, 32 MiB, 2 noisy cores; CPU ms per MiB, both processes, median of
3): stock asyncio 64 KiB 100 (1 run); patched+uvloop 1-5 only: 64 KiB 55, 256 KiB 59; with 6-7:
64 KiB 74, 256 KiB 67 (spread 41-95: loopback UDP loss varies run to run and dominates; 6-7 show
no measurable gain yet). 256 KiB messages are not cheaper than 64 KiB.

Not changed on purpose: SCTP_MAX_PACKET_LENGTH (1189), chunk bundling, the SDP, the DTLS layer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aioice
import aioice.ice
import aiortc

logger = logging.getLogger(__name__)

PINNED = {"aiortc": "1.16.0", "aioice": "0.13.0"}


class PatchVersionError(RuntimeError):
    """aiortc or aioice is not the version these patches were written for."""


_original_get_host_addresses = aioice.ice.get_host_addresses
_pinned_hosts: list[str] | None = None


def check_versions() -> None:
    found = {"aiortc": aiortc.__version__, "aioice": aioice.__version__}
    if found != PINNED:
        raise PatchVersionError(
            f"engine/p2p/aiortc_patches.py was written for {PINNED}, found {found}: "
            "review every patch against the new source before raising the pin"
        )


def _get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if _pinned_hosts is None:
        return _original_get_host_addresses(use_ipv4, use_ipv6)  # type: ignore[no-any-return]
    return [a for a in _pinned_hosts if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]


def pin_host_addresses(addresses: Sequence[str] | None) -> None:
    """Gather ICE host candidates only on ``addresses`` (None restores aioice's own choice).

    Process-wide on purpose: one process is one node, and a node lives at one set of addresses.
    """
    global _pinned_hosts
    check_versions()
    _pinned_hosts = None if addresses is None else list(addresses)
    aioice.ice.get_host_addresses = _get_host_addresses


def pinned_host_addresses() -> list[str] | None:
    return None if _pinned_hosts is None else list(_pinned_hosts)


_applied = False


def apply() -> None:
    """Install the SCTP speed patches and the direct-path preference (idempotent)."""
    global _applied
    check_versions()
    if _applied:
        return
    from engine.p2p import aioice_patches, aiortc_sctp_fast

    aiortc_sctp_fast.install()
    aioice_patches.install()
    _applied = True


def applied() -> bool:
    return _applied
