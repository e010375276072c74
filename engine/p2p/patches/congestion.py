"""Congestion controllers for the SCTP sender: pure state machines, no I/O, no aiortc.

The sender (:mod:`.sctp_sender`) tells a controller what happened (bytes delivered with an RTT and a
delivery-rate sample, a loss event, its end, an RTO) and reads back ``cwnd`` (bytes that may be in
flight), ``ssthresh`` (the target while recovering) and ``pacing_rate`` (bytes/s, or None: ack-clocked).
Nothing here is visible on the wire: any controller interoperates with every SCTP peer.

- :class:`Cubic`: RFC 9438 (TCP's default on Linux), with its Reno-friendly region and fast convergence.
- :class:`BbrLite`: BBR-style: the bottleneck rate (max filter over 10 rounds) and the min RTT set the
  pacing rate and an in-flight cap of 2x the BDP; unlike BBRv1 it also cuts an in-flight bound when
  more than :data:`BbrLite.LOSS_THRESH` of the bytes of a loss window (256 packets or more) are
  lost, or when the smoothed RTT exceeds 3x the min RTT (a bandwidth estimate inflated by a receiver
  that acks in bursts), so it does not flatten a home uplink that a loss-based flow shares. When the
  losses came with a queue standing (SRTT above 1.25 min RTTs: a loss-based flow filled the buffer),
  the bound is held 4-6 s with 15% headroom below it (BBRv2's cruise) and then probed up by 1, 2,
  4... packets per loss window, as BBRv2's PROBE_UP does; regrowing within a few RTTs took 85% of a
  shared bottleneck from one TCP CUBIC flow, and a 3-4 s hold without headroom still 0.75. One cut
  answers one episode: losses reported within 1.5 SRTTs of a cut do not cut again. After random loss
  on an empty path it regrows at once. (No PROBE_RTT phase: the min RTT simply expires after 10 s.)
"""

from __future__ import annotations

import random
from collections import deque
from typing import Protocol

INITIAL_WINDOW_PACKETS = 10  # RFC 6928 / Chromium dcSCTP; RFC 9260 allows 4


class Controller(Protocol):
    name: str
    model_based: bool  # True: fed every ack, recovery included (its model, not loss, sets the window)
    cwnd: int
    ssthresh: int
    pacing_rate: float | None

    def on_ack(
        self,
        acked: int,
        now: float,
        srtt: float | None,
        min_rtt: float | None,
        cwnd_limited: bool,
        rate: float | None,
        new_round: bool,
    ) -> None: ...

    def on_congestion_event(self, now: float, flight: int) -> None: ...

    def on_recovery_exit(self, now: float) -> None: ...

    def on_lost(self, lost: int) -> None: ...

    def on_rto(self, now: float) -> None: ...

    def state_stats(self) -> dict[str, object]: ...


class Cubic:
    """RFC 9438, in segments of ``mtu`` bytes internally, bytes outside."""

    name = "cubic"
    model_based = False
    C = 0.4
    BETA = 0.7
    ALPHA = 3 * (1 - BETA) / (1 + BETA)

    def __init__(self, mtu: int, cwnd: int | None = None) -> None:
        self.mtu = mtu
        self.cwnd = cwnd or INITIAL_WINDOW_PACKETS * mtu
        self.ssthresh = 1 << 30
        self.pacing_rate: float | None = None
        self.w_max = 0.0
        self.k = 0.0
        self.epoch: float | None = None
        self.w_est = 0.0

    def _seg(self) -> float:
        return self.cwnd / self.mtu

    def on_ack(
        self,
        acked: int,
        now: float,
        srtt: float | None,
        min_rtt: float | None,
        cwnd_limited: bool,
        rate: float | None,
        new_round: bool,
    ) -> None:
        if not cwnd_limited or acked <= 0:
            return
        if self.cwnd < self.ssthresh:  # slow start, byte counting (RFC 3465, L = 4 packets)
            self.cwnd += min(acked, 4 * self.mtu)
            return
        cwnd = self._seg()
        if self.epoch is None:
            self.epoch = now
            if cwnd < self.w_max:
                self.k = ((self.w_max - cwnd) / self.C) ** (1 / 3)
            else:
                self.k, self.w_max = 0.0, cwnd
            self.w_est = cwnd
        t = now - self.epoch
        rtt = srtt or 0.1
        target = self.C * (t + rtt - self.k) ** 3 + self.w_max
        target = min(max(target, cwnd), 1.5 * cwnd)
        acked_seg = acked / self.mtu
        self.w_est += self.ALPHA * acked_seg / cwnd
        if self.C * (t - self.k) ** 3 + self.w_max < self.w_est:  # Reno-friendly region
            new = max(cwnd, self.w_est)
        else:
            new = cwnd + (target - cwnd) / cwnd * acked_seg
        self.cwnd = max(int(new * self.mtu), 2 * self.mtu)

    def on_congestion_event(self, now: float, flight: int) -> None:
        cwnd = self._seg()
        self.w_max = cwnd * (1 + self.BETA) / 2 if cwnd < self.w_max else cwnd  # fast convergence
        self.ssthresh = max(int(self.cwnd * self.BETA), 2 * self.mtu)
        self.epoch = None

    def on_recovery_exit(self, now: float) -> None:
        self.cwnd = max(self.ssthresh, 2 * self.mtu)

    def on_lost(self, lost: int) -> None:
        pass

    def on_rto(self, now: float) -> None:
        self.on_congestion_event(now, self.cwnd)
        self.cwnd = self.mtu

    def state_stats(self) -> dict[str, object]:
        return {"w_max": round(self.w_max * self.mtu)}


class BbrLite:
    """Delivery rate x min RTT, paced; 2x BDP in flight; an in-flight bound cut on heavy loss."""

    name = "bbr"
    model_based = True
    STARTUP_GAIN = 2.885
    CWND_GAIN = 2.0
    CYCLE = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    BW_WINDOW_ROUNDS = 10
    MIN_RTT_WINDOW_S = 10.0
    LOSS_THRESH = 0.02  # of the bytes sent in a loss window: above it, the in-flight bound is cut (BBRv2)
    QUEUE_RTT_FACTOR = 3.0  # SRTT this many min RTTs: a standing queue 2x BDP cannot explain
    QUEUE_MIN_S = 0.02
    LOSS_WINDOW_PACKETS = 256  # packets per loss-rate estimate (a 40-packet round is too noisy)
    BETA = 0.7
    # After a cut with a queue standing (a shared bottleneck: a loss-based flow filled it), the bound is
    # held this long (plus up to PROBE_WAIT_JITTER_S, random, so flows do not probe in step) before it
    # probes up by 1, 2, 4... packets per loss window (BBRv2's PROBE_UP): CUBIC's own cycle is seconds,
    # and regrowing within a few RTTs took 85% of a bottleneck from one TCP CUBIC flow; a 3-4 s wait
    # still left it 0.75 of a 4 MB/s one, 4-6 s with the headroom below 0.54 (benchmarks/wan.py, 3
    # runs each, idle box). BBRv2 likewise waits up to 63 rounds (Reno's time to regrow) to probe.
    PROBE_WAIT_S = 4.0
    PROBE_WAIT_JITTER_S = 2.0
    QUEUE_LOSS_RTT_FACTOR = 1.25  # SRTT above this many min RTTs at a loss: the loss came from a queue
    # While the bound is held after a queue's loss, in flight stays this far below it (BBRv2's cruise
    # headroom, 15%): room for the loss-based flow to grow back into before the next probe.
    HEADROOM = 0.15
    # A probe that overfilled the buffer loses packets for a round or two after the cut (they were sent
    # before it): one cut answers them, as BBRv2 cuts once per probe. Cutting again for each loss
    # window of the same episode took the bound below the BDP (0.7^2 of the peak).
    CUT_SETTLE_RTTS = 1.5
    PACING_MIN_RTT = 0.005
    LAN_MIN_PACKETS = 128

    def __init__(self, mtu: int, cwnd: int | None = None) -> None:
        self.mtu = mtu
        self.cwnd = cwnd or INITIAL_WINDOW_PACKETS * mtu
        self.ssthresh = 1 << 30
        self.pacing_rate: float | None = None
        self.state = "startup"
        self.bw_samples: deque[float] = deque(maxlen=self.BW_WINDOW_ROUNDS)  # max rate per round
        self.window_max = 0.0  # max(bw_samples), kept as rounds end: btl_bw is read twice per SACK
        self.round_max = 0.0
        self.full_bw = 0.0
        self.full_bw_rounds = 0
        self.min_rtt: float | None = None
        self.min_rtt_at = 0.0
        self.cycle_index = 0
        self.cycle_at = 0.0
        self.inflight_hi = float("inf")
        self.probe_up_at = 0.0
        self.probe_up_step = 1
        self.cut_settles_at = 0.0
        self.queue_loss = False
        self._rng = random.Random()
        self.round_lost = 0
        self.round_delivered = 0
        self.srtt: float | None = None

    @property
    def btl_bw(self) -> float:
        w, r = self.window_max, self.round_max
        return w if w > r else r

    def _bdp(self) -> float:
        return self.btl_bw * (self.min_rtt or 0.0)

    def on_ack(
        self,
        acked: int,
        now: float,
        srtt: float | None,
        min_rtt: float | None,
        cwnd_limited: bool,
        rate: float | None,
        new_round: bool,
    ) -> None:
        if min_rtt is not None and (
            self.min_rtt is None or min_rtt <= self.min_rtt or now - self.min_rtt_at > self.MIN_RTT_WINDOW_S
        ):
            self.min_rtt, self.min_rtt_at = min_rtt, now
        if rate is not None and rate > self.round_max:
            self.round_max = rate
        self.round_delivered += acked
        self.srtt = srtt
        if new_round:
            self._end_round(now)
        bw, bdp = self.btl_bw, self._bdp()
        state = self.state
        if state == "startup":
            gain = self.STARTUP_GAIN
        elif state == "drain":
            gain = 1 / self.STARTUP_GAIN
        else:
            gain = self.CYCLE[self.cycle_index]
        if self.state == "drain" and new_round:  # the queue start-up built drains within a round
            self.state, self.cycle_at = "probe_bw", now
        if self.state == "probe_bw" and self.min_rtt and now - self.cycle_at > self.min_rtt:
            self.cycle_index = (self.cycle_index + 1) % len(self.CYCLE)
            self.cycle_at = now
        if self.min_rtt:  # never below the initial window per RTT (tiny samples at start-up)
            bw = max(bw, INITIAL_WINDOW_PACKETS * self.mtu / self.min_rtt)
        # Pacing costs timers and smaller sends; below a few ms of RTT (loopback, LAN) the window alone
        # keeps the queue short, so the sender goes ack-clocked there.
        paced = bw and self.min_rtt is not None and self.min_rtt >= self.PACING_MIN_RTT
        self.pacing_rate = gain * bw if paced else None
        if self.state == "startup":
            if cwnd_limited:
                self.cwnd += acked  # doubles per round, like slow start
            if bdp:
                self.cwnd = min(self.cwnd, int(self.STARTUP_GAIN * bdp) + 4 * self.mtu)
        elif bdp:
            self.cwnd = int(self.CWND_GAIN * bdp) + 4 * self.mtu
        bound = self.inflight_hi
        if self.queue_loss and now < self.probe_up_at:
            bound *= 1 - self.HEADROOM
        self.cwnd = max(4 * self.mtu, int(min(self.cwnd, bound)))
        if self.min_rtt is not None and self.min_rtt < self.PACING_MIN_RTT and self.state != "startup":
            # Loopback or LAN: the BDP is a few packets, so the window would be host scheduling's
            # ping-pong; a floor keeps sends batched (no home uplink to flatten here).
            self.cwnd = max(self.cwnd, self.LAN_MIN_PACKETS * self.mtu)
        self.ssthresh = self.cwnd

    def _end_round(self, now: float) -> None:
        self.bw_samples.append(self.round_max)
        self.window_max = max(self.bw_samples)
        lost, delivered = self.round_lost, self.round_delivered
        self.round_max, self.round_lost, self.round_delivered = 0.0, 0, 0
        if lost + delivered < self.LOSS_WINDOW_PACKETS * self.mtu:
            self.round_lost, self.round_delivered = lost, delivered  # keep counting
        elif now < self.cut_settles_at:
            pass  # losses of packets sent before the last cut: that cut already answered them
        elif lost > self.LOSS_THRESH * (lost + delivered) or self._queue_standing():
            self.inflight_hi = max(self.cwnd * self.BETA, 4 * self.mtu)
            self.cut_settles_at = now + self.CUT_SETTLE_RTTS * (self.srtt or self.min_rtt or 0.0)
            self.probe_up_step = 1
            self.probe_up_at = now
            self.queue_loss = self._queued()
            if self.queue_loss:
                self.probe_up_at += self.PROBE_WAIT_S + self._rng.uniform(0, self.PROBE_WAIT_JITTER_S)
            if self.state == "startup":
                self.state = "drain"
        elif self.inflight_hi != float("inf") and now >= self.probe_up_at:
            if self.queue_loss:  # after a queue's loss: 1, 2, 4... packets per clean loss window
                self.inflight_hi += self.probe_up_step * self.mtu
                self.probe_up_step *= 2
            else:  # random loss on an empty path: regrow at once
                self.inflight_hi *= 1.25
            if self.inflight_hi > 4 * max(self._bdp(), self.mtu):
                self.inflight_hi = float("inf")
        if self.state == "startup":
            bw = self.btl_bw
            if bw > self.full_bw * 1.25:
                self.full_bw, self.full_bw_rounds = bw, 0
            else:
                self.full_bw_rounds += 1
                if self.full_bw_rounds >= 3:
                    self.state = "drain"

    def _queued(self) -> bool:
        """A queue stood when the loss window ended: its losses were a full buffer's, not random."""
        return bool(self.srtt and self.min_rtt and self.srtt > self.QUEUE_LOSS_RTT_FACTOR * self.min_rtt)

    def _queue_standing(self) -> bool:
        """The bandwidth estimate is too high (a CPU-starved receiver acking in bursts): the queue it
        builds shows in the RTT long before the receiver's socket overflows."""
        if not self.srtt or not self.min_rtt:
            return False
        queue = self.srtt - self.min_rtt  # more than scheduling noise (loopback: 0.2 vs 2 ms) too
        return self.srtt > self.QUEUE_RTT_FACTOR * self.min_rtt and queue > self.QUEUE_MIN_S

    def on_congestion_event(self, now: float, flight: int) -> None:
        self.ssthresh = self.cwnd  # no blind cut: the loss rate decides (see _end_round)

    def on_recovery_exit(self, now: float) -> None:
        pass

    def on_lost(self, lost: int) -> None:
        self.round_lost += lost

    def on_rto(self, now: float) -> None:
        self.inflight_hi = max(self.cwnd * self.BETA, 4 * self.mtu)
        self.cwnd = 4 * self.mtu
        self.ssthresh = self.cwnd

    def state_stats(self) -> dict[str, object]:
        """What the model believes, for traces (benchmarks/wan.py --trace) and link stats."""
        hi = self.inflight_hi
        return {
            "bbr_state": self.state,
            "btl_bw": round(self.btl_bw),
            "inflight_hi": None if hi == float("inf") else round(hi),
        }


CONTROLLERS: dict[str, type[Cubic] | type[BbrLite]] = {"cubic": Cubic, "bbr": BbrLite}


def make(name: str, mtu: int, cwnd: int | None = None) -> Controller:
    try:
        return CONTROLLERS[name](mtu, cwnd)
    except KeyError:
        raise ValueError(f"unknown congestion controller {name!r}; known: {sorted(CONTROLLERS)}") from None
