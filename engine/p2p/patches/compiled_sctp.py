"""SCTP packets on a link whose records are compiled (engine/p2p/native): sent and received without
aiortc's packet path, the DTLS transport's Python or a task per datagram where the C layer can do it.

Below this module, :mod:`.dtls` owns the records (the fast path over OpenSSL, the hand-over to the compiled
layer, the reader ``recv_next``); it calls up into here once a link's records are compiled. Sending:
``send_chunk`` (aiortc's ``_send_chunk``: one chunk, packet, record and ``sendto`` in one C call) and
``data_chunk_sender`` (a whole burst of DATA chunks in one call). Receiving: ``open_receive`` answers
what :func:`deliver_opened` hands to SCTP; ``compiled_burst`` is the reader's pass over queued records,
and ``inline_receiver`` the UDP callback's first look at a datagram while the reader waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiortc import rtcdtlstransport as dtls
from aiortc import rtcsctptransport as sctp

from .sctp_receiver import after_taken_chunk as _after_taken_chunk
from .sctp_receiver import receive_one_chunk as _receive_one_chunk

_CONNECTED = dtls.State.CONNECTED
_DataChunk = sctp.DataChunk
_stock_send_chunk: Callable[[Any, Any], Any] = sctp.RTCSctpTransport._send_chunk
_sctp_logger = logging.getLogger("aiortc.rtcsctptransport")


# --- counters ------------------------------------------------------------------------------------


def sent(transport: Any, f: Any, pair: Any, send: Any, args: tuple[Any, ...], size: int) -> None:
    """One compiled ``send(*args)`` on the direct pair, counted as ``size`` bytes of record payload.

    An OSError is reported, not raised, as the UDP transport would (the packet is lost and SCTP's
    recovery resends it); a record handed back because the socket's buffer was full is queued on the
    transport."""
    try:
        left = send(*args)
    except OSError:
        left = None
    if left is not None:
        pair.protocol.transport.sendto(left, pair.remote_addr)
    count(transport, f, size)


def count(transport: Any, f: Any, size: int) -> None:
    transport._RTCDtlsTransport__tx_bytes += size + f.overhead
    transport._RTCDtlsTransport__tx_packets += 1


# --- receiving -----------------------------------------------------------------------------------


def open_record(rl: Any, data: bytes, sctp_transport: Any) -> Any:
    """The record opened; with SCTP's packet parsed too where the receiver takes it that way (the
    association is ours and aiortc's debug log, which prints every chunk, is off), and an in-order
    DATA chunk taken in C altogether (``open_receive``: an int comes back)."""
    if sctp_transport is None or _sctp_logger.isEnabledFor(logging.DEBUG):
        return rl.open(data)
    return rl.open_receive(data, sctp_transport)


async def deliver_opened(sctp_transport: Any, opened: Any) -> None:
    """What the compiled layer opened (``open_record``), to SCTP: an int is an in-order DATA chunk it
    already took (``open_receive``), with what its SACK needs; a tuple one DATA or SACK chunk it parsed; bytes
    a packet for aiortc's parser; an exception what opening raised in the UDP callback."""
    kind = type(opened)
    if kind is int:
        await _after_taken_chunk(sctp_transport, opened)
    elif kind is tuple:
        await _receive_one_chunk(sctp_transport, opened)
    elif isinstance(opened, BaseException):
        raise opened
    elif sctp_transport is not None:
        await sctp_transport._handle_data(opened)


BURST_DONE = ("done",)
OPENED = object()  # a queue item (OPENED, what open_receive answered): opened inline, for the reader


def inline_receiver(self: Any, f: Any) -> Callable[[bytes], bool]:
    """The UDP callback's first look at a DTLS datagram of a compiled link (``ice.datagram_received``).

    When the DTLS reader waits on an empty queue, nothing received before this datagram is still to be
    handled, so it may be opened right here: an in-order DATA chunk the compiled receiver takes with
    nothing due (most packets) then costs no queue, no task wake-up and no pass of ``recv_next``. Any
    other outcome that needs the reader (a SACK to send, a message to deliver, a SACK received, a
    packet for aiortc's parser) is queued already opened, in order. Declines (False: queue the datagram
    as ever) while the reader is busy or has datagrams queued, for OpenSSL's records, and when aiortc's
    debug log is on."""
    queue = f.conn._queue
    items, waiters = queue._items, queue._waiters
    open_receive = f.native.open_receive

    def inline(data: bytes) -> bool:
        if items or not waiters or f.ssl is not self._ssl or _sctp_logger.isEnabledFor(logging.DEBUG):
            return False
        receiver = self._data_receiver
        try:
            opened = None if receiver is None else open_receive(data, receiver)
        except Exception as e:  # the reader raises it, as if it had opened the record itself
            opened = e
        if opened is None:
            return False  # not this layer's record (OpenSSL's): untouched, queued as it came
        self._RTCDtlsTransport__rx_bytes += len(data)
        self._RTCDtlsTransport__rx_packets += 1
        if opened:  # b"" (dropped) and 0 (taken, nothing due) need nothing more
            queue.put_nowait((OPENED, opened))
        return True

    return inline


async def compiled_burst(self: Any, f: Any, q: Any, result: Any) -> Any:
    """``recv_next``'s loop for a burst of records the compiled layer opens, with the transport's
    counters added once per burst. Returns :data:`BURST_DONE` when the queue is empty, else the first
    datagram that is not one of those (not DTLS, OpenSSL's record, the end of the connection) for the
    general loop to take from there."""
    receiver = self._data_receiver
    if _sctp_logger.isEnabledFor(logging.DEBUG):
        return result  # rl.open(), with aiortc's parser logging every chunk: the general loop
    open_receive = f.native.open_receive
    conn = f.conn
    size = packets = 0
    try:
        while result is not None:
            data = result[0]
            if data is OPENED:  # opened in the UDP callback (inline_receiver), counted there
                await deliver_opened(receiver, result[1])
                if not q.qsize() or not conn._nominated:
                    return BURST_DONE
                result = q.get_nowait()
                continue
            if not 19 < data[0] < 64 or f.ssl is not self._ssl:
                return result
            opened = open_receive(data, receiver)
            if opened is None:  # not application data of this epoch: OpenSSL's
                return result
            size += len(data)
            packets += 1
            if opened:  # b"": a replay or a forgery, dropped (counted there); 0: a chunk taken, nothing due
                await deliver_opened(receiver, opened)
            if not q.qsize() or not conn._nominated:
                return BURST_DONE
            result = q.get_nowait()
        return result
    finally:
        self._RTCDtlsTransport__rx_bytes += size
        self._RTCDtlsTransport__rx_packets += packets


# --- sending -------------------------------------------------------------------------------------


def _compiled_pair(sctp_transport: Any) -> tuple[Any, Any, Any] | None:
    """(DTLS transport, its fast state, the nominated pair) where an SCTP packet can go straight to the
    compiled layer's socket; None where it goes through ``send_data`` (no compiled layer, a relayed
    pair, not connected, the pair changed since the layer took over) or aiortc's debug log is on (stock
    logs every chunk)."""
    transport = sctp_transport._RTCSctpTransport__transport
    f = transport.__dict__.get("_lah_fast")
    if f is None or f.native is None or not f.direct or transport._state is not _CONNECTED:
        return None
    pair = f.conn._nominated.get(1)
    if pair is not f.pair or _sctp_logger.isEnabledFor(logging.DEBUG):
        return None
    return transport, f, pair


async def send_chunk(self: Any, chunk: Any) -> None:
    """``RTCSctpTransport._send_chunk``: packet, record and ``sendto`` in one C call on a compiled link."""
    compiled = _compiled_pair(self)
    if compiled is None:
        await _stock_send_chunk(self, chunk)
        return
    transport, f, pair = compiled
    rl = f.native
    ports = (self._local_port, self._remote_port, self._remote_verification_tag)
    if type(chunk) is _DataChunk:
        data = chunk.user_data
        fields = (chunk.flags, chunk.tsn, chunk.stream_id, chunk.stream_seq, chunk.protocol, data)
        sent(transport, f, pair, rl.send_data_chunk, (*ports, *fields), 28 + len(data) + (-len(data) & 3))
    else:
        body = bytes(chunk)
        sent(transport, f, pair, rl.send_packet, (*ports, body), 12 + len(body))


def data_chunk_sender(sctp_transport: Any) -> Callable[[list[Any]], None] | None:
    """Where ``send_chunk`` would take the compiled path for every chunk: a function that sends a whole
    burst of DATA chunks in one C call (``send_data_chunks``: built, sealed, one ``sendmmsg``) and counts
    them as ``send_chunk`` does; else None, and the sender sends chunk by chunk. Made once per
    ``_transmit``: it holds the link's pair, so a pair that changes takes effect at the next burst."""
    compiled = _compiled_pair(sctp_transport)
    if compiled is None:
        return None
    transport, f, pair = compiled
    t = sctp_transport
    src, dst, vtag = t._local_port, t._remote_port, t._remote_verification_tag
    send = f.native.send_data_chunks

    def send_burst(chunks: list[Any]) -> None:
        packets, packet_bytes, unsent = send(src, dst, vtag, chunks)
        if unsent:  # the socket's buffer was full: the transport queues the rest, in order
            for record in unsent:
                pair.protocol.transport.sendto(record, pair.remote_addr)
        transport._RTCDtlsTransport__tx_bytes += packet_bytes + packets * f.overhead
        transport._RTCDtlsTransport__tx_packets += packets

    return send_burst
