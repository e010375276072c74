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

# benchmarks/wan.py: the best under random loss (docs/decisions/congestion-control.md)
DEFAULT_CONTROLLER = "bbr"

_MTU = sctp.USERDATA_MAX_LENGTH
_I_BIT = _loops.I_BIT
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
