"""Every change this project makes to aiortc's and aioice's behaviour, in one place.

Layers: :mod:`.registry` lists every replaced (or relied-upon) function with its source hash;
:mod:`.sctp_guard` (a packet parser that checks every length, and a link whose failure stays its own),
:mod:`.hosts`, :mod:`.ice`, :mod:`.sctp_receiver`, :mod:`.sctp_sender` (with what a SACK tells it in
:mod:`.sctp_sack`, its timers in :mod:`.sctp_timers`, its per-chunk loops in :mod:`.sctp_loops`, the
limits all four read in :mod:`.sctp_constants`), :mod:`.dtls` (records and datagrams,
below SCTP) and :mod:`.compiled_sctp` (SCTP packets on a link whose records are compiled) hold the
replacements; :mod:`.congestion` holds the pure congestion controllers the sender drives;
:mod:`.ack_frequency` is the SDP agreement on how often a receiver SACKs (a connection calls it around
its descriptions); :mod:`.handshake` holds the connect's timers under loss (DTLS flights copied early,
SCTP's INIT on the handshake's round trip, backed off, resent with tag 0: group ``handshake``);
:mod:`.tasks` holds the coroutines that timer callbacks start.
:func:`install` is called explicitly once at process start (the ``lah`` CLI, tests' conftest,
benchmarks), never by a constructor. On aiortc/aioice versions other than :data:`registry.PINNED`, or
where a replaced function's source hash differs, the group concerned stays stock and a warning is
logged: the node runs on plain aiortc, slower but correct. ``install(strict=True)`` raises
:class:`PatchMismatch` instead.

aiortc is correct but not built for bulk tensors: its costs are per SCTP packet (about 60 ms of
CPU per MiB moved on a 2-core machine). A browser or any other WebRTC stack still interoperates with
us: packet sizes and the SCTP wire format are untouched, and the SDP gains one attribute that other
stacks ignore (:mod:`.ack_frequency`). Two sender choices depart from RFC 9260 as Chromium's dcSCTP
does: a 10-packet initial window (section 7.2.1 bounds it at about 4 packets of this size; RFC 6928's
TCP figure) and a 0.3 s minimum RTO (section 16 recommends 1 s); :mod:`.congestion` and
:mod:`.sctp_constants` say why.

Host candidate pinning (:mod:`.hosts`): aioice gathers host candidates on exactly the addresses
given to :func:`pin_host_addresses` (tests and the local demo stay on loopback).

Loss recovery and congestion control (:mod:`.sctp_sender`; its docstring says what and why): fast
retransmit once, RACK, PRR, tail-loss probe, RTO 0.3-10 s with backoff, a 10-MTU initial window, the
peer's receive window honoured, 4 MiB advertised, CUBIC or a BBR-style controller (:mod:`.congestion`).

Speed patches (numbers: benchmarks/sctp_probe.py, 2 cores, loopback; end of this docstring):

1. Delayed SACK (``RTCSctpTransport._send_sack``). Stock aiortc SACKs every DATA packet. We SACK
   every second packet carrying DATA (every N where both peers agreed N in the SDP,
   :mod:`.ack_frequency`), and at once when a chunk carries RFC 7053's I bit, when the SACK reports a
   gap or a duplicate, when the previous SACK reported a gap (it is now filled), on FORWARD TSN, or
   outside ESTABLISHED;
   otherwise a timer sends it within :data:`.sctp_receiver.SACK_DELAY` s. That is RFC 9260 section 6.2 exactly
   (ack at least every second packet, delay < 500 ms, 200 ms recommended; immediate on gaps and
   duplicates). The SACK chunk itself is unchanged. Halves the receiver's packets sent and the
   sender's SACK processing. The delay's timer is lazy, as T3's is (item 7): armed once, left armed
   when the SACK goes early, re-armed at expiry for a SACK that waits then.
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
   parse (an exception per packet). STUN (first byte 0..3) is handled as before. Also in the ``ice``
   group (robustness, not speed): consent checks retransmit and expire 30 s after the last answer,
   so a lagging event loop no longer tears healthy links down (:mod:`.ice`'s docstring).

6. No ``_reset_deferred_streams`` coroutine per DATA chunk when no stream reset waits (it would do
   nothing); ``_handle_data`` dispatches DATA and SACK chunks directly instead of through
   ``_receive_chunk`` (packets with an INIT, another association's tag, or aiortc's debug log on take
   the stock path). Local only; the receiver state after hostile packets equals stock's (oracle test).
7. Lazy T3 (:mod:`.sctp_timers`): a restart moves a deadline instead of cancelling and creating a loop
   timer per SACK; the one timer re-arms itself at expiry when the deadline moved on. Expires when
   stock's would (the latest start or restart plus the RTO of that moment, RFC 9260 6.3.2).
8. DTLS records and datagrams (:mod:`.dtls`, group ``dtls``): after the handshake, OpenSSL's record calls
   through the cffi bindings without pyOpenSSL's per-call wrappers (no exception per empty BIO read),
   datagrams straight to the nominated UDP pair's transport and straight from aioice's queue. Same
   OpenSSL calls in the same order: same bytes on the wire. Also hashes the pyOpenSSL and aioice
   internals it relies on; any mismatch leaves this group stock. Where the compiled layer
   (:mod:`engine.p2p.native`) loaded, records, SCTP packets and their ``sendto`` leave Python
   altogether once the peer's first record arrives (:mod:`.dtls`'s docstring).
9. Per chunk, in C where the compiled layer loaded: a sender's burst is sent in one call (one
   ``sendmmsg``, or a UDP GSO message per run of equal-sized records); the receiver's in-order DATA
   chunk is taken on aiortc's objects (``open_receive``), in the UDP callback itself while the DTLS
   reader waits on an empty queue; the sender's loops over new chunks and over cumulatively acked ones
   run in C with the Python loops of :mod:`.sctp_loops` as fallback and oracle. aioice's datagram queue
   is a deque (``ice.DatagramQueue``: ``asyncio.Queue``'s bookkeeping cost ~2 µs a datagram).

Figures (benchmarks/sctp_probe.py, 32 MiB, 2 noisy cores; CPU ms per MiB, both processes, median of
3): stock asyncio 64 KiB 100 (1 run); patched+uvloop 1-5: 64 KiB 55, 256 KiB 59. Earlier sender fast
paths (indexed SACK processing, a retransmit-scan flag) showed no measurable gain and went when the
sender was replaced. 256 KiB messages are not cheaper than 64 KiB.

Not changed on purpose: SCTP_MAX_PACKET_LENGTH (1189), chunk bundling, the DTLS handshake's messages
(:mod:`.handshake` only resends them sooner, as byte-for-byte copies), and the SDP but for the one
attribute :mod:`.ack_frequency` adds.

Of the package around it, only its exceptions and the compiled layer are used here.

May import: engine.p2p.errors, engine.p2p.native
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..errors import PatchMismatch
from . import ack_frequency, congestion, dtls, hosts, registry, sctp_sender

logger = logging.getLogger(__name__)

PINNED = registry.PINNED
GROUPS = ("hosts", "guard", "sctp", "ice", "dtls", "handshake")
_installed: set[str] = set()


def install(strict: bool = False) -> set[str]:
    """Install every group whose originals match (idempotent); returns the groups installed.

    A group that does not match stays stock with a warning (``strict``: raise :class:`PatchMismatch`).
    """
    problems = registry.verify()
    for group in GROUPS:
        if group in _installed:
            continue
        if problems.get(group):
            if strict:
                raise PatchMismatch(f"aiortc/aioice patches ({group}) do not match: {problems[group]}")
            logger.warning(
                "running stock aiortc/aioice for %s (slower, still correct): %s",
                group,
                "; ".join(problems[group]),
            )
            continue
        registry.install_group(group)
        _installed.add(group)
    return set(_installed)


def installed(group: str = "sctp") -> bool:
    return group in _installed


def pin_host_addresses(addresses: Sequence[str] | None) -> None:
    """Gather ICE host candidates only on ``addresses`` (None restores aioice's own choice).

    Installs the ``hosts`` group if :func:`install` has not run yet (tests pin before anything else).
    """
    if "hosts" not in _installed:
        if registry.verify()["hosts"]:
            raise PatchMismatch("aioice.ice.get_host_addresses changed upstream: cannot pin host candidates")
        registry.install_group("hosts")
        _installed.add("hosts")
    hosts.pin(addresses)


def pinned_host_addresses() -> list[str] | None:
    return hosts.pinned()


def set_default_congestion_control(name: str) -> None:
    """The controller new associations start with (``cubic`` or ``bbr``)."""
    congestion.make(name, 1)  # raises ValueError for unknown names
    sctp_sender.DEFAULT_CONTROLLER = name


def set_congestion_control(transport: object, name: str) -> None:
    """Switch one association (``RTCPeerConnection.sctp``) to controller ``name``; no-op when stock."""
    if getattr(transport, "_cc", None) is not None:
        sctp_sender.set_controller(transport, name)


def advertise_sack_frequency(sdp: str) -> str:
    """The local description to sign and send: with our SACK-frequency attribute where the SCTP
    patches run (:mod:`.ack_frequency`)."""
    return ack_frequency.advertise(sdp)


def agree_sack_frequency(transport: object, local_sdp: str, remote_sdp: str) -> int:
    """Set an association (``RTCPeerConnection.sctp``) to the SACK frequency both descriptions agree
    on; returns packets per SACK (2, the standard, unless both sides asked for more)."""
    return ack_frequency.apply(transport, local_sdp, remote_sdp)


def transport_stats(transport: object) -> dict[str, object]:
    """Retransmissions, recoveries, RTO expiries, srtt, cwnd... of one association ({} when stock), and
    which record layer its DTLS transport runs (``records``: compiled, openssl or stock)."""
    stats = sctp_sender.stats(transport)
    if stats:
        stats["malformed_packets"] = getattr(transport, "_lah_malformed", 0)
        stats["window_drops"] = getattr(transport, "_lah_window_drops", 0)
        stats["records"] = dtls.record_layer(getattr(transport, "transport", None) or transport)
        stats["sack_every"] = ack_frequency.sack_every(transport)
    return stats
