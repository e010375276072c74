"""The handshake's timers under loss: DTLS flights copied early, SCTP's INIT on the path's RTO (the
``handshake`` group).

Measured with ``benchmarks/connect_loss.py`` (both ends in one namespace, random loss on every
datagram): at 5% loss a connect that costs 40 ms without loss took a second or more about one time in
three (p99 4 s; 3% after this change, p99 1.6 s), and the seconds came from three timers, each longer
than the path needs:

- **DTLS flights** wait on OpenSSL's retransmission timer: 1 s, doubling (RFC 6347 4.2.4.1's values,
  which aiortc drives with ``DTLSv1_handle_timeout``). pyOpenSSL binds no call that sets it
  (``DTLS_set_timer_cb`` is not exported), so the timer stays; instead each side resends byte-for-byte
  copies of its latest flight on a shorter schedule: the first after twice the round trip the handshake
  has measured so far (:data:`FIRST_COPY_S` while it has measured none, never more than
  :data:`MAX_FIRST_COPY_S`), then doubling, at most :data:`MAX_COPIES` times, until the peer's next
  flight arrives. RFC 9147 5.8.2 (DTLS 1.3, same authors) recommends 100 ms doubling; libwebrtc
  starts at twice the ICE round trip (50 ms to 3 s). A copy is a duplicate on the wire: where the
  original arrived, DTLS replay detection (RFC 6347 4.1.2.6) drops it; where it was lost, the copy is
  the retransmission. The side that sends the last flight (the server's ChangeCipherSpec and Finished)
  has no timer at all in DTLS 1.2 and relies on the peer resending its own flight a second later; it
  copies that last flight until the peer's first application data shows it arrived. Datagrams in
  DTLS 1.3's unified header turn copying off (the flights differ there).
- **SCTP's INIT and COOKIE ECHO** (T1) waited a fixed RTO.Initial (1 s here, 3 s in stock aiortc) and
  never backed off, so an association gave up after 9 s, while its peer's DTLS handshake could still
  be resending. The T1 timer now starts from the DTLS handshake's round trip (RFC 9260 6.3.1 C2: RTO =
  SRTT + 4 RTTVAR = 3R for a first measurement R; DTLS and SCTP share one UDP path, RFC 8261), within
  the sender's RTO bounds, and doubles on every expiry (RFC 9260 6.3.3 E2). The channel's OPEN, the
  first DATA chunk, starts from that RTO too.
- **An INIT resent after an INIT collision** carried the peer's verification tag, and the peer drops
  any INIT whose tag is not 0 (RFC 9260 8.5.1): when both INIT ACKs were lost, neither side ever
  answered again (stock aiortc as well). T1 resends an INIT with tag 0.

ICE's connectivity checks keep aioice's 0.5 s doubling: RFC 8445 14.3 sets 500 ms as the floor.
What each connect's phases cost, and what they resent, is in the benchmark's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiortc import rtcdtlstransport as dtls
from aiortc import rtcsctptransport as sctp

from . import sctp_constants as limits
from .tasks import spawn

FIRST_COPY_S = 0.1  # RFC 9147 5.8.2's initial timer, while no round trip is known
MAX_FIRST_COPY_S = 0.5  # later than this, OpenSSL's own 1 s timer is about as early
MAX_COPIES = 6  # 0.1 + 0.2 + ... + 3.2: copies cover the first 6.3 s; OpenSSL's timer goes on after
_HEADER = 13  # DTLS 1.2 record header
_Dtls: Any = dtls.RTCDtlsTransport
_Sctp: Any = sctp.RTCSctpTransport
_stock_do_handshake = _Dtls._do_handshake
_LIVE = (dtls.State.CONNECTING, dtls.State.CONNECTED)


def unified_header(data: bytes) -> bool:
    """A DTLS 1.3 ciphertext record (first byte 001xxxxx, RFC 9147 4): flights cannot be told apart."""
    return bool(data) and 31 < data[0] < 64


def flight_signature(data: bytes) -> tuple[tuple[int, ...], ...]:
    """What one datagram's records say about the flight they belong to, record numbers left out: content
    type and epoch, and for a plaintext handshake message its type, message_seq and fragment offset. A
    retransmission by OpenSSL (same messages, new record numbers) has the same signature."""
    out: list[tuple[int, ...]] = []
    i, n = 0, len(data)
    while i + _HEADER <= n:
        kind, epoch = data[i], (data[i + 3] << 8) | data[i + 4]
        length = (data[i + 11] << 8) | data[i + 12]
        body = i + _HEADER
        if kind == 22 and epoch == 0 and length >= 12 and body + 12 <= n:
            seq = (data[body + 4] << 8) | data[body + 5]
            out.append((kind, epoch, data[body], seq, int.from_bytes(data[body + 6 : body + 9], "big")))
        else:
            out.append((kind, epoch))
        i = body + length
    return tuple(out)


class FlightCopies:
    """One DTLS transport's copies of its latest handshake flight, and the round trips it measured.

    Sits on the ICE transport's ``_send`` (what the handshake writes goes through it) and on the ICE
    connection's ``data_received`` (when the peer last spoke, and whether it sent application data),
    both as instance attributes put back once the copies end."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.ice = transport.transport
        self.conn = self.ice._connection
        self.send = self.ice._send
        self.deliver = self.conn.data_received
        self.flight: list[bytes] = []
        self.signatures: set[tuple[tuple[int, ...], ...]] = set()
        self.started = 0.0  # when the flight's first datagram left
        self.clean = False  # neither copied nor resent by OpenSSL: its answer measures the round trip
        self.arrived = 0.0  # when the peer's latest datagram came
        self.copies = 0
        self.final = False  # the handshake is over here; the peer may still lack our last flight
        self.off = False
        self.rtt: float | None = None  # least round trip measured (Karn: clean flights only)
        self.handle: asyncio.TimerHandle | None = None
        self.ice._send = self.sending
        self.conn.data_received = self.received

    async def sending(self, data: bytes) -> None:
        self.sent(data)
        await self.send(data)

    def sent(self, data: bytes) -> None:
        if self.off:
            return
        if unified_header(data):
            self.stop()
            return
        sig = flight_signature(data)
        now = time.monotonic()
        if sig in self.signatures:  # OpenSSL resent the flight: its answer times nothing
            self.clean = False
        elif self.flight and self.copies == 0 and self.arrived < self.started:
            self.flight.append(data)  # one flight in several datagrams
            self.signatures.add(sig)
        else:  # the peer answered our last flight: this is the next one
            if self.flight and self.clean:
                self._measured(self.arrived - self.started)
            self.flight, self.signatures = [data], {sig}
            self.started, self.clean, self.copies = now, True, 0
            self._arm(self.first_delay())

    def received(self, data: bytes, component: int) -> None:
        if data and 19 < data[0] < 64:
            self.arrived = time.monotonic()
            # DTLS 1.3, or the peer's application data: it has our last flight
            if unified_header(data) or (self.final and data[0] == 23):
                self.stop()
        self.deliver(data, component)

    def first_delay(self) -> float:
        delay = FIRST_COPY_S if self.rtt is None else 2 * self.rtt
        return min(max(delay, FIRST_COPY_S), MAX_FIRST_COPY_S)

    def _measured(self, sample: float) -> None:
        if sample > 0:
            self.rtt = sample if self.rtt is None else min(self.rtt, sample)
            self.transport._lah_handshake_rtt = self.rtt

    def _arm(self, delay: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = asyncio.get_running_loop().call_later(delay, self._due, delay)

    def _due(self, delay: float) -> None:
        self.handle = None
        alive = self.transport._state in _LIVE and bool(self.conn._nominated)
        if self.off or not self.flight or self.copies >= MAX_COPIES or not alive:
            if self.final or not alive:
                self.stop()
            return
        self.copies += 1
        self.clean = False
        self.transport._lah_flight_copies = self.transport.__dict__.get("_lah_flight_copies", 0) + 1
        for data in self.flight:
            spawn(self._copy(data))
        self._arm(delay * 2)

    async def _copy(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            await self.send(data)

    def handshake_over(self, completed: bool) -> None:
        """Called when the handshake ends: copies stop, unless our flight was the last word."""
        if self.ice.__dict__.get("_send") == self.sending:
            self.ice._send = self.send
        if completed and self.flight and self.clean and self.arrived > self.started:
            self._measured(self.arrived - self.started)  # the peer's last flight answered ours
        if completed and not self.off and self.flight and self.started > self.arrived:
            self.final = True  # keep copying it until the peer's application data arrives
            return
        self.stop()

    def stop(self) -> None:
        self.off = True
        self.flight = []
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.conn.__dict__.get("data_received") == self.received:
            del self.conn.data_received


async def do_handshake(self: Any) -> None:
    """``RTCDtlsTransport._do_handshake`` with :class:`FlightCopies` around it."""
    copies = self._lah_flights = FlightCopies(self)
    try:
        await _stock_do_handshake(self)
    finally:
        copies.handshake_over(self.encrypted and self._state is not dtls.State.FAILED)


# --- SCTP: T1 (INIT, COOKIE ECHO) --------------------------------------------------------------------


def _rto_bounds(self: Any) -> tuple[float, float]:
    """The running sender's RTO.Min and RTO.Max: the project's where its sender runs, else aiortc's."""
    if "_lah_stats" in self.__dict__:
        return limits.RTO_MIN, limits.RTO_MAX
    return float(sctp.SCTP_RTO_MIN), float(sctp.SCTP_RTO_MAX)


def t1_start(self: Any, chunk: Any) -> None:
    """Stock ``_t1_start``; an INIT before any SCTP measurement starts from the DTLS handshake's round
    trip (RFC 9260 6.3.1 C2 for a first measurement R: RTO = 3R, within RTO.Min and RTO.Max)."""
    assert self._t1_handle is None
    rtt = self.transport.__dict__.get("_lah_handshake_rtt")
    if type(chunk) is sctp.InitChunk and self._srtt is None and rtt is not None:
        low, high = _rto_bounds(self)
        self._rto = min(max(3 * rtt, low), high)
    self._t1_chunk = chunk
    self._t1_failures = 0
    self._t1_handle = self._loop.call_later(self._rto, self._t1_expired)


def t1_expired(self: Any) -> None:
    """Stock ``_t1_expired`` with the RTO doubled at every expiry (RFC 9260 6.3.3 E2) and an INIT
    resent with verification tag 0 (RFC 9260 8.5.1), whatever tag an INIT from the peer taught us."""
    self._t1_failures += 1
    self._t1_handle = None
    if self._t1_failures > sctp.SCTP_MAX_INIT_RETRANS:
        self._set_state(self.State.CLOSED)
        return
    self._rto = min(self._rto * 2, _rto_bounds(self)[1])
    spawn(_resend(self, self._t1_chunk))
    self._t1_handle = self._loop.call_later(self._rto, self._t1_expired)


async def _resend(self: Any, chunk: Any) -> None:
    with contextlib.suppress(ConnectionError):
        if type(chunk) is sctp.InitChunk:
            packet = sctp.serialize_packet(self._local_port, self._remote_port, 0, chunk)
            await self.transport._send_data(packet)
        else:
            await self._send_chunk(chunk)
