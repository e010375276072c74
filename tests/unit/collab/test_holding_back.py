"""Which epoch a batch counts towards: epochs land within half a batch of the target."""

import random

from engine.collab.stepping import holds_back


def test_a_batch_goes_where_it_leaves_the_epoch_closest_to_the_target() -> None:
    assert not holds_back(0, 8, 64)  # nothing yet: never hold back (a step on no samples is no step)
    assert not holds_back(56, 8, 64)  # lands exactly on the target
    assert not holds_back(60, 8, 64)  # 68 is as close as 60: take it
    assert holds_back(61, 8, 64)  # 69 is further from 64 than 61
    assert holds_back(64, 8, 64) and holds_back(100, 8, 64)  # the target is reached already
    assert holds_back(20, 100, 64) and not holds_back(10, 100, 64)  # 120 overshoots more than 20 falls short


def test_sequential_peers_never_miss_the_target_by_more_than_half_a_batch() -> None:
    rng = random.Random(0)
    for _ in range(500):
        target, total = rng.randint(20, 200), 0
        while True:
            b = rng.randint(1, 16)  # the batch that decides: held back, or the one that reaches the target
            if holds_back(total, b, target):
                break
            total += b
            if total >= target:
                break
        assert abs(total - target) <= b / 2
