"""The SCTP/ICE speed patches themselves; installed only by :func:`aiortc_patches.apply`.

See the docstring of ``engine/p2p/aiortc_patches.py`` for what each patch does and why it is safe.
Every original we replace or wrap is kept here (``ORIGINALS``) so tests can use it as an oracle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import aioice.ice
from aiortc import rtcsctptransport as sctp
from aiortc.utils import uint32_gt as _uint32_gt
from aiortc.utils import uint32_gte as _uint32_gte

# Longest a SACK waits for a second DATA packet (RFC 9260 section 6.2: < 500 ms, 200 ms advised).
SACK_DELAY = 0.02

# Everything replaced or wrapped, by dotted name; the test hashes their source.
ORIGINALS: dict[str, Any] = {
    "aiortc.rtcsctptransport.InboundStream": sctp.InboundStream,
    "aiortc.rtcsctptransport.RTCSctpTransport.__init__": sctp.RTCSctpTransport.__init__,
    "aiortc.rtcsctptransport.RTCSctpTransport._send_sack": sctp.RTCSctpTransport._send_sack,
    "aiortc.rtcsctptransport.RTCSctpTransport._handle_data": sctp.RTCSctpTransport._handle_data,
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_forward_tsn_chunk": (
        sctp.RTCSctpTransport._receive_forward_tsn_chunk
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._mark_received": (sctp.RTCSctpTransport._mark_received),
    "aiortc.rtcsctptransport.RTCSctpTransport._update_advanced_peer_ack_point": (
        sctp.RTCSctpTransport._update_advanced_peer_ack_point
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_sack_chunk": (
        sctp.RTCSctpTransport._receive_sack_chunk
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._transmit": sctp.RTCSctpTransport._transmit,
    "aiortc.rtcsctptransport.RTCSctpTransport._t3_expired": sctp.RTCSctpTransport._t3_expired,
    # Not replaced, but the retransmit flag relies on these being the only ones that set
    # ``_retransmit`` (to False only) or touch the sent queue's order.
    "aiortc.rtcsctptransport.RTCSctpTransport._maybe_abandon": sctp.RTCSctpTransport._maybe_abandon,
    "aiortc.rtcsctptransport.RTCSctpTransport._send": sctp.RTCSctpTransport._send,
    # Not replaced, but the delayed SACK relies on how they call _send_sack / set _sack_needed.
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_data_chunk": (
        sctp.RTCSctpTransport._receive_data_chunk
    ),
    "aioice.ice.StunProtocol.datagram_received": aioice.ice.StunProtocol.datagram_received,
}

# sha256 of inspect.getsource() of each entry in ORIGINALS, for aiortc 1.16.0 / aioice 0.13.0.
ORIGINAL_SOURCE_SHA256: dict[str, str] = {
    "aiortc.rtcsctptransport.InboundStream": (
        "b63993b481ece97b042cf3528677eba90aca6bdeb240193b4646b57be6ed737f"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport.__init__": (
        "294b0e510843850977697fc56059d70ae4f55e28ed88f1d66046e69e648d2c31"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._send_sack": (
        "ac92513522fa60e7f298fd0e5849dd8b9aa9ac969cf840aa653f96c2de690d43"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._handle_data": (
        "8661b724e20776bbf9af6f68a828cfb952d2deb617d7a9e0f143d641bdae95e2"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_forward_tsn_chunk": (
        "a7b72a09e9c4bb20d2d25dca2563bdeccfb7cb2c35c73009e4a589772c7b7d41"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._mark_received": (
        "2ac68b6a3934ca87cf9d9383d4dd764a8fbef83c9d06f9a0435bedde7df46499"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._update_advanced_peer_ack_point": (
        "b10416e34e18a3db286aed5bf4ad6db08a364031250c77ab970f5af97b497ff2"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_sack_chunk": (
        "4b35ccf1372cdec8705f378a04de43d9c4ad5675afae09781eddd69ecdb473b1"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._transmit": (
        "aa8941d5f8f020e8b4e438e02084533dd78399da498638a013025252e5fe8115"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._t3_expired": (
        "0e759bf4b1b2d8c8afa3d656a8f34839c974d0104cb66f895a9a9d266f6499af"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._maybe_abandon": (
        "879fcf244b3dfd054834f91f8ca821d015f125faec1a036e97921ff52a422d40"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._send": (
        "f0f8aff63a9a87439230618a25e4e7db919f5001459f06281b4c08724ec395a6"
    ),
    "aiortc.rtcsctptransport.RTCSctpTransport._receive_data_chunk": (
        "790c2bb8cd0f5dd735cb051ac669ccc5749a25965fb19a6aeb740fc861563048"
    ),
    "aioice.ice.StunProtocol.datagram_received": (
        "ff4c8b910d45fb3a9e50c4391fe5cbaba33dcba669fea9e847e19a5c99b9bfbb"
    ),
}

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

_stock_init: Callable[..., None] = _Transport.__init__
_stock_send_sack: Callable[[Any], Any] = _Transport._send_sack
_stock_forward_tsn: Callable[[Any, Any], Any] = _Transport._receive_forward_tsn_chunk


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _stock_init(self, *args, **kwargs)
    self._sack_packets = 0  # packets needing a SACK since the last one
    self._sack_timer = None  # asyncio.TimerHandle of the delayed SACK
    self._sack_urgent = False  # a FORWARD TSN arrived
    self._sack_reported_gaps = False  # the last SACK sent reported gaps
    self._rtx_pending = False  # some chunk in _sent_queue may have _retransmit set


async def _send_sack_now(self: Any) -> None:
    if self._sack_timer is not None:
        self._sack_timer.cancel()
        self._sack_timer = None
    self._sack_packets = 0
    self._sack_urgent = False
    self._sack_reported_gaps = bool(self._sack_misordered)
    await _stock_send_sack(self)


async def _send_sack(self: Any) -> None:
    """Called by ``_handle_data`` once per packet that needs a SACK: send it now or arm the timer."""
    self._sack_packets += 1
    if (
        self._sack_packets >= 2
        or self._sack_misordered
        or self._sack_duplicates
        or self._sack_reported_gaps
        or self._sack_urgent
        or self._association_state is not _ESTABLISHED
    ):
        await _send_sack_now(self)
    elif self._sack_timer is None:
        self._sack_timer = self._loop.call_later(SACK_DELAY, _sack_timer_expired, self)


_flushes: set[asyncio.Future[None]] = set()


def _sack_timer_expired(self: Any) -> None:
    self._sack_timer = None
    if self._sack_needed and self._association_state is not _CLOSED:
        task = asyncio.ensure_future(_flush_sack(self))
        _flushes.add(task)
        task.add_done_callback(_flushes.discard)


async def _flush_sack(self: Any) -> None:
    if self._sack_needed and self._association_state is not _CLOSED:
        with contextlib.suppress(ConnectionError):
            await _send_sack_now(self)


async def _receive_forward_tsn_chunk(self: Any, chunk: Any) -> None:
    self._sack_urgent = True
    await _stock_forward_tsn(self, chunk)


# --- receive / SACK-processing fast paths ------------------------------------------------------

_stock_mark_received: Callable[[Any, int], bool] = _Transport._mark_received
_stock_update_apap: Callable[[Any], None] = _Transport._update_advanced_peer_ack_point


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


def _update_advanced_peer_ack_point(self: Any) -> None:
    if (
        self._forward_tsn_streams
        or (self._outbound_queue and self._outbound_queue[0]._abandoned)
        or (self._sent_queue and self._sent_queue[0]._abandoned)
    ):
        _stock_update_apap(self)
        return
    if _uint32_gt(self._last_sacked_tsn, self._advanced_peer_ack_tsn):
        self._advanced_peer_ack_tsn = self._last_sacked_tsn
    elif _uint32_gt(self._advanced_peer_ack_tsn, self._last_sacked_tsn):
        _stock_update_apap(self)  # a FORWARD TSN is still owed to the peer


# --- sender: SACK processing and transmit without whole-queue scans ---------------------------
#
# Invariant: a chunk in _sent_queue has _retransmit set only if self._rtx_pending is True. Only the
# gap strike in _receive_sack_chunk and _t3_expired set _retransmit (both below raise the flag
# first); _maybe_abandon and _transmit only clear it. _transmit lowers the flag before its scan
# and raises it again if the scan stops early, so a chunk marked during an await is never lost.

_stock_receive_sack: Callable[[Any, Any], Any] = _Transport._receive_sack_chunk
_stock_t3_expired: Callable[[Any], None] = _Transport._t3_expired
_MAX = sctp.USERDATA_MAX_LENGTH


def _t3_expired(self: Any) -> None:
    self._rtx_pending = True
    _stock_t3_expired(self)


async def _receive_sack_chunk(self: Any, chunk: Any) -> None:
    """Stock ``_receive_sack_chunk`` with the gap-block loops indexed instead of scanned.

    The sent queue holds consecutive TSNs, so once the cumulatively acked chunks are popped the chunk
    for gap offset ``p`` sits at index ``p - head`` (head = first queued TSN - cumulative TSN): the
    ack loop visits only the gap blocks and the strike loop only the holes before the highest newly
    acked TSN, in the stock order. No gaps, unsorted or overlapping gap blocks, or a queue whose TSNs
    are not consecutive run the stock code.
    """
    gaps = chunk.gaps
    if not gaps:
        await _stock_receive_sack(self, chunk)
        return
    self._rtx_pending = True  # the strike below may mark chunks
    cum = chunk.cumulative_tsn
    q = self._sent_queue
    prev = 0
    for start, end in gaps:
        if not prev < start <= end:
            break
        prev = end
    else:
        prev = -1
    if (
        prev != -1
        or _uint32_gt(self._last_sacked_tsn, cum)
        or not q
        or (q[-1].tsn - q[0].tsn) % _MOD != len(q) - 1
    ):
        await _stock_receive_sack(self, chunk)
        return

    received_time = time.time()
    self._last_sacked_tsn = cum
    cwnd_fully_utilized = self._flight_size >= self._cwnd
    done = 0
    done_bytes = 0
    decrease = self._flight_size_decrease

    # handle acknowledged data (stock loop)
    while q and _uint32_gte(cum, q[0].tsn):
        schunk = q.popleft()
        done += 1
        if not schunk._acked:
            done_bytes += schunk._book_size
        decrease(schunk)
        if done == 1 and schunk._sent_count == 1:
            self._update_rto(received_time - schunk._sent_time)

    # handle gap blocks: chunk with TSN cum + p is at index p - head
    loss = False
    head = (q[0].tsn - cum) % _MOD if q else 1
    n = len(q)
    htna_index = -1  # index of the highest newly acked TSN (HTNA)
    for start, end in gaps:
        a, b = start - head, min(end - head, n - 1)
        if a < 0:
            a = 0
        if a > b:
            continue
        for i, schunk in enumerate(itertools.islice(q, a, b + 1), a):
            if not schunk._acked:
                done_bytes += schunk._book_size
                schunk._acked = True
                htna_index = i
            decrease(schunk)

    # strike missing chunks prior to HTNA: the holes between gap blocks, in queue order
    if htna_index >= 0:
        lo = 0
        for start, end in gaps:
            hole_end = min(start - head - 1, htna_index)
            if lo <= hole_end:
                for schunk in list(itertools.islice(q, lo, hole_end + 1)):
                    schunk._misses += 1
                    if schunk._misses == 3:
                        schunk._misses = 0
                        if not self._maybe_abandon(schunk):
                            schunk._retransmit = True
                        schunk._acked = False
                        decrease(schunk)
                        loss = True
            lo = max(0, end - head + 1)
            if lo > htna_index:
                break

    # adjust congestion window (stock)
    if self._fast_recovery_exit is None:
        if done and cwnd_fully_utilized:
            if self._cwnd <= self._ssthresh:
                self._cwnd += min(done_bytes, _MAX)
            else:
                self._partial_bytes_acked += done_bytes
                if self._partial_bytes_acked >= self._cwnd:
                    self._partial_bytes_acked -= self._cwnd
                    self._cwnd += _MAX
        if loss:
            self._ssthresh = max(self._cwnd // 2, 4 * _MAX)
            self._cwnd = self._ssthresh
            self._partial_bytes_acked = 0
            self._fast_recovery_exit = q[-1].tsn
            self._fast_recovery_transmit = True
    elif _uint32_gte(cum, self._fast_recovery_exit):
        self._fast_recovery_exit = None

    if not q:
        self._t3_cancel()
    elif done:
        self._t3_restart()

    self._update_advanced_peer_ack_point()
    await self._data_channel_flush()
    await self._transmit()


async def _transmit(self: Any) -> None:
    """Stock ``_transmit``, skipping the retransmit scan of the sent queue when nothing is marked."""
    if self._forward_tsn_chunk is not None:
        await self._send_chunk(self._forward_tsn_chunk)
        self._forward_tsn_chunk = None
        if not self._t3_handle:
            self._t3_start()

    burst_size = 2 * _MAX if self._fast_recovery_exit is not None else 4 * _MAX
    cwnd = min(self._flight_size + burst_size, self._cwnd)

    if self._rtx_pending:
        self._rtx_pending = False
        retransmit_earliest = True
        for chunk in self._sent_queue:
            if chunk._retransmit:
                if self._fast_recovery_transmit:
                    self._fast_recovery_transmit = False
                elif self._flight_size >= cwnd:
                    self._rtx_pending = True
                    return
                self._flight_size_increase(chunk)

                chunk._misses = 0
                chunk._retransmit = False
                chunk._sent_count += 1
                await self._send_chunk(chunk)
                if retransmit_earliest:
                    self._t3_restart()
            retransmit_earliest = False

    while self._outbound_queue and self._flight_size < cwnd:
        chunk = self._outbound_queue.popleft()
        self._sent_queue.append(chunk)
        self._flight_size_increase(chunk)
        chunk._sent_count += 1
        chunk._sent_time = time.time()
        await self._send_chunk(chunk)
        if not self._t3_handle:
            self._t3_start()


# --- aioice: RFC 7983 demultiplexing before the STUN parse -------------------------------------

_stock_datagram_received: Callable[[Any, Any, Any], None] = aioice.ice.StunProtocol.datagram_received


def _datagram_received(self: Any, data: Any, addr: Any) -> None:
    if data and 19 < data[0] < 64:  # DTLS record: never a valid STUN message (RFC 7983)
        self.receiver.data_received(data, self.local_candidate.component)
        return
    _stock_datagram_received(self, data, addr)


def install() -> None:
    """Install every patch (callers guarantee once; see ``aiortc_patches.apply``)."""
    sctp.InboundStream = FastInboundStream  # type: ignore[misc]
    _Transport.__init__ = _init
    _Transport._send_sack = _send_sack
    _Transport._receive_forward_tsn_chunk = _receive_forward_tsn_chunk
    _Transport._mark_received = _mark_received
    _Transport._update_advanced_peer_ack_point = _update_advanced_peer_ack_point
    _Transport._receive_sack_chunk = _receive_sack_chunk
    _Transport._transmit = _transmit
    _Transport._t3_expired = _t3_expired
    aioice.ice.StunProtocol.datagram_received = _datagram_received  # type: ignore[method-assign]
