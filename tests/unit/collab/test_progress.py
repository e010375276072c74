"""Progress records and the collaboration's state derived from them: pure, no network."""

import math

import pytest

from engine.collab.errors import BadProgress
from engine.collab.progress import (
    MAX_CLOCK_OFFSET_S,
    LocalProgress,
    ProgressView,
    Seen,
    clock_offset,
    decode_progress,
    derive_progress,
    encode_progress,
)
from engine.dht.records import Record, sign_record
from engine.p2p import Identity


def p(epoch: int = 0, samples: int = 0, sps: float = 0.0, time: float = 0.0, seq: int = 1) -> LocalProgress:
    return LocalProgress("run", epoch, samples, sps, time, seq)


def test_roundtrip_and_bad_values() -> None:
    value = p(2, 30, 4.5, 100.0, 7)
    assert decode_progress(encode_progress(value), "run") == value
    with pytest.raises(BadProgress, match="run"):
        decode_progress(encode_progress(value), "other")
    with pytest.raises(BadProgress, match="undecodable"):
        decode_progress(b"\x93garbage", "run")
    for bad in (p(samples=-1), p(sps=float("nan")), p(sps=-1.0), p(time=float("inf")), p(epoch=-3)):
        with pytest.raises(BadProgress):
            decode_progress(encode_progress(bad), "run")


def test_derive_epoch_samples_eta() -> None:
    peers = {
        "a": Seen(p(3, 100, 10.0), first_seen=0.0),
        "b": Seen(p(3, 50, 30.0), first_seen=1.0),
        "c": Seen(p(2, 999, 99.0), first_seen=1.0),  # behind: not counted towards epoch 3
    }
    got = derive_progress(peers, now=2.0, target=400)
    assert got.epoch == 3 and got.peers == 2
    assert got.samples == pytest.approx(100 + 10 * 2 + 50 + 30 * 1)
    assert got.samples_per_second == 40.0
    assert got.eta_s == pytest.approx((400 - 200) / 40)
    assert not got.ready
    assert derive_progress(peers, now=2.0, target=150).ready


def test_extrapolation_is_bounded_and_idle_eta_is_infinite() -> None:
    peers = {"a": Seen(p(0, 10, 1000.0), first_seen=0.0)}
    got = derive_progress(peers, now=10_000.0, target=10**9, max_extrapolation_s=30)
    assert got.samples == 10 + 1000 * 30
    assert derive_progress({"a": Seen(p(0, 10, 0.0), 0.0)}, 5.0, 100).eta_s == math.inf
    assert derive_progress({}, 0.0, 100).peers == 0
    with pytest.raises(ValueError):
        derive_progress({}, 0.0, 0)


def test_clock_skew_does_not_change_the_derived_state() -> None:
    # the writers' clocks differ by minutes; readers only use their own first-seen times
    honest = {"a": Seen(p(1, 10, 5.0, time=1000.0), 0.0), "b": Seen(p(1, 10, 5.0, time=1000.0), 0.0)}
    skewed = {
        "a": Seen(p(1, 10, 5.0, time=1000.0 - 300), 0.0),
        "b": Seen(p(1, 10, 5.0, time=1000.0 + 240), 0.0),
    }
    assert derive_progress(honest, 3.0, 100) == derive_progress(skewed, 3.0, 100)


def test_clock_offset_median_and_bound() -> None:
    peers = {
        "me": Seen(p(time=0.0), 0.0, 0.0),
        "a": Seen(p(time=180.0), 7.0, 0.0),
        "b": Seen(p(time=181.0), 7.0, 0.0),
        "c": Seen(p(time=-5000.0), 7.0, 0.0),
        "unknown": Seen(p(time=1e6), 7.0),  # no wall time noted: not used
    }
    assert clock_offset(peers, "me") == 180.0  # our clock is three minutes behind the majority
    assert clock_offset({"me": peers["me"]}, "me") == 0.0
    far = {"a": Seen(p(time=1e9), 0.0, 0.0)}
    assert clock_offset(far, "me") == MAX_CLOCK_OFFSET_S


def test_view_refuses_replays_and_conflicting_copies() -> None:
    view = ProgressView("run")
    assert view.offer("a", p(1, 10, seq=5), now=0.0)
    assert not view.offer("a", p(0, 99, seq=4), now=1.0)  # an older record served again
    assert view.replays == 1
    assert not view.offer("a", p(1, 11, seq=5), now=1.0)  # same seq, other content
    assert view.rejected == 1
    assert view.peers["a"].progress.samples == 10
    assert view.offer("a", p(1, 20, seq=6), now=2.0)
    assert view.peers["a"].first_seen == 2.0


def test_view_forgets_stale_writers_and_rejects_records_of_other_runs() -> None:
    view = ProgressView("run", stale_after_s=10.0)
    view.offer("a", p(seq=1), now=0.0)
    view.offer("b", p(seq=1), now=8.0)
    assert set(view.active(12.0)) == {"b"}
    view.forget_stale(100.0)
    assert not view.peers
    ident = Identity.generate()
    other_run = LocalProgress("other", 0, 1, 0.0, 0.0, 1)
    view.update([sign_record(ident, "run.progress", encode_progress(other_run), 1e12)], now=0.0)
    assert view.rejected == 1 and not view.peers


def test_one_peer_cannot_drag_the_collaboration_to_its_epoch() -> None:
    honest = {name: Seen(p(5, 10, 1.0), 0.0) for name in "abcd"}
    liar = {"evil": Seen(p(10**9, 10**6, 0.0), 0.0)}
    got = derive_progress({**honest, **liar}, 1.0, 100)
    assert got.epoch == 5 and got.peers == 4 and got.samples < 100
    # half the peers ahead by one (a step in progress) is a real epoch: the others will follow
    split = {"a": Seen(p(6, 0, 0.0), 0.0), "b": Seen(p(6, 0, 0.0), 0.0), "c": Seen(p(5, 9, 0.0), 0.0)}
    split["d"] = Seen(p(5, 9, 0.0), 0.0)
    assert derive_progress(split, 0.0, 100).epoch == 6
    # a newcomer at epoch 0 sees the others' epoch
    assert derive_progress({**honest, "new": Seen(p(0), 0.0)}, 0.0, 100).epoch == 5


def test_a_later_record_of_an_epoch_is_back_dated_but_an_epochs_first_is_not() -> None:
    owner = Identity.generate()
    view = ProgressView("run")

    def record(progress: LocalProgress) -> Record:
        return sign_record(owner, "run.progress", encode_progress(progress), 1e12)

    # the first record ever, and the first of a new epoch, were written after the writer's step,
    # which may be after our previous read: counted from now
    view.update([record(p(1, 8, 20.0, seq=1))], now=10.0, seen_at=9.0)
    assert view.peers[owner.peer_id].first_seen == 10.0
    # a later record of the same epoch was written at some point since our previous read
    view.update([record(p(1, 16, 20.0, seq=2))], now=11.0, seen_at=10.5)
    assert view.peers[owner.peer_id].first_seen == 10.5
    got = derive_progress(view.active(11.0), 11.0, target=64)
    assert got.samples == 16 + 20.0 * 0.5  # its progress since is extrapolated, not missed
    view.update([record(p(2, 8, 20.0, seq=3))], now=12.0, seen_at=11.5)
    assert view.peers[owner.peer_id].first_seen == 12.0
    view.update([record(p(2, 16, 20.0, seq=4))], now=13.0, seen_at=14.0)
    assert view.peers[owner.peer_id].first_seen == 13.0  # never in our future


def test_a_due_peer_closes_the_epoch_for_everyone() -> None:
    peers = {
        "a": Seen(LocalProgress("run", 2, 24, 0.0, 0.0, 1, due=True), 0.0),
        "b": Seen(LocalProgress("run", 2, 16, 0.0, 0.0, 1), 0.0),
        "old": Seen(LocalProgress("run", 1, 50, 0.0, 0.0, 1, due=True), 0.0),  # an earlier epoch's
    }
    got = derive_progress(peers, 0.1, 64)
    assert got.due == 1 and got.samples == 40 and got.ready
    peers["a"] = Seen(LocalProgress("run", 2, 24, 5.0, 0.0, 2), 0.0)
    assert not derive_progress(peers, 0.1, 64).ready
    assert decode_progress(encode_progress(peers["old"].progress), "run").due


def test_a_gone_peer_is_not_counted_until_it_shows_life_again() -> None:
    view = ProgressView("run", stale_after_s=30.0, revive_after_s=2.0)
    view.offer("a", p(1, 10, seq=1), now=0.0)
    view.offer("b", p(1, 10, seq=1), now=0.0)
    view.mark_gone("a", now=1.0)
    assert set(view.active(1.5)) == {"b"}
    # a record of its we had not seen, but arriving right after: it may predate its going
    view.offer("a", p(1, 18, seq=2), now=0.5, received=1.5)
    assert set(view.active(1.5)) == {"b"}
    view.offer("a", p(1, 26, seq=3), now=3.5)  # later: it is back
    assert set(view.active(3.5)) == {"a", "b"}
    view.mark_gone("b", now=4.0)
    view.forget_stale(4.0 + 4 * 30.0 + 1)
    assert not view.gone
