"""SCTP sender timers: the tail-loss probe and the retransmission timer (T3), with the give-up.

Split from :mod:`.sctp_sender`, which drives them and whose docstring says why each behaves as it does;
below it, so they import nothing of it. Their limits are read from :mod:`.sctp_constants` at call time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiortc import rtcsctptransport as sctp

from . import sctp_constants as limits
from .ack_frequency import I_BIT
from .sctp_loops import first_send, mark_lost
from .tasks import spawn

logger = logging.getLogger(__name__)
_CLOSED: object = sctp.RTCSctpTransport.State.CLOSED


# --- tail-loss probe --------------------------------------------------------------------------


def arm_tlp(self: Any, now: float) -> None:
    if not self._sent_queue or self._in_recovery or self._tlp_sent or self._srtt is None:
        return
    # RFC 9002's probe timeout (QUIC), not RFC 8985's 2 x SRTT: SRTT plus four deviations plus the
    # peer's SACK delay. On a steady 50 ms path that is ~80 ms instead of ~150 ms, which a call whose
    # tail was lost pays in full; a probe sent too early costs one packet.
    pto = self._srtt + max(4 * self._rttvar, limits.PTO_GRANULARITY) + limits.WORST_DELAYED_SACK
    self._tlp_deadline = now + min(pto, self._rto)
    if self._tlp_handle is None:  # one timer; it re-arms itself while the deadline moves on
        self._tlp_handle = self._loop.call_at(
            self._loop.time() + (self._tlp_deadline - now), _tlp_expired, self
        )


def _tlp_expired(self: Any) -> None:
    self._tlp_handle = None
    if not self._sent_queue or self._in_recovery or self._tlp_sent or self._association_state is _CLOSED:
        return
    now = time.monotonic()
    if now < self._tlp_deadline - 0.001:
        self._tlp_handle = self._loop.call_later(self._tlp_deadline - now, _tlp_expired, self)
        return
    self._tlp_sent = True
    self._lah_stats.tlp_probes += 1
    spawn(_send_probe(self))


async def _send_probe(self: Any) -> None:
    now = time.monotonic()
    if not self._sent_queue:
        return
    self._t3_restart()  # the retransmission timer counts from the probe (RFC 8985 section 7.3)
    if self._outbound_queue and (self._peer_rwnd or 0) >= self._outbound_queue[0]._book_size:
        c = self._outbound_queue.popleft()
        self._sent_queue.append(c)
        first_send(self, c, now)
        if self._lah_mark_waits:  # a probe is sent to draw a SACK (RFC 7053's I bit: at once)
            c.flags |= I_BIT
        await self._send_chunk(c)
        return
    for c in reversed(self._sent_queue):
        if not c._acked and not c._abandoned:
            self._flight_size_increase(c)
            c._retransmit = False
            c._sent_count += 1
            c._sent_time = now
            self._lah_stats.retransmissions += 1
            if self._lah_mark_waits:
                c.flags |= I_BIT
            await self._send_chunk(c)
            return


# --- retransmission timer ---------------------------------------------------------------------
#
# Lazy T3: stock aiortc cancels and creates an event-loop timer on every SACK that acknowledges new data
# (``_t3_restart``), about once per two packets. Here a restart only moves ``_t3_deadline`` (loop time)
# and one timer stays armed; when it fires before the deadline it re-arms itself for the rest. The
# timer therefore expires exactly when stock's would (RTO after the latest start or restart, with the
# RTO of that moment; RFC 9260 6.3.2 R1-R3), give or take the loop's millisecond resolution.
# ``_t3_cancel`` stays stock (a real cancel: it runs once per drained flight, not per SACK).

_EARLY = 0.001  # a timer firing this close to its deadline counts as on time (uvloop rounds to ms)


def t3_start(self: Any) -> None:
    assert self._t3_handle is None
    loop = self._loop
    self._t3_deadline = loop.time() + self._rto
    self._t3_handle = loop.call_at(self._t3_deadline, _t3_fire, self)


def t3_restart(self: Any) -> None:
    loop = self._loop
    deadline = loop.time() + self._rto
    self._t3_deadline = deadline
    handle = self._t3_handle
    if handle is not None:
        if handle.when() <= deadline:
            return  # fires first and re-arms for the rest
        handle.cancel()  # the RTO shrank: the armed timer would fire too late
    self._t3_handle = loop.call_at(deadline, _t3_fire, self)


def _t3_fire(self: Any) -> None:
    loop = self._loop
    deadline = self._t3_deadline
    if loop.time() < deadline - _EARLY:
        self._t3_handle = loop.call_at(deadline, _t3_fire, self)
        return
    self._t3_expired()


def t3_expired(self: Any) -> None:
    self._t3_handle = None
    st = self._lah_stats
    st.rto_expiries += 1
    self._t3_failures += 1
    now = time.monotonic()
    if self._t3_failures > limits.MAX_RETRANS or now - self._last_progress > limits.ASSOCIATION_TIMEOUT:
        st.gave_up = True
        logger.warning(
            "SCTP peer silent for %.1f s (%d timeouts): aborting the association",
            now - self._last_progress,
            self._t3_failures - 1,
        )
        spawn(_give_up(self))
        return
    q = self._sent_queue
    if self._t3_failures == 1:
        # First expiry: resend only the earliest chunk (F-RTO, RFC 5682, in spirit). A stalled receiver
        # or path makes this RTO spurious more often than not, and marking the whole window would send
        # it all again; if the rest was really lost, RACK finds it once the resent chunk is acked.
        for c in q:
            if not c._acked and not c._abandoned:
                mark_lost(self, c)
                self._frto_tsn = c.tsn
                break
    else:
        self._frto_tsn = None
        renege = self._t3_failures >= 3  # the peer may have dropped gap-acked chunks: resend those too
        for c in q:
            if c._acked and not renege:
                continue
            c._acked = False
            if not self._maybe_abandon(c):
                c._retransmit = True
            self._flight_size_decrease(c)
    self._rtx_pending = True
    self._update_advanced_peer_ack_point()
    self._in_recovery = False
    self._cc.on_rto(now)
    self._cwnd = self._cc.cwnd
    self._fr_first = True  # RFC 9260 6.3.3 E3: one packet goes whatever the window
    self._rto = min(self._rto * 2, limits.RTO_MAX)
    spawn(self._transmit())


async def _give_up(self: Any) -> None:
    await self._abort()
    self._set_state(_CLOSED)
