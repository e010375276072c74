"""What one SACK tells the SCTP sender: the acknowledgements, the samples, the losses and the recovery.

Split from :mod:`.sctp_sender`, whose docstring says why each part behaves as it does; the registry
installs it as ``RTCSctpTransport._receive_sack_chunk`` with the sender's other parts. In order: a
stale or forged cumulative ack is dropped;
the cumulative ack's chunks leave the flight (:mod:`.sctp_loops`, or its C twin); gap blocks are
checked and their chunks marked acked; the newest delivered chunk gives the RTT and delivery-rate
samples; losses are found by F-RTO after an RTO, RACK's time order and the duplicate threshold; the
recovery is entered or left, the controller told, and the PRR quota set. It calls the sender's other
parts only through the transport's methods (``_update_rto``, ``_transmit``...), so it imports nothing
of :mod:`.sctp_sender`; its limits are read from :mod:`.sctp_constants` at call time.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from aiortc import rtcsctptransport as sctp
from aiortc.utils import uint32_gt as _gt
from aiortc.utils import uint32_gte as _gte

from ..native import records as _native_records
from . import sctp_constants as limits
from . import sctp_loops as _loops

logger = logging.getLogger(__name__)

_MTU = sctp.USERDATA_MAX_LENGTH
_MOD = sctp.SCTP_TSN_MODULO


async def receive_sack_chunk(self: Any, chunk: Any) -> None:
    """RTCSctpTransport._receive_sack_chunk: take what one SACK says, then flush and transmit."""
    cum = chunk.cumulative_tsn
    if _gt(self._last_sacked_tsn, cum):
        return  # older than one already processed (reordered on the path)
    q = self._sent_queue
    highest_sent = q[-1].tsn if q else self._last_sacked_tsn
    if _gt(cum, highest_sent):
        st = self._lah_stats
        st.forged_acks += 1
        log = logger.warning if st.forged_acks == 1 else logger.debug
        log("SACK acknowledges TSN %d beyond the highest sent %d: ignored", cum, highest_sent)
        return
    now = time.monotonic()
    st = self._lah_stats
    cc = self._cc
    flight_before = self._flight_size
    cwnd_limited = flight_before + 2 * _MTU >= cc.cwnd
    delivered_before = self._delivered
    self._t3_failures = 0  # the peer is alive
    self._last_progress = now
    progressed = cum != self._last_sacked_tsn
    self._last_sacked_tsn = cum
    frto = self._frto_tsn

    native = _native_records()  # the same loop in C where the extension loaded (sctp_loops)
    n_new, newest = (_loops.ack_cumulative if native is None else native.ack_cumulative)(self, cum)

    hi = -1  # index in q of the highest chunk acked by a gap block
    hi_new = -1  # ... newly acked by this SACK (HTNA: only chunks below it are struck)
    if chunk.gaps and q:
        bad_before = st.bad_gap_blocks
        head = (q[0].tsn - cum) % _MOD
        n = len(q)
        for start, end in chunk.gaps:
            a, b = start - head, min(end - head, n - 1)
            if start < 1 or start > end or b < 0 or a > n - 1:
                st.bad_gap_blocks += 1
                continue
            if end - head > n - 1:
                st.bad_gap_blocks += 1  # acknowledges TSNs never sent: only the sent part counts
            a = max(a, 0)
            for i, c in enumerate(itertools.islice(q, a, b + 1), a):
                if not c._acked:
                    hi_new = i
                    c._acked = True
                    if c._abandoned:
                        continue
                    self._delivered += c._book_size
                    n_new += 1
                    if newest is None or c._sent_time >= newest._sent_time:
                        newest = c
                self._flight_size_decrease(c)
            hi = max(hi, b)
        if st.bad_gap_blocks != bad_before:
            logger.debug("SACK with gap blocks out of range: %s (cum %d)", chunk.gaps, cum)

    delivered = self._delivered - delivered_before
    rate = None
    new_round = False
    ambiguous = True
    if newest is not None:
        if newest._sent_count == 1:
            self._update_rto(now - newest._sent_time)
        # A retransmitted chunk acked sooner than min RTT after its last send was the original's
        # arrival: its send time says nothing about what else is delivered (RFC 8985 step 2).
        # (RFC 8985 uses min RTT; with a queue at a stalled receiver half the smoothed RTT is safer.)
        soon = max(self._min_rtt or 0.0, (self._srtt or 0.0) / 2)
        ambiguous = newest._sent_count > 1 and (now - newest._sent_time < soon or newest.tsn == frto)
        if newest._sent_time > self._rack_time and not ambiguous:
            self._rack_time = newest._sent_time
        # max(ack interval, send interval): a burst of SACKs after a stall must not look like bandwidth
        interval = max(now - newest._del_t, newest._sent_time - newest._first_t)
        self._first_sent_time = newest._sent_time
        if interval > 0 and not newest._app_limited:
            rate = (self._delivered - newest._del) / interval
        if newest._del >= self._next_round:
            new_round = True
            self._next_round = self._delivered
        self._delivered_time = now

    # loss detection: dupthresh for first transmissions, RACK time order for everything
    lost_bytes = 0
    if frto is not None and n_new:
        # The first SACK after an RTO resend (F-RTO, RFC 5682): if it acknowledges chunks sent before
        # the RTO, the timeout was spurious (a stalled peer or path) and nothing more is resent; if
        # only the resent chunk, the rest of the window was lost: resend it as RFC 9260 does.
        self._frto_tsn = None
        ambiguous = True  # the resent chunk's send time says nothing about the rest
        only_resent = n_new == 1 and not _gt(frto, cum) and newest is not None and newest.tsn == frto
        if only_resent:
            for c in q:
                if not c._acked and not c._retransmit and not c._abandoned:
                    lost_bytes += _loops.mark_lost(self, c) or 1
        else:
            st.spurious_rtos += 1
    # A delivered retransmission (after an RTO: see _t3_expired) makes everything sent before it suspect.
    scan = len(q) if newest is not None and newest._sent_count > 1 and not ambiguous else hi
    if chunk.duplicates:  # DSACK: something was resent needlessly, so wait longer before the next
        st.duplicates_reported += len(chunk.duplicates)
        self._reo_mult = min(self._reo_mult + 1, 16)
        self._reo_persist = 16
    if scan > 0:
        reo_wnd = min((self._min_rtt or 0.0) / 4 * self._reo_mult, self._srtt or 1.0)
        rack = self._rack_time - reo_wnd
        for i, c in enumerate(list(itertools.islice(q, 0, scan))):
            if c._acked or c._retransmit or c._abandoned:
                continue
            if c._sent_time < rack:
                st.rack_losses += 1
                lost_bytes += _loops.mark_lost(self, c) or 1
            elif c._sent_count == 1 and i < hi_new:
                c._misses += 1
                if c._misses >= limits.DUPTHRESH:
                    st.fast_retransmits += 1
                    lost_bytes += _loops.mark_lost(self, c) or 1

    if self._in_recovery and _gte(cum, self._recovery_exit):
        self._in_recovery = False
        cc.on_recovery_exit(now)
    if lost_bytes:
        cc.on_lost(lost_bytes)
        if not self._in_recovery:
            self._in_recovery = True
            self._recovery_exit = highest_sent
            self._recover_fs = max(flight_before, _MTU)
            self._prr_delivered = self._prr_out = 0
            self._fr_first = True
            cc.on_congestion_event(now, flight_before)
            st.recoveries += 1
            self._reo_persist -= 1
            if self._reo_persist <= 0:
                self._reo_mult = 1  # 16 recoveries without a duplicate report: back to min RTT / 4
    if delivered and (cc.model_based or not self._in_recovery):
        cc.on_ack(delivered, now, self._srtt, self._min_rtt, cwnd_limited, rate, new_round)
    if self._in_recovery:
        self._prr_delivered += delivered
        pipe, ssthresh = self._flight_size, cc.ssthresh
        if pipe > ssthresh:
            quota = -(-self._prr_delivered * ssthresh // self._recover_fs) - self._prr_out
        else:
            quota = min(ssthresh - pipe, max(self._prr_delivered - self._prr_out, delivered) + _MTU)
        self._prr_quota = max(quota, 0)
    self._cwnd = cc.cwnd
    self._peer_rwnd = max(0, chunk.advertised_rwnd - self._flight_size)

    if not q:
        self._t3_cancel()
    elif progressed:
        self._t3_restart()
    if delivered:
        self._tlp_sent = False
    self._update_advanced_peer_ack_point()
    await self._data_channel_flush()
    await self._transmit()
