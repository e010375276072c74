"""DTLS records and their datagrams with fewer Python calls per packet (the ``dtls`` patch group).

aiortc moves every data-channel packet through pyOpenSSL's ``bio_write``/``recv``/``send``/``bio_read``
wrappers (a fresh buffer, three helper checks and ``SSL_get_error`` per call) and reads the outgoing
memory BIO after every received record, where an empty BIO makes pyOpenSSL raise ``WantReadError``
(an exception per packet, caught by aiortc). Each datagram then passes through three coroutine layers
of aioice on the way out (``Connection.send`` -> ``sendto`` -> ``StunProtocol.send_data``) and three on
the way in (``RTCIceTransport._recv`` -> ``Connection.recv`` -> ``recvfrom`` -> the queue).

Here, once the handshake is done, the same OpenSSL calls go through the cffi bindings pyOpenSSL itself
uses (``OpenSSL._util.lib``), into one preallocated buffer per transport; an empty outgoing BIO is
recognised by ``BIO_should_retry`` without an exception; a datagram goes straight to the nominated
pair's UDP transport when that pair is a plain ``StunProtocol`` (a TURN pair still goes through its
protocol's ``send_data``); and a received datagram is taken from aioice's queue without the wrappers.
Every error path calls pyOpenSSL's own error handling, so errors are the same exceptions as stock.
The OpenSSL calls, their order and sizes (1500) are stock's, but for reads: after a datagram, OpenSSL is
read until it holds nothing (stock reads once, leaving records that came during the handshake for
later datagrams: :func:`_read_all`). The records and datagrams on the wire are byte for byte the same.
The handshake, SRTP and anything before ``CONNECTED`` stay stock.

Relied upon (hashed in :mod:`.registry`): pyOpenSSL's ``Connection`` attributes ``_ssl``, ``_into_ssl``,
``_from_ssl`` and its ``_raise_ssl_error``/``_handle_bio_errors``; aioice's ``Connection._queue``,
``_nominated`` and ``StunProtocol.send_data``. A hash that differs leaves the whole group stock.

**Compiled records** (:mod:`engine.p2p.native`). Where the compiled record layer loaded and the suite
is AEAD, application-data records leave OpenSSL once the peer has sent its first one (proof that its
side of the handshake is done, so no flight will be retransmitted): the keys are derived from the
session (:mod:`engine.p2p.native.keys`), sequence numbers go on from the highest epoch-1 record this
side sent (every datagram OpenSSL wrote is read for it) and the replay window from the highest one
received. Each record is then sealed and sent, or opened, in one C call. Records that are not
application data of that epoch (an alert, anything odd) still go to OpenSSL, and when OpenSSL wants to
send a close_notify the compiled layer seals it, since OpenSSL's own sequence numbers are stale. What
the SCTP layer above does with a compiled link's packets (bursts sent in one call, an in-order chunk
taken in C, the UDP callback's first look) is :mod:`.compiled_sctp`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import aioice.ice as ice
from aiortc import rtcdtlstransport as dtls
from aiortc import rtcsctptransport as sctp
from OpenSSL import SSL
from OpenSSL._util import ffi as _ffi
from OpenSSL._util import lib as _lib

from ..native import keys as _keys
from ..native import records as _native_records
from . import compiled_sctp as _sctp_io
from .ice import DatagramQueue as _DatagramQueue
from .sctp_receiver import FastInboundStream as _FastInboundStream

_dtls_module: Any = dtls  # clock, is_rtcp, pylibsrtp: imported there, not exported
_Dtls: Any = dtls.RTCDtlsTransport
_stock_recv_next: Callable[[Any], Any] = _Dtls._recv_next
_stock_write_ssl: Callable[[Any], Any] = _Dtls._write_ssl
_stock_send_data: Callable[[Any, bytes], Any] = _Dtls._send_data
_CONNECTED = dtls.State.CONNECTED
_ESTABLISHED = sctp.RTCSctpTransport.State.ESTABLISHED
_StunProtocol = ice.StunProtocol
_DataChunk = sctp.DataChunk
_BUFSIZE = 1500  # aiortc's read size for both directions
_NONE_SEEN = (0, -1)  # (epoch, sequence number) before any record
_SSL_read = _lib.SSL_read
_SSL_write = _lib.SSL_write
_BIO_read = _lib.BIO_read
_BIO_write = _lib.BIO_write
_BIO_should_retry = _lib.BIO_should_retry
_unpack = _ffi.buffer


class _Fast:
    """What one transport's fast path needs, looked up once: the OpenSSL pointers and a buffer; once
    the compiled layer takes the records over, that layer and the UDP pair it sends on."""

    __slots__ = (
        "buf", "conn", "direct", "into", "native", "out", "overhead", "pair", "ssl", "ssl_ptr", "track",
    )

    def __init__(self, transport: Any) -> None:
        ssl = transport._ssl
        self.ssl = ssl
        self.ssl_ptr = ssl._ssl
        self.into = ssl._into_ssl
        self.out = ssl._from_ssl
        self.buf = _ffi.new("char[]", _BUFSIZE)
        self.conn = transport.transport._connection
        if type(self.conn._queue) is not _DatagramQueue:  # the reader is this task, and it is not waiting
            self.conn._queue = _DatagramQueue.replacing(self.conn._queue)
        self.native: Any = None
        self.pair: Any = None
        self.direct = False
        self.overhead = 0
        # Sequence numbers were followed from the first flight on (see write_ssl) only if the compiled
        # layer was there then; a link set up without it stays in OpenSSL.
        self.track = _native_records() is not None and "_lah_tx_top" in transport.__dict__


def _fast(self: Any, reader: bool = False) -> _Fast | None:
    """The fast-path state once the handshake is done and the ICE transport is aioice's, else None.

    Only the reader (``recv_next``, between two reads) may create it: creating it replaces aioice's
    queue, and a reader already waiting on the old queue would wait there forever. A sender (the SCTP
    timer resending INIT while nothing has arrived since the handshake: the peer's last flight lost)
    gets None until then and sends the stock way."""
    f: _Fast | None = self.__dict__.get("_lah_fast")
    if f is not None and f.ssl is self._ssl:
        return f
    if not reader:
        return None
    if not self._RTCDtlsTransport__handshake_done or self._state is not _CONNECTED:
        return None
    ice_transport = self.transport
    conn = getattr(ice_transport, "_connection", None)
    if conn is None or getattr(ice_transport, "_recv", None) != conn.recv:
        return None
    f = self._lah_fast = _Fast(self)
    return f


async def _send_datagram(conn: Any, data: bytes) -> None:
    """aioice ``Connection.send`` (component 1) without its coroutine layers for a plain UDP pair."""
    pair = conn._nominated.get(1)
    if pair is None:
        raise ConnectionError("Cannot send data, not connected")
    protocol = pair.protocol
    if type(protocol) is _StunProtocol:
        protocol.transport.sendto(data, pair.remote_addr)  # what StunProtocol.send_data does
    else:
        await protocol.send_data(data, pair.remote_addr)


def _top(data: bytes, top: tuple[int, int]) -> tuple[int, int]:
    """The highest (epoch, sequence number) among ``top`` and the DTLS records in one datagram."""
    i, n = 0, len(data)
    while i + 13 <= n:
        here = ((data[i + 3] << 8) | data[i + 4], int.from_bytes(data[i + 5 : i + 11], "big"))
        if here > top:
            top = here
        i += 13 + ((data[i + 11] << 8) | data[i + 12])
    return top


async def _flush(self: Any, f: _Fast) -> None:
    """``_write_ssl``: send what OpenSSL wrote to the outgoing BIO (one read of up to 1500 bytes)."""
    n = _BIO_read(f.out, f.buf, _BUFSIZE)
    if n <= 0:
        if not _BIO_should_retry(f.out):  # a real BIO failure (never seen): pyOpenSSL's error, swallowed
            with contextlib.suppress(SSL.Error):
                f.ssl._handle_bio_errors(f.out, n)
        return
    if f.native is not None:
        await _openssl_wrote_after_handover(self, f)
        return
    data = _unpack(f.buf, n)[:]
    if f.track:
        self._lah_tx_top = _top(data, self._lah_tx_top)
    await _send_datagram(f.conn, data)
    self._RTCDtlsTransport__tx_bytes += n
    self._RTCDtlsTransport__tx_packets += 1


async def _openssl_wrote_after_handover(self: Any, f: _Fast) -> None:
    """OpenSSL's records carry stale sequence numbers once the compiled layer seals: the peer would drop
    them as replays. The only thing OpenSSL has to say then is close_notify (``stop``, or the answer to
    the peer's): that one is sealed here; anything else is dropped."""
    while _BIO_read(f.out, f.buf, _BUFSIZE) > 0:  # drain the rest
        pass
    if f.ssl.get_shutdown() & SSL.SENT_SHUTDOWN and not self.__dict__.get("_lah_close_sent"):
        self._lah_close_sent = True
        with contextlib.suppress(ConnectionError, OSError):
            await _send_datagram(f.conn, f.native.seal(b"\x01\x00", 21))  # alert: warning, close_notify


def _hand_over(self: Any, f: _Fast, rx_epoch: int) -> None:
    """Move application-data records to the compiled layer (called once the peer's first one opened)."""
    f.track = False  # one try per link
    module = _native_records()
    ssl = f.ssl
    tx_epoch, tx_seq = self._lah_tx_top
    rx_top = self.__dict__.get("_lah_rx_top", _NONE_SEEN)
    if module is None or ssl.get_protocol_version_name() != "DTLSv1.2":
        return
    if tx_epoch != rx_epoch or tx_epoch < 1:
        return
    keys = _keys.derive(
        ssl.get_cipher_name() or "",
        ssl.master_key(),
        ssl.client_random(),
        ssl.server_random(),
        self._role == "client",
    )
    pair = f.conn._nominated.get(1)
    if keys is None or pair is None:
        return
    rl = module.RecordLayer(
        keys.cipher,
        keys.write_key,
        keys.write_iv,
        keys.read_key,
        keys.read_iv,
        tx_epoch,
        tx_seq + 1,
        rx_top[1] if rx_top[0] == rx_epoch else -1,
    )
    if type(pair.protocol) is _StunProtocol and pair.protocol.transport is not None:
        sock = pair.protocol.transport.get_extra_info("socket")
        if sock is not None:
            try:
                rl.set_destination(sock.fileno(), str(pair.remote_addr[0]), int(pair.remote_addr[1]))
                f.direct = True
            except (ValueError, OSError):  # not an address literal: sealed here, sent by the transport
                pass
    f.pair = pair
    f.overhead = 29 if keys.cipher.endswith("GCM") else 21  # header 13 + tag 16 (+ explicit nonce 8)
    f.native = rl
    # What open_receive builds and accepts: with the sctp group stock, streams are aiortc's own class
    # and no chunk is taken in C (the types differ), so the stock receiver sees every packet.
    module.receiver_types(_DataChunk, _FastInboundStream, _ESTABLISHED, object.__new__)
    if type(f.conn._queue) is _DatagramQueue:
        f.conn._lah_inline = _sctp_io.inline_receiver(self, f)


async def write_ssl(self: Any) -> None:
    f = _fast(self)
    if f is not None:
        await _flush(self, f)
    elif _native_records() is None:
        await _stock_write_ssl(self)
    else:  # stock's, reading each datagram's sequence numbers on the way (see _hand_over)
        try:
            data = self._ssl.bio_read(_BUFSIZE)
        except SSL.Error:
            data = b""
        if data:
            self._lah_tx_top = _top(data, self.__dict__.get("_lah_tx_top", _NONE_SEEN))
            await self.transport._send(data)
            self._RTCDtlsTransport__tx_bytes += len(data)
            self._RTCDtlsTransport__tx_packets += 1


async def send_data(self: Any, data: bytes) -> None:
    f = _fast(self)
    if f is None or self._state is not _CONNECTED:  # stock raises ConnectionError when not connected
        await _stock_send_data(self, data)
        return
    rl = f.native
    if rl is not None:
        pair = f.conn._nominated.get(1)
        if pair is None:
            raise ConnectionError("Cannot send data, not connected")
        if pair is f.pair and f.direct:
            _sctp_io.sent(self, f, pair, rl.seal_send, (data,), len(data))
        else:
            await _send_datagram(f.conn, rl.seal(data))
            _sctp_io.count(self, f, len(data))
        return
    n = _SSL_write(f.ssl_ptr, data, len(data))
    if n <= 0:
        f.ssl._raise_ssl_error(f.ssl_ptr, n)  # raises what pyOpenSSL's send raises
    await _flush(self, f)


async def recv_next(self: Any) -> None:
    """Stock ``_recv_next`` for every datagram already queued (a burst), then back to aiortc's loop.

    Stock also takes a queued datagram without yielding to the event loop, so the order of work is
    the same; only the per-datagram return to ``__run`` and the lookups are saved."""
    f = _fast(self, reader=True)
    if f is None:
        await _stock_recv_next(self)
        return
    conn = f.conn
    if not conn._nominated:
        raise ConnectionError("Cannot receive data, not connected")
    q = conn._queue
    result = q.get_nowait() if q.qsize() else await q.get()
    if f.native is not None and self._data_receiver is not None:
        result = await _sctp_io.compiled_burst(self, f, q, result)
        if result is _sctp_io.BURST_DONE:
            return
    while True:
        if result is None:
            raise ConnectionError("Connection lost while receiving data")
        data = result[0]
        if data is _sctp_io.OPENED:  # opened in the UDP callback, counted there (the debug log came on since)
            await _sctp_io.deliver_opened(self._data_receiver, result[1])
            if not q.qsize() or not conn._nominated:
                return
            result = q.get_nowait()
            continue
        self._RTCDtlsTransport__rx_bytes += len(data)
        self._RTCDtlsTransport__rx_packets += 1
        first_byte = data[0]
        plain: bytes | None
        if not 19 < first_byte < 64:
            await _not_dtls(self, data)
        elif f.ssl is not self._ssl:  # replaced while we waited (never in aiortc): the stock calls
            self._lah_fast = None
            await _stock_record(self, data)
            return
        elif f.native is not None and (
            plain := _sctp_io.open_record(f.native, data, self._data_receiver)
        ) is not None:  # None: not this layer's record, OpenSSL's (below)
            if plain:  # b"": a replay or a forgery, dropped (counted there); 0: a chunk taken, nothing due
                await _sctp_io.deliver_opened(self._data_receiver, plain)
        else:
            if f.track:
                self._lah_rx_top = _top(data, self.__dict__.get("_lah_rx_top", _NONE_SEEN))
            n = _BIO_write(f.into, data, len(data))
            if n <= 0:
                f.ssl._handle_bio_errors(f.into, n)  # raises, as pyOpenSSL's bio_write does
            plains, closed = _read_all(f)
            if plains and f.track and first_byte == 23:  # the peer sends data: its handshake is over
                _hand_over(self, f, (data[3] << 8) | data[4])
            await _flush(self, f)
            for plain in plains:
                if self._data_receiver:
                    await self._data_receiver._handle_data(plain)
            if closed:
                raise ConnectionError  # stock logs "DTLS shutdown by remote party" at debug level
        if not q.qsize() or not conn._nominated:
            return
        result = q.get_nowait()


def _read_all(f: _Fast) -> tuple[list[bytes], bool]:
    """Every plaintext OpenSSL holds now, and whether the peer closed (close_notify).

    Records that came before this side's handshake was over (the peer's SCTP INIT, sent while its last
    flight was lost) wait in OpenSSL until read. Stock reads one record per datagram, so each came a
    datagram late; once the compiled layer takes the records over, OpenSSL is never read for data
    again and they were lost, and the SCTP packets in them had to wait for a retransmission."""
    plains: list[bytes] = []
    while True:
        n = _SSL_read(f.ssl_ptr, f.buf, _BUFSIZE)
        if n > 0:
            plains.append(_unpack(f.buf, n)[:])
            continue
        try:
            f.ssl._raise_ssl_error(f.ssl_ptr, n)
        except SSL.ZeroReturnError:
            return plains, True
        except SSL.Error:
            pass
        return plains, False


async def _stock_record(self: Any, data: bytes) -> None:
    """One DTLS datagram through pyOpenSSL's wrappers, exactly as stock ``_recv_next`` handles it."""
    self._ssl.bio_write(data)
    plain: bytes | None
    try:
        plain = self._ssl.recv(_BUFSIZE)
    except SSL.ZeroReturnError:
        plain = None
    except SSL.Error:
        plain = b""
    await self._write_ssl()
    if plain is None:
        raise ConnectionError
    if plain and self._data_receiver:
        await self._data_receiver._handle_data(plain)


async def _not_dtls(self: Any, data: bytes) -> None:
    """SRTP/SRTCP as stock ``_recv_next`` handles it (data channels never see it); others dropped."""
    first_byte = data[0]
    if 127 < first_byte < 192 and self._rx_srtp:
        arrival_time_ms = _dtls_module.clock.current_ms()
        try:
            if _dtls_module.is_rtcp(data):
                await self._handle_rtcp_data(self._rx_srtp.unprotect_rtcp(data))
            else:
                await self._handle_rtp_data(self._rx_srtp.unprotect(data), arrival_time_ms=arrival_time_ms)
        except _dtls_module.pylibsrtp.Error:
            pass


def record_layer(dtls_transport: Any) -> str:
    """Which record layer a link's DTLS transport runs now: "compiled", "openssl" (the Python fast path
    over OpenSSL's record calls) or "stock" (aiortc's own calls: the dtls group not installed, or the
    handshake not done yet)."""
    f = dtls_transport.__dict__.get("_lah_fast")
    if f is None:
        return "stock"
    return "compiled" if f.native is not None else "openssl"
