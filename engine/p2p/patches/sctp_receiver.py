"""SCTP receiver patches: delayed SACK, reassembly without rescans, in-order fast path, and a receive
window that holds against a peer that ignores it.

What each does and why it is safe: the package docstring (items 1-3). The stock functions they wrap are
kept as ``_stock_*``; tests use the registry's originals as the oracle.

The window (``_receive_data_chunk``, :func:`_admit`): stock aiortc buffers every DATA chunk it is sent,
whatever it advertised, and reports every gap in its SACK, so a peer that ignores the window (chunks
that never complete a message) grows the victim's reassembly without bound and at 65,536 gaps breaks
the SACK's 16-bit count (``struct.error``), which ended the link. Here, as RFC 9260 section 6.2 says, a
new chunk beyond the highest TSN received is dropped while the window is full (no bytes left, or
:data:`MAX_FRAGMENTS` fragments buffered: a 1-byte fragment costs a few hundred bytes of Python); a chunk
more than :data:`TSN_HORIZON` TSNs past the cumulative ack is dropped always (it bounds the gaps, and so
the SACK's and ``_mark_received``'s work); a SACK reports the lowest gap blocks and duplicates that fit
one packet (:func:`sack_blocks`). A peer that has :data:`ABUSE_LIMIT` chunks dropped in a row, with no
chunk accepted between, is not a sender whose data was in flight when the window closed: the link is
closed with :class:`~engine.p2p.errors.ProtocolError` (:mod:`.sctp_guard` closes it and logs why).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from aiortc import rtcsctptransport as sctp
from aiortc.utils import uint32_gt as _uint32_gt

from ..errors import ProtocolError
from .ack_frequency import I_BIT as _I_BIT  # the sender waits for this SACK
from .ack_frequency import STANDARD_SACK_EVERY
from .sctp_guard import MalformedPacket
from .sctp_guard import parse_packet as _parse_packet

# Longest a SACK waits for a second DATA packet (RFC 9260 section 6.2: < 500 ms, 200 ms advised).
SACK_DELAY = 0.02

# The receive window's bounds (module docstring). An honest sender at our 4 MiB window has about 3,600
# full-sized chunks in flight; what it sends past these bounds is dropped and sent again, never lost.
TSN_HORIZON = 8192  # DATA further than this past the cumulative ack is dropped
MAX_FRAGMENTS = 16384  # fragments held for reassembly, all streams together
ABUSE_LIMIT = 4096  # chunks dropped in a row (none accepted between): the peer ignores the window
# Gap blocks and duplicate TSNs that fit one SACK in one packet: (1189 - 12 - 16) / 4.
MAX_SACK_ENTRIES = (sctp.SCTP_MAX_PACKET_LENGTH - sctp.SCTP_COMMON_HEADER_LENGTH - 16) // 4

_StockInboundStream: Any = sctp.InboundStream
_stock_add_chunk: Callable[[Any, Any], None] = _StockInboundStream.add_chunk
_stock_pop_messages: Callable[[Any], Iterator[tuple[int, int, bytes]]] = _StockInboundStream.pop_messages
_LAST = sctp.SCTP_DATA_LAST_FRAG
_MOD = sctp.SCTP_TSN_MODULO
_Transport: Any = sctp.RTCSctpTransport
_ESTABLISHED = sctp.RTCSctpTransport.State.ESTABLISHED
_CLOSED = sctp.RTCSctpTransport.State.CLOSED


class FastInboundStream(_StockInboundStream):  # type: ignore[misc]
    """InboundStream that skips the reassembly scan when the new fragment cannot finish a message.

    Same data (``reassembly``, ``sequence_number``) and same results as the stock class; only the
    scan after an appended non-LAST fragment is skipped, and only once every earlier scan ran to
    its end (so nothing deliverable can be waiting).
    """

    def __init__(self) -> None:
        super().__init__()
        self._quiet = False  # the last add_chunk cannot have made a message deliverable
        self._settled = True  # the last pop_messages ran to completion

    def add_chunk(self, chunk: Any) -> None:
        r = self.reassembly
        if not r or _uint32_gt(chunk.tsn, r[-1].tsn):
            r.append(chunk)
            self._quiet = self._settled and not (chunk.flags & _LAST)
            return
        self._quiet = False
        _stock_add_chunk(self, chunk)

    def pop_messages(self) -> Iterator[tuple[int, int, bytes]]:
        if self._quiet:
            self._quiet = False
            return iter(())
        return self._scan()

    def _scan(self) -> Iterator[tuple[int, int, bytes]]:
        self._settled = False
        yield from _stock_pop_messages(self)
        self._settled = True


# --- delayed SACK ------------------------------------------------------------------------------

_stock_forward_tsn: Callable[[Any, Any], Any] = _Transport._receive_forward_tsn_chunk


def init_receiver(self: Any) -> None:
    """Receiver state on a new transport (called by the sender's ``__init__`` replacement)."""
    self._sack_packets = 0  # packets needing a SACK since the last one
    self._lah_sack_every = STANDARD_SACK_EVERY  # packets per SACK, unless the peers agreed more
    # The delayed SACK's timer is lazy, like T3's (sctp_timers): one handle, armed when a SACK first
    # waits and left armed when the SACK goes early; at expiry it re-arms for the SACK that waits then,
    # if any. A cancel and a new timer for every second packet cost more than the rest of its SACK.
    self._sack_timer = None  # asyncio.TimerHandle, or None when none is armed
    self._sack_due_at = None  # loop time by which the waiting SACK must go; None: none waits
    self._sack_urgent = False  # a FORWARD TSN, or a DATA chunk with the I bit, arrived
    self._sack_reported_gaps = False  # the last SACK sent reported gaps
    self._lah_highest_tsn = None  # the highest TSN accepted past the cumulative ack (stale: use that)
    self._lah_fragment_room = MAX_FRAGMENTS  # fragments that may still be buffered (the C path counts too)
    self._lah_drops_in_row = 0  # DATA chunks dropped past the window since one was accepted
    self._lah_window_drops = 0  # all such drops
    self._lah_malformed = 0  # packets dropped as malformed (sctp_guard)


def sack_blocks(
    last: int, misordered: set[int], duplicates: list[int]
) -> tuple[list[tuple[int, int]], list[int]]:
    """A SACK's gap blocks (offsets from the cumulative TSN ``last``) and duplicate TSNs, the lowest
    blocks first and as many of both as fit one packet (:data:`MAX_SACK_ENTRIES`). Stock aiortc reports
    them all, past a packet and past the count's 16 bits."""
    tsns = sorted(misordered)
    cut = bisect.bisect_right(tsns, last)  # TSNs past the wrap sort below last: they come after
    if cut:
        tsns = tsns[cut:] + tsns[:cut]
    gaps: list[tuple[int, int]] = []
    start = end = -1
    for tsn in tsns:
        pos = (tsn - last) % _MOD
        if pos == end + 1:
            end = pos
            continue
        if start >= 0:
            gaps.append((start, end))
            if len(gaps) == MAX_SACK_ENTRIES:
                break
        if pos > 0xFFFF:  # an offset a block cannot carry (beyond any horizon we accept)
            start = -1
            break
        start = end = pos
    if start >= 0 and len(gaps) < MAX_SACK_ENTRIES:
        gaps.append((start, end))
    return gaps, duplicates[: MAX_SACK_ENTRIES - len(gaps)]


async def _send_sack_now(self: Any) -> None:
    """Stock ``_send_sack``'s SACK, bounded to one packet (:func:`sack_blocks`)."""
    self._sack_due_at = None  # an armed timer finds nothing waiting
    self._sack_packets = 0
    self._sack_urgent = False
    self._sack_reported_gaps = bool(self._sack_misordered)
    sack = _SackChunk()
    sack.cumulative_tsn = self._last_received_tsn
    sack.advertised_rwnd = max(0, self._advertised_rwnd)
    sack.gaps, sack.duplicates = sack_blocks(
        self._last_received_tsn, self._sack_misordered, self._sack_duplicates
    )
    await self._send_chunk(sack)
    self._sack_duplicates.clear()
    self._sack_needed = False


async def _send_sack(self: Any) -> None:
    """Called by ``_handle_data`` once per packet that needs a SACK: send it now or arm the timer."""
    self._sack_packets += 1
    if (
        self._sack_packets >= self._lah_sack_every
        or self._sack_misordered
        or self._sack_duplicates
        or self._sack_reported_gaps
        or self._sack_urgent
        or self._association_state is not _ESTABLISHED
    ):
        await _send_sack_now(self)
    else:
        arm_sack_timer(self)


def arm_sack_timer(self: Any) -> None:
    """A SACK waits: it must go by ``SACK_DELAY`` after its first packet (the lazy timer, above)."""
    if self._sack_due_at is None:
        self._sack_due_at = self._loop.time() + SACK_DELAY
    if self._sack_timer is None:
        self._sack_timer = self._loop.call_at(self._sack_due_at, _sack_timer_expired, self)


async def after_taken_chunk(self: Any, code: int) -> None:
    """What ``_send_sack`` does after a DATA chunk the compiled receiver took (``open_receive``, which
    already counted the packet): 1, the SACK is due now; 2, it waits, so the timer must be armed."""
    if code == 1:
        await _send_sack_now(self)
    elif code == 2:
        arm_sack_timer(self)


_flushes: set[asyncio.Future[None]] = set()


def _sack_timer_expired(self: Any) -> None:
    self._sack_timer = None
    due = self._sack_due_at
    if due is None or self._association_state is _CLOSED:
        return
    if due - self._loop.time() > 0.001:  # armed for a SACK that went early; another waits now
        self._sack_timer = self._loop.call_at(due, _sack_timer_expired, self)
        return
    if self._sack_needed:
        task = asyncio.ensure_future(_flush_sack(self))
        _flushes.add(task)
        task.add_done_callback(_flushes.discard)
    else:
        self._sack_due_at = None


async def _flush_sack(self: Any) -> None:
    if self._sack_needed and self._association_state is not _CLOSED:
        with contextlib.suppress(ConnectionError):
            await _send_sack_now(self)


async def _receive_forward_tsn_chunk(self: Any, chunk: Any) -> None:
    self._sack_urgent = True
    await _stock_forward_tsn(self, chunk)
    _count_fragments(self)  # it pruned abandoned fragments from any stream


# --- receive / SACK-processing fast paths ------------------------------------------------------

_stock_handle_data: Callable[[Any, bytes], Any] = _Transport._handle_data
_DataChunk = sctp.DataChunk
_SackChunk = sctp.SackChunk
_InitChunk = sctp.InitChunk
_sctp_logger = logging.getLogger("aiortc.rtcsctptransport")


async def _handle_data(self: Any, data: bytes) -> None:
    """Stock ``_handle_data`` with DATA and SACK chunks dispatched directly (stock goes through
    ``_receive_chunk``'s isinstance chain, one more coroutine per chunk, and builds a list per packet to
    look for INIT). A packet with an INIT, a verification tag that is not ours, or aiortc's debug log on
    takes the stock path unchanged."""
    try:
        _, _, verification_tag, chunks = _parse_packet(data)
    except MalformedPacket:
        self._lah_malformed += 1
        return
    except ValueError:  # a bad checksum
        return
    if verification_tag != self._local_verification_tag or _sctp_logger.isEnabledFor(logging.DEBUG):
        await _stock_handle_data(self, data)
        return
    for chunk in chunks:
        if type(chunk) is _InitChunk:
            await _stock_handle_data(self, data)
            return
    for chunk in chunks:
        kind = type(chunk)
        if kind is _DataChunk:
            await self._receive_data_chunk(chunk)
        elif kind is _SackChunk:
            await self._receive_sack_chunk(chunk)
        else:
            await self._receive_chunk(chunk)
    if self._sack_needed:
        await self._send_sack()


_new = object.__new__


async def receive_one_chunk(self: Any, fields: tuple[Any, ...]) -> None:
    """``_handle_data`` for a packet the compiled record layer already parsed: our verification tag, a
    right CRC32c and one chunk, given as its fields (engine/p2p/native): six for a DATA chunk, four for
    a SACK. What follows the parse is ``_handle_data``'s own path for such a packet."""
    if len(fields) == 6:
        chunk = _new(_DataChunk)
        chunk.flags, chunk.tsn, chunk.stream_id, chunk.stream_seq, chunk.protocol, chunk.user_data = fields
        await self._receive_data_chunk(chunk)
    else:
        sack = _new(_SackChunk)
        sack.flags = 0
        sack.cumulative_tsn, sack.advertised_rwnd, sack.gaps, sack.duplicates = fields
        await self._receive_sack_chunk(sack)
    if self._sack_needed:
        await self._send_sack()


_stock_receive_data_chunk: Callable[[Any, Any], Any] = _Transport._receive_data_chunk


async def _receive_data_chunk(self: Any, chunk: Any) -> None:
    """Stock ``_receive_data_chunk`` without awaiting ``_reset_deferred_streams`` when no stream reset
    waits (``_reconfig_deferred`` is None): that coroutine then does nothing, but costs a coroutine per
    DATA chunk. A deferred reset runs the stock code. A chunk with RFC 7053's I bit is SACKed at once
    (``ack_frequency``), whoever sent it."""
    if chunk.flags & _I_BIT:
        self._sack_urgent = True
    if not _admit(self, chunk.tsn):
        return
    streams = self._inbound_streams
    before = streams.get(chunk.stream_id)
    held = 0 if before is None else len(before.reassembly)
    if self._reconfig_deferred is not None:
        await _stock_receive_data_chunk(self, chunk)
    else:
        self._sack_needed = True
        if self._mark_received(chunk.tsn):
            return
        inbound_stream = self._get_inbound_stream(chunk.stream_id)
        inbound_stream.add_chunk(chunk)
        self._advertised_rwnd -= len(chunk.user_data)
        for message in inbound_stream.pop_messages():
            self._advertised_rwnd += len(message[2])
            await self._receive(*message)
        if self._reconfig_deferred is not None:  # set while a message was delivered
            await self._reset_deferred_streams()
    after = streams.get(chunk.stream_id)
    self._lah_fragment_room -= (0 if after is None else len(after.reassembly)) - held


def _count_fragments(self: Any) -> int:
    """The fragment room counted afresh (after FORWARD TSN's pruning, or a stream reset's removal)."""
    room = MAX_FRAGMENTS - sum(len(s.reassembly) for s in self._inbound_streams.values())
    self._lah_fragment_room = room
    return room


def _admit(self: Any, tsn: int) -> bool:
    """Whether a DATA chunk may be received (module docstring: the window). A duplicate is admitted:
    ``_mark_received`` reports it. Raises :class:`ProtocolError` for a peer that ignores the window."""
    last = self._last_received_tsn
    if last is None:
        return True
    ahead = (tsn - last) % _MOD
    if ahead == 0 or ahead >= 1 << 31 or tsn in self._sack_misordered:
        return True
    highest = self._lah_highest_tsn
    top = 0 if highest is None else (highest - last) % _MOD
    if top >= 1 << 31:  # stale: the cumulative ack passed it
        top = 0
    if ahead <= top:  # fills a gap below what we hold: always room for it (RFC 9260 section 6.2)
        self._lah_drops_in_row = 0
        return True
    if (
        ahead <= TSN_HORIZON
        and self._advertised_rwnd > 0
        and (self._lah_fragment_room > 0 or _count_fragments(self) > 0)
    ):
        self._lah_highest_tsn = tsn
        self._lah_drops_in_row = 0
        return True
    self._lah_window_drops += 1
    self._lah_drops_in_row += 1
    if self._lah_drops_in_row >= ABUSE_LIMIT:
        raise ProtocolError(
            f"the peer ignores the receive window: {self._lah_drops_in_row} DATA chunks in a row past it"
        )
    if ahead <= TSN_HORIZON:
        self._sack_needed = True  # its SACK tells an honest sender the window is shut
    return False


_stock_mark_received: Callable[[Any, int], bool] = _Transport._mark_received


def _mark_received(self: Any, tsn: int) -> bool:
    last = self._last_received_tsn
    if (
        last is not None
        and tsn == (last + 1) % _MOD
        and not self._sack_misordered
        and not self._sack_duplicates
    ):
        self._last_received_tsn = tsn
        return False
    return _stock_mark_received(self, tsn)
