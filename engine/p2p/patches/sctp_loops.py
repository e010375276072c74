"""The SCTP sender's per-chunk loops, as pure bookkeeping on aiortc's objects (no I/O, no awaits).

:func:`take_new_chunks` is :mod:`.sctp_sender`'s ``_transmit`` loop over new chunks and
:func:`ack_cumulative` the loop of :mod:`.sctp_sack` over the chunks a cumulative ack covers. They
run once per DATA chunk, so each has a C twin with the same contract in the compiled extension
(``engine/p2p/native/sctp_send.c``), which the sender uses where it loaded. These Python versions are
the fallback and the oracle: tests give both the same states and compare every field they touch.
:func:`first_send`, :func:`spend` and :func:`waits_after` are their steps, also used by the
retransmission and probe paths; :func:`mark_lost` is what a fast retransmit, RACK and T3 do to a chunk
they find lost.
"""

from __future__ import annotations

from typing import Any

from aiortc.utils import uint32_gte as _gte

from .ack_frequency import I_BIT


def spend(self: Any, size: int) -> None:
    """``size`` bytes sent: out of PRR's quota in recovery, and out of the pacing tokens."""
    if self._in_recovery:
        self._prr_out += size
        self._prr_quota -= size
    if self._cc.pacing_rate:
        self._pace_tokens -= size


def first_send(self: Any, c: Any, now: float) -> None:
    """A chunk sent for the first time: in flight, and what its delivery-rate sample will need."""
    if len(self._sent_queue) == 1:
        self._last_progress = now  # a new flight: the peer's silence counts from here
    self._flight_size_increase(c)
    c._sent_count += 1
    c._sent_time = now
    c._del = self._delivered
    c._del_t = self._delivered_time
    c._first_t = self._first_sent_time
    c._app_limited = self._delivered < self._app_limited_until


def waits_after(self: Any) -> bool:
    """Whether the chunk just counted as sent is the last before a SACK: nothing more is queued, or
    the next chunk fits neither the window (PRR's quota in recovery) nor the peer's receive window.
    Pacing is left out: the pacer's timer sends the next chunk without any SACK."""
    queue = self._outbound_queue
    if not queue:
        return not self._data_channel_queue
    size: int = queue[0]._book_size
    room: int = self._prr_quota if self._in_recovery else self._cc.cwnd - self._flight_size
    return room < size or self._peer_rwnd < size


def take_new_chunks(self: Any, budget: float, now: float, burst: list[Any]) -> tuple[float, bool, bool]:
    """New chunks the budget, the window and the peer's receive window allow, moved from the outbound to
    the sent queue as sent (``first_send``; the I bit where the peers agreed SACKs every N packets) and
    appended to ``burst`` for the caller to send. Returns (budget left, blocked by the budget, flush:
    the outbound queue ran dry while data channel messages wait, so the caller takes them next)."""
    out, q = self._outbound_queue, self._sent_queue
    while out:
        c = out[0]
        size = c._book_size
        if budget < size:
            return budget, True, False
        if self._peer_rwnd < size and self._flight_size > 0:
            self._lah_stats.rwnd_limited += 1
            break
        out.popleft()
        q.append(c)
        budget -= size
        spend(self, size)
        self._peer_rwnd = max(0, self._peer_rwnd - size)
        first_send(self, c, now)
        if self._lah_mark_waits and waits_after(self):
            c.flags |= I_BIT
        burst.append(c)
        if not out and self._data_channel_queue and not self._flushing:
            return budget, False, True
    return budget, False, False


def ack_cumulative(self: Any, cum: int) -> tuple[int, Any]:
    """The chunks ``cum`` acknowledges, popped from the sent queue and out of the flight; those not
    acked or abandoned before count as delivered. Returns (how many newly, the latest sent of them)."""
    q = self._sent_queue
    newest: Any = None
    n_new = 0
    while q and _gte(cum, q[0].tsn):
        c = q.popleft()
        if not c._acked and not c._abandoned:
            self._delivered += c._book_size
            n_new += 1
            if newest is None or c._sent_time >= newest._sent_time:
                newest = c
        self._flight_size_decrease(c)
    return n_new, newest


__all__ = ["I_BIT", "ack_cumulative", "first_send", "spend", "take_new_chunks", "waits_after"]


def mark_lost(self: Any, chunk: Any) -> int:
    """Mark ``chunk`` for retransmission (or abandon it); returns the bytes taken out of flight."""
    was = chunk._book_size if chunk._in_flight else 0
    chunk._misses = 0
    if not self._maybe_abandon(chunk):
        chunk._retransmit = True
        self._rtx_pending = True
    self._flight_size_decrease(chunk)
    return int(was)
