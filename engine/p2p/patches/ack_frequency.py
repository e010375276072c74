"""A SACK every N packets, agreed per association in the SDP, and the sender's I bit (RFC 7053) with it.

RFC 9260 6.2 asks a receiver to SACK at least every second packet because a standard sender (stock
aiortc, a browser's usrsctp or dcSCTP) grows its window by at most one MTU per SACK: fewer SACKs would
slow it down. For a bulk transfer between two of our peers that rule makes a third of all packets SACKs,
and a SACK costs its sender more Python than a DATA packet does (``_receive_sack_chunk``, the
controller, ``_transmit``). Our sender counts delivered bytes, not SACKs (the BBR-style controller
samples the delivery rate, CUBIC counts bytes), so it loses nothing when the peer SACKs every N packets,
which is what QUIC's ACK_FREQUENCY extension (draft-ietf-quic-ack-frequency) lets a sender ask for and
what QUIC stacks do by default (about every 10 packets). We ask for 8: 16 saved a little more CPU on
loopback, but a window of a few dozen packets then got two SACKs a round trip, and a 64 KiB call on a
50 ms path took a round trip more (docs/decisions/sack-frequency.md).

What keeps a thinner SACK stream prompt where it matters is RFC 7053's I bit, which the sender sets on
a DATA chunk after which it will wait for a SACK: its congestion window (or PRR's quota) has no room
for the next chunk, the peer's receive window has none, or nothing more is queued. A receiver SACKs
such a chunk at once (RFC 7053 says it SHOULD; ours does for any sender). So the end of a call never
waits for the delayed-SACK timer, and a window smaller than N packets never stalls. Retransmissions
and tail-loss probes carry the I bit too: they exist to draw a SACK. A window limited only by pacing
sets no I bit: the pacer sends again by itself.

**Agreement.** Each side whose SCTP patches are installed adds ``a=lah-sack-frequency:N`` to the
application section of the SDP it signs (:func:`advertise`); aiortc and browsers ignore attributes they
do not know, so the SDP stays a standard one. :func:`apply` looks at both descriptions of an
association: only when both carry the attribute does the receiver SACK every ``min(N_local,
N_remote)`` packets (:data:`MAX_SACK_EVERY` at most) and the sender set I bits. With a stock or browser
peer, or with one side's patches off, nothing changes: a SACK every second packet, no I bits sent.
Everything else of the SACK policy stays (:mod:`.sctp_receiver`): at once on gaps, duplicates, a filled
gap, FORWARD TSN and outside ESTABLISHED, and never later than ``SACK_DELAY`` after the first packet
waiting.

Why both and not one: the receiver may thin only if the remote sender sets I bits, and that sender
sets them only once it has seen our attribute; a receiver thinning for a sender that does not would
leave every tail to the 20 ms timer.
"""

from __future__ import annotations

import re
from typing import Any

ATTRIBUTE = "lah-sack-frequency"
MAX_SACK_EVERY = 8  # what we advertise and the most we accept: a SACK per 8 packets (~9 KiB)
STANDARD_SACK_EVERY = 2  # RFC 9260 6.2
I_BIT = 0x08  # RFC 7053 section 4.1: DATA chunk flag "SACK immediately"

_LINE = re.compile(rf"^a={ATTRIBUTE}:(\S*)[ \t]*\r?$", re.MULTILINE)
_VALUE = re.compile(r"^[0-9]{1,3}$")


def advertise(sdp: str, sack_every: int = MAX_SACK_EVERY) -> str:
    """``sdp`` with our attribute at the end of its application (data channel) section.

    Unchanged when the SCTP patches are not installed (a stock sender must keep its SACKs) or when
    there is no application section."""
    from . import installed  # the package imports this module; a call-time import keeps the layers

    if not installed("sctp") or _LINE.search(sdp):
        return sdp
    lines = sdp.split("\r\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("m=application")), None)
    if start is None:
        return sdp
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), None)
    if end is None:  # last section: before the empty string the final CRLF leaves
        end = len(lines) - 1 if lines[-1] == "" else len(lines)
    lines.insert(end, f"a={ATTRIBUTE}:{sack_every}")
    return "\r\n".join(lines)


def advertised(sdp: str) -> int | None:
    """The N a description asks for, or None when it carries no valid attribute.

    Only a plain decimal from 2 up counts, clamped to :data:`MAX_SACK_EVERY`; anything else (a sign,
    letters, 0 or 1, two different values) is treated as no attribute at all: a standard peer."""
    values = {m.group(1) for m in _LINE.finditer(sdp)}
    if len(values) != 1:
        return None
    (value,) = values
    if not _VALUE.match(value) or int(value) < STANDARD_SACK_EVERY:
        return None
    return min(int(value), MAX_SACK_EVERY)


def agreed(local_sdp: str, remote_sdp: str) -> int:
    """Packets per SACK that an association between these two descriptions uses (2: the standard)."""
    mine, theirs = advertised(local_sdp), advertised(remote_sdp)
    if mine is None or theirs is None:
        return STANDARD_SACK_EVERY
    return min(mine, theirs)


def apply(transport: Any, local_sdp: str, remote_sdp: str) -> int:
    """Set ``transport`` (an ``RTCSctpTransport``) to what the two descriptions agree; returns N.

    Safe at any moment of the association (it changes only when SACKs go and which chunks carry the
    I bit); a no-op on a stock transport or None."""
    n = agreed(local_sdp, remote_sdp)
    if transport is not None and hasattr(transport, "_lah_sack_every"):
        transport._lah_sack_every = n
        transport._lah_mark_waits = n > STANDARD_SACK_EVERY
    return n


def sack_every(transport: Any) -> int:
    """The SACK frequency a transport's receiver runs (2 on a stock or unagreed one)."""
    return int(getattr(transport, "_lah_sack_every", STANDARD_SACK_EVERY))
