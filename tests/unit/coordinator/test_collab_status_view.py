"""The pure parts of collaboration status: a trainer's last round's outcome, and the swarm page's view
of a collaboration derived from its trainers' reports."""

from __future__ import annotations

from coordinator.swarm.collab_status import TrainerStatus, collab_view
from engine.collab import RoundReport, StepReport
from engine.trainer.collab_status import round_outcome


def test_round_outcome_of_each_kind_of_step() -> None:
    ok = StepReport(4, 3, 64, RoundReport("r", 3, seconds=0.5))
    partial = StepReport(5, 3, 64, RoundReport("r", 3, seconds=0.9, failed_reducers={"x": "gone"}))
    timed_out = StepReport(6, 3, 64, RoundReport("r", 3, seconds=30.0, timed_out=True))
    local = StepReport(7, 1, 64, None, "nobody else was due")
    skipped = StepReport(7, 0, 0, None, "group closed")
    assert round_outcome([]) == ("none", None, None)
    assert round_outcome([ok]) == ("ok", 4, 0.5)
    assert round_outcome([ok, partial]) == ("partial", 5, 0.9)
    assert round_outcome([timed_out]) == ("timed_out", 6, 30.0)
    assert round_outcome([ok, local]) == ("local", 7, None)
    assert round_outcome([ok, skipped]) == ("ok", 4, 0.5)  # a skip says nothing of the last round
    assert round_outcome([skipped]) == ("skipped", None, None)


def trainer(
    peer: str, epoch: int, acc: int, rate: float, round_: tuple[int | None, float | None, str]
) -> TrainerStatus:
    return TrainerStatus(peer, 1, "a", epoch, acc, rate, 3, round_[0], round_[1], round_[2], 0.0)


def test_view_follows_the_majority_epoch_and_the_slowest_round() -> None:
    view = collab_view(
        "ffn",
        100,
        [
            trainer("a", 5, 30, 10.0, (5, 1.0, "ok")),
            trainer("b", 5, 40, 20.0, (5, 2.5, "ok")),
            trainer("c", 4, 90, 50.0, (4, 9.0, "timed_out")),  # behind: not in the epoch's progress
            trainer("d", 5, 10, 1.0, (5, None, "local")),
        ],
    )
    assert view.epoch == 5 and view.samples == 80 and view.samples_per_s == 31.0
    assert [t.peer_id for t in view.trainers] == ["c", "b", "a", "d"]
    assert (view.last_round_epoch, view.last_round_s, view.last_round_outcome) == (5, 2.5, "local")
    assert view.last_round_counts == {"ok": 2, "local": 1}
    assert view.progress == 0.8


def test_one_trainer_far_ahead_does_not_move_the_epoch() -> None:
    liar = trainer("z", 10_000, 10**9, 1e6, (10_000, 0.1, "ok"))
    honest = [trainer(p, 7, 10, 5.0, (7, 1.0, "ok")) for p in "abc"]
    view = collab_view("ffn", 100, [liar, *honest])
    assert view.epoch == 7 and view.samples == 30 and view.progress == 0.3
    assert (view.last_round_epoch, view.last_round_s, view.last_round_counts) == (7, 1.0, {"ok": 3})
    empty = collab_view("ffn", 100, [])
    assert (empty.trainers, empty.epoch, empty.last_round_outcome, empty.progress) == ([], 0, "none", 0.0)
