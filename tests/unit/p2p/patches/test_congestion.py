"""Congestion controllers as pure state machines (engine/p2p/patches/congestion.py)."""

from __future__ import annotations

import pytest

from engine.p2p.patches import congestion

MTU = 1160


def test_unknown_controller_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown congestion controller 'vegas'"):
        congestion.make("vegas", MTU)


@pytest.mark.parametrize("name", sorted(congestion.CONTROLLERS))
def test_initial_window_is_ten_packets(name: str) -> None:
    assert congestion.make(name, MTU).cwnd == 10 * MTU


def test_cubic_slow_start_then_multiplicative_decrease() -> None:
    cc = congestion.Cubic(MTU)
    for _ in range(20):
        cc.on_ack(2 * MTU, 0.0, 0.05, 0.05, True, None, False)
    assert cc.cwnd == 50 * MTU
    cc.on_ack(2 * MTU, 0.0, 0.05, 0.05, False, None, False)  # not using its window: no growth
    assert cc.cwnd == 50 * MTU
    cc.on_congestion_event(1.0, cc.cwnd)
    assert cc.ssthresh == int(50 * MTU * 0.7)
    cc.on_recovery_exit(1.1)
    assert cc.cwnd == cc.ssthresh


def test_cubic_grows_back_to_w_max_around_k() -> None:
    """After a loss at W_max = 1000 packets the window regains W_max after K = cbrt(W_max*(1-b)/C) s."""
    cc = congestion.Cubic(MTU, 1000 * MTU)
    cc.ssthresh = 1000 * MTU
    cc.on_congestion_event(0.0, cc.cwnd)
    cc.on_recovery_exit(0.0)
    k = (1000 * 0.3 / 0.4) ** (1 / 3)  # about 9.1 s
    now, rtt = 0.0, 0.05
    while now < k - 1.0:
        cc.on_ack(cc.cwnd, now, rtt, rtt, True, None, False)  # one window acked per RTT
        now += rtt
    assert 900 * MTU < cc.cwnd < 1000 * MTU  # concave: close below W_max before K
    while now < k + 2.0:
        cc.on_ack(cc.cwnd, now, rtt, rtt, True, None, False)
        now += rtt
    assert cc.cwnd > 1000 * MTU  # convex: probing beyond W_max after K


def test_cubic_rto_collapses_to_one_packet() -> None:
    cc = congestion.Cubic(MTU, 40 * MTU)
    cc.on_rto(0.0)
    assert cc.cwnd == MTU and cc.ssthresh == pytest.approx(28 * MTU, abs=1)


def _feed_bbr(cc: congestion.BbrLite, rate: float, rtt: float, rounds: int, lost_per_round: int = 0) -> None:
    now = 0.0
    per_round = int(rate * rtt)
    for _ in range(rounds):
        cc.on_lost(lost_per_round)
        cc.on_ack(per_round, now, rtt, rtt, True, rate, True)
        now += rtt


def test_bbr_window_is_twice_the_bdp_and_paced() -> None:
    cc = congestion.BbrLite(MTU)
    _feed_bbr(cc, 4e6, 0.05, 30)  # 4 MB/s, 50 ms: BDP 200 kB
    assert cc.state == "probe_bw"
    assert 2 * 200_000 <= cc.cwnd <= 2 * 200_000 + 5 * MTU
    assert cc.pacing_rate is not None and 0.7 * 4e6 <= cc.pacing_rate <= 1.3 * 4e6


def test_bbr_ignores_light_random_loss_but_backs_off_on_heavy_loss() -> None:
    light = congestion.BbrLite(MTU)
    _feed_bbr(light, 4e6, 0.05, 60, lost_per_round=int(4e6 * 0.05 * 0.01))  # 1%
    assert light.cwnd >= 2 * 200_000
    heavy = congestion.BbrLite(MTU)
    _feed_bbr(heavy, 4e6, 0.05, 60, lost_per_round=int(4e6 * 0.05 * 0.10))  # 10%
    assert heavy.cwnd < 0.8 * 2 * 200_000


def test_bbr_pacing_never_starves_below_the_initial_window() -> None:
    cc = congestion.BbrLite(MTU)
    _feed_bbr(cc, 10.0, 0.05, 5)  # absurdly low samples (tiny messages at start-up)
    assert cc.pacing_rate is not None and cc.pacing_rate >= 10 * MTU / 0.05 / 3


def test_bbr_backs_off_when_its_queue_stands() -> None:
    """A bandwidth estimate inflated by bursty acks keeps a queue: SRTT far above the min RTT."""
    cc = congestion.BbrLite(MTU)
    now = 0.0
    for _ in range(60):
        cc.on_ack(int(4e6 * 0.05), now, 0.2, 0.05, True, 4e6, True)  # SRTT 200 ms, min RTT 50 ms
        now += 0.05
    assert cc.cwnd < 0.8 * 2 * 200_000


def _round(cc: congestion.BbrLite, now: float, rate: float, srtt: float, lost: int = 0) -> None:
    """One round of 50 ms at ``rate``: ``lost`` bytes lost, then the round's bytes acked."""
    cc.on_lost(lost)
    cc.on_ack(int(rate * 0.05), now, srtt, 0.05, True, rate, True)


def _breach(cc: congestion.BbrLite, now: float, srtt: float) -> float:
    """Rounds with 10% loss until the bound is cut; returns the time after them."""
    while cc.inflight_hi == float("inf"):
        _round(cc, now, 4e6, srtt, lost=int(4e6 * 0.05 * 0.1))
        now += 0.05
    return now


def test_bbr_holds_its_bound_after_a_full_queues_loss_then_probes_up_slowly() -> None:
    """Losses with a queue standing (a loss-based flow shares the bottleneck): the cut bound holds for
    seconds, as CUBIC's cycle does, then grows 1, 2, 4... packets per loss window."""
    cc = congestion.BbrLite(MTU)
    now = 0.0
    for _ in range(30):
        _round(cc, now, 4e6, 0.05)
        now += 0.05
    now = _breach(cc, now, srtt=0.08)  # SRTT 1.6x the min RTT: a queue
    cut = cc.inflight_hi
    assert cut < 0.8 * 2 * 200_000 + 5 * MTU
    for _ in range(int(congestion.BbrLite.PROBE_WAIT_S / 0.05) - 2):
        _round(cc, now, 4e6, 0.08)
        now += 0.05
    assert cc.inflight_hi == cut  # held
    assert cc.cwnd == pytest.approx(0.85 * cut, abs=1)  # 15% below: room for the other flow to grow
    steps = []
    while now < 10.0 and cc.inflight_hi != float("inf"):
        before = cc.inflight_hi
        _round(cc, now, 4e6, 0.08)
        now += 0.05
        if cc.inflight_hi != before and cc.inflight_hi != float("inf"):
            steps.append(round((cc.inflight_hi - before) / MTU))
    assert steps[:3] == [1, 2, 4]
    assert cc.inflight_hi == float("inf")  # in the end probed past 4x the BDP: unbounded again


def test_bbr_regrows_at_once_after_random_loss_on_an_empty_path() -> None:
    cc = congestion.BbrLite(MTU)
    now = 0.0
    for _ in range(30):
        _round(cc, now, 4e6, 0.05)
        now += 0.05
    now = _breach(cc, now, srtt=0.05)  # no queue: the losses were random
    cut = cc.inflight_hi
    for _ in range(4):
        _round(cc, now, 4e6, 0.05)
        now += 0.05
    assert cc.inflight_hi == float("inf") or cc.inflight_hi >= 1.25 * cut


def test_controller_state_for_traces() -> None:
    bbr = congestion.BbrLite(MTU)
    assert bbr.state_stats() == {"bbr_state": "startup", "btl_bw": 0, "inflight_hi": None}
    assert set(congestion.Cubic(MTU).state_stats()) == {"w_max"}


def test_bbr_cuts_once_for_the_losses_of_one_overfilled_queue() -> None:
    """The packets a probe sent into a full buffer are reported lost for a round or two after the cut;
    cutting again for each of those loss windows would take the bound well below the BDP."""
    cc = congestion.BbrLite(MTU)
    now = 0.0
    for _ in range(30):
        _round(cc, now, 4e6, 0.05)
        now += 0.05
    now = _breach(cc, now, srtt=0.08)
    cut = cc.inflight_hi
    for _ in range(2):  # a whole loss window of the same episode's losses, within 1.5 SRTT of the cut
        _round(cc, now, 4e6, 0.08, lost=int(4e6 * 0.05 * 0.1))
        now += 0.05
    assert cc.inflight_hi == cut
    for _ in range(10):  # still losing well after the cut settled: that is a new episode, cut again
        _round(cc, now, 4e6, 0.08, lost=int(4e6 * 0.05 * 0.1))
        now += 0.05
    assert cc.inflight_hi < cut
