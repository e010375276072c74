"""SCTP packets from a hostile peer: a parser that checks every length before it trusts it, and a link
whose failure stays that link's.

Why this exists: aiortc's ``decode_params`` never advances past a parameter whose length field is 0, so
one 20-byte packet (an INIT, INIT ACK, RECONFIG, HEARTBEAT, ABORT or ERROR chunk holding such a
parameter) makes it append to a list forever on the event loop: every link, the DHT and expert serving
stop, and memory grows until the OOM killer comes. Its chunk constructors also read fixed fields
without checking the body holds them (``struct.error``, which aiortc's ``except ValueError`` does not
catch), an INIT bundled with another chunk trips an ``assert``, and whatever raises while a datagram is
handled ends the DTLS task with a traceback.

:func:`parse_packet` and :func:`decode_params` replace aiortc's module functions of those names (every
caller in aiortc, our receiver included, reaches them through the module). They accept exactly the
packets stock accepts that are well formed, and raise :class:`MalformedPacket` (a ``ValueError``, so
every caller drops the packet as it drops a bad checksum) for anything whose lengths or counts do not
fit: a parameter shorter than its own header or longer than what is left, more than
:data:`MAX_PARAMS` parameters in a chunk, a chunk body too short for its fixed fields, a SACK whose
counts do not fit its length, a FORWARD TSN or stream reset of odd length, an INIT not alone in its
packet (RFC 9260 section 8.5.1). The link stays up; the receiver counts the packet
(``_lah_malformed``, :mod:`.sctp_receiver`).

:func:`dtls_run` replaces the DTLS transport's receive task. Stock lets any exception of a datagram's
handling (an SCTP or data-channel parse we did not foresee, a bug of ours) escape the task with a
traceback; here it closes that one link, as a remote shutdown does, with a warning that says why,
and counts it in :data:`LINKS_CLOSED`. Every other link and the node go on.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from typing import Any

from aiortc import rtcdtlstransport as _dtls
from aiortc import rtcsctptransport as sctp

logger = logging.getLogger(__name__)

MAX_PARAMS = 64  # in one chunk; aiortc's INIT carries 4, Chromium's about 6, a RECONFIG 1-2

# Why links were closed by dtls_run, by exception type (for status and tests).
LINKS_CLOSED: Counter[str] = Counter()


class MalformedPacket(ValueError):
    """A packet whose lengths or counts do not fit: dropped whole, the link kept."""


_unpack_from = struct.unpack_from
_crc32c: Any = sctp.crc32c  # type: ignore[attr-defined]  # aiortc's C crc32c, imported there
_HEADER = sctp.SCTP_COMMON_HEADER_LENGTH
_CHUNK_HEADER = sctp.SCTP_CHUNK_HEADER_LENGTH


def decode_params(body: bytes) -> list[tuple[int, bytes]]:
    """TLV parameters (RFC 9260 section 3.2.1), each length checked before it is used."""
    params: list[tuple[int, bytes]] = []
    pos, end = 0, len(body)
    while pos <= end - 4:
        if len(params) == MAX_PARAMS:
            raise MalformedPacket(f"more than {MAX_PARAMS} parameters in one chunk")
        kind, length = _unpack_from("!HH", body, pos)
        if length < 4 or pos + length > end:
            raise MalformedPacket(f"parameter of length {length} at offset {pos} of {end}")
        params.append((kind, body[pos + 4 : pos + length]))
        pos += length + (-length % 4)
    return params


# Reconfiguration parameters (RFC 6525): type -> (fixed bytes, size of each repeated item or 0).
_RECONFIG_SHAPES = {13: (12, 2), 14: (4, 2), 15: (4, 0), 16: (8, 0), 17: (8, 0), 18: (8, 0)}


def _check_reconfig(params: list[tuple[int, bytes]]) -> None:
    for kind, value in params:
        shape = _RECONFIG_SHAPES.get(kind)
        if shape is None:
            continue
        fixed, item = shape
        if len(value) < fixed or (len(value) - fixed) % (item or 1) or (not item and len(value) != fixed):
            raise MalformedPacket(f"stream reconfiguration parameter {kind} of {len(value)} bytes")


def _check_body(kind: int, body: bytes) -> None:
    """The fixed fields a chunk class reads must be there (aiortc reads them without looking)."""
    n = len(body)
    if kind == 0:  # DATA: TSN, stream id and sequence, PPID (the compiled path takes the same)
        if n < 12:
            raise MalformedPacket(f"DATA chunk of {n + 4} bytes")
    elif kind == 3:  # SACK: its counts must fill the chunk exactly
        if n < 12:
            raise MalformedPacket(f"SACK chunk of {n + 4} bytes")
        gaps, dups = _unpack_from("!HH", body, 8)
        if 12 + 4 * (gaps + dups) != n:
            raise MalformedPacket(f"SACK with {gaps} gap blocks and {dups} duplicates in {n + 4} bytes")
    elif kind in (1, 2) and n < 16:  # INIT, INIT ACK
        raise MalformedPacket(f"INIT chunk of {n + 4} bytes")
    elif kind == 7 and n != 4:  # SHUTDOWN
        raise MalformedPacket(f"SHUTDOWN chunk of {n + 4} bytes")
    elif kind == 192 and (n < 4 or n % 4):  # FORWARD TSN: a TSN, then (stream, sequence) pairs
        raise MalformedPacket(f"FORWARD TSN chunk of {n + 4} bytes")


def parse_packet(data: bytes) -> tuple[int, int, int, list[Any]]:
    """aiortc's ``parse_packet`` with every length, count and bundling rule checked first."""
    length = len(data)
    if length < sctp.SCTP_PACKET_MINIMUM_LENGTH:
        raise MalformedPacket(f"SCTP packet of {length} bytes")
    source_port, destination_port, verification_tag = _unpack_from("!HHL", data)
    checksum = _unpack_from("<L", data, 8)[0]
    if checksum != _crc32c(data[0:8] + b"\x00\x00\x00\x00" + data[12:]):
        raise ValueError("SCTP packet has invalid checksum")
    chunks: list[Any] = []
    types = sctp.CHUNK_TYPES
    pos = _HEADER
    has_init = False
    while pos <= length - _CHUNK_HEADER:
        kind, flags, chunk_length = _unpack_from("!BBH", data, pos)
        if chunk_length < _CHUNK_HEADER or pos + chunk_length > length:
            raise MalformedPacket(f"SCTP chunk has an invalid length of {chunk_length} bytes")
        body = data[pos + _CHUNK_HEADER : pos + chunk_length]
        cls = types.get(kind)
        if cls is not None:
            _check_body(kind, body)
            chunk: Any = cls(flags=flags, body=body)  # params go through decode_params (installed beside)
            if kind == 130:
                _check_reconfig(chunk.params)
            has_init = has_init or kind == 1
            chunks.append(chunk)
        pos += chunk_length + (-chunk_length % 4)
    if has_init and len(chunks) > 1:
        raise MalformedPacket("INIT bundled with other chunks")
    return source_port, destination_port, verification_tag, chunks


# --- one link's failure stays that link's ---------------------------------------------------------

_DtlsState = _dtls.State


async def dtls_run(self: Any) -> None:
    """Stock ``RTCDtlsTransport.__run``, with an unexpected exception closing this link (logged, with
    its reason) instead of escaping the task."""
    try:
        while True:
            try:
                await self._recv_next()
            except ConnectionError:
                raise
            except Exception as exc:
                LINKS_CLOSED[type(exc).__name__] += 1
                logger.warning(
                    "closing a link: handling a datagram from the peer raised %s: %s",
                    type(exc).__name__,
                    exc,
                    exc_info=logger.isEnabledFor(logging.DEBUG),
                )
                raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
    except ConnectionError:
        for receiver in self._rtp_router.receivers:
            receiver._handle_disconnect()
    finally:
        self._set_state(_DtlsState.CLOSED)
