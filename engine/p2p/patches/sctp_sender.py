"""SCTP sender: loss recovery after RFC 9260 and modern TCP, with a pluggable congestion controller.

Stock aiortc 1.16.0 runs Reno from a 3-packet window with at most one MTU of growth per SACK, marks a
fast-retransmitted chunk again on every third later SACK (about 30 retransmissions per loss on a 50 ms
path; RFC 9260 section 7.2.4 forbids it), never limits what is in flight by the peer's receive window,
and uses a 1 s minimum RTO that a T3 expiry never backs off. Here, with the same chunks and queues:

- **Fast retransmit once**: a chunk missed by 3 SACKs that newly ack later TSNs is retransmitted, once.
- **RACK** (RFC 8985, time order): a chunk (a retransmission included) is lost when a chunk sent more
  than ``min_rtt / 4`` after it has been delivered. That is how a lost retransmission is found without
  waiting for the RTO. SACK duplicate reports (our needless resends) widen that window (RFC 8985 6.2).
- **PRR** (RFC 6937): during recovery the sender sends in proportion to what is delivered, ending near
  the controller's ``ssthresh`` instead of stalling and then bursting.
- **Tail-loss probe** (RFC 8985 section 7, with RFC 9002's timeout): SRTT + max(4 x RTTVAR, 10 ms)
  + 25 ms (the peer's SACK delay) after the last SACK with data outstanding, one chunk is sent (new
  data, else the highest TSN), so an RPC whose last packet was lost completes after about one RTT plus
  the probe time, not an RTO.
- **RTO** between ``RTO_MIN`` and ``RTO_MAX``, doubled on every T3 expiry (RFC 9260 6.3.3 E2).
  The first expiry resends only the earliest chunk (F-RTO, RFC 5682, in spirit: on a stalled receiver
  most RTOs are spurious); RACK then finds the rest if it was lost; a second expiry resends everything.
  After ``MAX_RETRANS`` consecutive expiries without any SACK, or ``ASSOCIATION_TIMEOUT`` s,
  the association is aborted (a peer that never SACKs), so callers see the channel close.
- **The peer's receive window** bounds new data (RFC 9260 6.1 A/B): rwnd = a_rwnd - outstanding, minus
  what is sent since. With a zero or tiny window one chunk may go when nothing is in flight (the probe),
  then the sender waits for a SACK or the backed-off T3; it never spins.
- **Initial window** 10 MTUs and a ``RECEIVE_WINDOW`` advertised to the peer (stock: 1 MiB).
- **Flush keeps the window full**: when the outbound queue runs dry with room left, the next data
  channel messages are handed to SCTP at once instead of on the next SACK.
- **I bit** (RFC 7053), where the peers agreed a SACK every N packets (:mod:`.ack_frequency`): set on
  the chunk after which the sender waits for a SACK (window or PRR quota full, the peer's window full,
  nothing more queued), on every retransmission and on the tail-loss probe.
- **Defensive SACK handling**: a cumulative ack beyond the highest TSN sent is ignored and logged; gap
  blocks that are empty, reversed or beyond what was sent are skipped and counted.

The limits in capitals live in :mod:`.sctp_constants`. Counters for all of it live in
:class:`SenderStats` (``transport._lah_stats``), see :func:`stats`.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from aiortc import rtcsctptransport as sctp
from aiortc.utils import uint32_gt as _gt
from aiortc.utils import uint32_gte as _gte

from ..native import records as _native_records
from . import congestion, sctp_receiver, sctp_timers
from . import sctp_constants as limits
from . import sctp_loops as _loops
from .compiled_sctp import data_chunk_sender as _data_chunk_sender
from .tasks import spawn

logger = logging.getLogger(__name__)

# benchmarks/wan.py: the best under random loss (docs/decisions/congestion-control.md)
DEFAULT_CONTROLLER = "bbr"

_MTU = sctp.USERDATA_MAX_LENGTH
_I_BIT = _loops.I_BIT
_MOD = sctp.SCTP_TSN_MODULO
_Transport: Any = sctp.RTCSctpTransport
_ESTABLISHED = _Transport.State.ESTABLISHED
_CLOSED = _Transport.State.CLOSED
_stock_init = _Transport.__init__
_stock_update_apap = _Transport._update_advanced_peer_ack_point


@dataclass
class SenderStats:
    retransmissions: int = 0  # DATA chunks sent again (fast, RACK, TLP and T3 together)
    fast_retransmits: int = 0
    rack_losses: int = 0  # chunks declared lost by time order (lost retransmissions among them)
    tlp_probes: int = 0
    recoveries: int = 0
    rto_expiries: int = 0
    duplicates_reported: int = 0  # TSNs the peer got twice (RFC 9260 SACK duplicates: our spurious resends)
    spurious_rtos: int = 0  # RTOs whose first SACK acknowledged chunks sent before them (F-RTO)
    forged_acks: int = 0  # SACKs acknowledging TSNs never sent (ignored)
    bad_gap_blocks: int = 0
    rwnd_limited: int = 0  # times new data waited for the peer's receive window
    gave_up: bool = False


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    _stock_init(self, *args, **kwargs)
    sctp_receiver.init_receiver(self)
    now = time.monotonic()
    self._advertised_rwnd = limits.RECEIVE_WINDOW
    self._rto = limits.RTO_INITIAL
    self._cc = congestion.make(DEFAULT_CONTROLLER, _MTU)
    self._cwnd = self._cc.cwnd
    self._lah_stats = SenderStats()
    self._rtx_pending = False  # some chunk in _sent_queue may have _retransmit set
    self._peer_rwnd = None  # None until the first SACK: then a_rwnd from INIT
    self._in_recovery = False
    self._recovery_exit = 0
    self._recover_fs = 0
    self._prr_delivered = 0
    self._prr_out = 0
    self._prr_quota = 0
    self._fr_first = False  # the first retransmission of a recovery goes regardless of cwnd
    self._rack_time = 0.0  # latest send time of a delivered chunk
    self._reo_mult = 1  # reordering window in quarters of the min RTT, widened by duplicate reports
    self._reo_persist = 0
    self._min_rtt = None
    self._delivered = 0
    self._delivered_time = now
    self._first_sent_time = now  # send time of the chunk most recently delivered
    self._next_round = 0
    self._app_limited_until = 0
    self._t3_failures = 0
    self._frto_tsn = None  # chunk resent by the first RTO, until the next SACK
    self._last_progress = now
    self._tlp_deadline = 0.0
    self._tlp_handle = None
    self._tlp_sent = False
    self._pace_tokens = 0.0
    self._pace_time = now
    self._pace_handle = None
    self._flushing = False
    self._lah_mark_waits = False  # set I bits: the peer SACKs every N packets (ack_frequency.apply)


def set_controller(transport: Any, name: str) -> None:
    """Switch ``transport``'s congestion controller, keeping its current window."""
    transport._cc = congestion.make(name, _MTU, transport._cc.cwnd)
    transport._cwnd = transport._cc.cwnd


def stats(transport: Any) -> dict[str, Any]:
    """Counters and congestion state of one association (empty when the patches are not installed)."""
    counters: SenderStats | None = getattr(transport, "_lah_stats", None)
    if counters is None:
        return {}
    cc = transport._cc
    srtt = transport._srtt
    return {
        **asdict(counters),
        "cc": cc.name,
        "cwnd": cc.cwnd,
        "ssthresh": cc.ssthresh if cc.ssthresh < 1 << 30 else None,
        "srtt_ms": None if srtt is None else round(srtt * 1000, 2),
        "min_rtt_ms": None if transport._min_rtt is None else round(transport._min_rtt * 1000, 2),
        "rto_ms": round(transport._rto * 1000, 1),
        "flight": transport._flight_size,
        "peer_rwnd": transport._peer_rwnd,
        "in_recovery": transport._in_recovery,
        "pacing_rate": None if cc.pacing_rate is None else round(cc.pacing_rate),
        **cc.state_stats(),
    }


def _update_rto(self: Any, r: float) -> None:
    if self._min_rtt is None or r < self._min_rtt:
        self._min_rtt = r
    if self._srtt is None:
        self._rttvar = r / 2
        self._srtt = r
    else:
        self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - r)
        self._srtt = 0.875 * self._srtt + 0.125 * r
    self._rto = max(limits.RTO_MIN, min(self._srtt + 4 * self._rttvar, limits.RTO_MAX))


def _update_advanced_peer_ack_point(self: Any) -> None:
    """Only advances the ack point when nothing is abandoned (stock rebuilds a dict per SACK)."""
    if (
        self._forward_tsn_streams
        or (self._outbound_queue and self._outbound_queue[0]._abandoned)
        or (self._sent_queue and self._sent_queue[0]._abandoned)
    ):
        _stock_update_apap(self)
        return
    if _gt(self._last_sacked_tsn, self._advanced_peer_ack_tsn):
        self._advanced_peer_ack_tsn = self._last_sacked_tsn
    elif _gt(self._advanced_peer_ack_tsn, self._last_sacked_tsn):
        _stock_update_apap(self)  # a FORWARD TSN is still owed to the peer


async def _receive_sack_chunk(self: Any, chunk: Any) -> None:
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


def _send_budget(self: Any, now: float) -> float:
    cc = self._cc
    budget: float = self._prr_quota if self._in_recovery else cc.cwnd - self._flight_size
    rate = cc.pacing_rate
    if rate:
        depth = max(rate * limits.PACING_BURST_S, 4 * _MTU)
        self._pace_tokens = min(self._pace_tokens + (now - self._pace_time) * rate, depth)
        self._pace_time = now
        budget = min(budget, self._pace_tokens)
    return budget


async def _transmit(self: Any) -> None:
    if self._forward_tsn_chunk is not None:
        await self._send_chunk(self._forward_tsn_chunk)
        self._forward_tsn_chunk = None
        if not self._t3_handle:
            self._t3_start()
    if self._peer_rwnd is None:
        self._peer_rwnd = int(getattr(self, "_ssthresh", limits.RECEIVE_WINDOW))  # a_rwnd from INIT
    now = time.monotonic()
    budget = _send_budget(self, now)
    st = self._lah_stats
    q = self._sent_queue
    blocked = False
    burst: list[Any] = []  # new chunks: one compiled call sends them (compiled_sctp), else one by one
    send_burst = _data_chunk_sender(self) if self._outbound_queue else None

    if self._rtx_pending:
        self._rtx_pending = False
        for c in [c for c in q if c._retransmit]:
            if not c._retransmit or c._acked or _gte(self._last_sacked_tsn, c.tsn):
                continue
            if self._fr_first:
                self._fr_first = False
            elif budget < c._book_size:
                self._rtx_pending = blocked = True
                break
            budget -= c._book_size
            _loops.spend(self, c._book_size)
            self._flight_size_increase(c)
            c._retransmit = False
            c._sent_count += 1
            c._sent_time = now
            st.retransmissions += 1
            if self._lah_mark_waits:
                c.flags |= _I_BIT
            await self._send_chunk(c)
            if q and q[0] is c:
                self._t3_restart()

    if not blocked and self._outbound_queue:
        native = _native_records()  # the same loop in C where the extension loaded (sctp_loops)
        take = _loops.take_new_chunks if native is None else native.take_new_chunks
        budget, blocked, flush = take(self, budget, now, burst)
        if burst:
            if not self._t3_handle:
                self._t3_start()
            if send_burst is None:
                for c in burst:
                    await self._send_chunk(c)
            else:
                send_burst(burst)
        if flush:  # keep the window full: the next messages now, their _transmit sends them
            await _flush_next_messages(self)
            return

    if not self._outbound_queue and not self._data_channel_queue and not blocked:
        self._app_limited_until = self._delivered + self._flight_size
    if blocked and self._cc.pacing_rate and self._outbound_queue and self._pace_handle is None:
        wait = max(0.001, (_MTU - self._pace_tokens) / self._cc.pacing_rate)
        self._pace_handle = self._loop.call_later(wait, _pace_expired, self)
    sctp_timers.arm_tlp(self, now)


async def _flush_next_messages(self: Any) -> None:
    """Keep the window full: the outbound queue ran dry with room left, so the next data channel messages
    are taken now (their ``_send`` calls ``_transmit``, which sends them)."""
    self._flushing = True
    try:
        await self._data_channel_flush()
    finally:
        self._flushing = False


def _pace_expired(self: Any) -> None:
    self._pace_handle = None
    if self._association_state is not _CLOSED:
        spawn(self._transmit())
