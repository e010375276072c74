"""The node's status sums its experts' guard counters (engine.moe.guard) under ``trainers_refused``."""

from pathlib import Path

from engine.account import MemoryTokenStore
from engine.node import Volunteer
from engine.node.status import guard_counts
from engine.p2p import Identity
from engine.resources import Settings


def test_guard_counts_sum_every_expert_and_ignore_other_stats() -> None:
    experts = [
        {"grad_refused": 3, "share_refused": 1, "grad_clipped": 7, "rollbacks": 0, "steps": 99},
        {"grad_refused": 2, "share_refused": 0, "rollbacks": 1},
        {"steps": 5},  # an expert from before the guards: nothing to add
    ]
    assert guard_counts(experts) == {"grad_too_large": 5, "over_share": 1, "clipped": 7, "rollbacks": 1}
    assert guard_counts([]) == {"grad_too_large": 0, "over_share": 0, "clipped": 0, "rollbacks": 0}


def test_a_node_that_hosts_nothing_shows_zeros(tmp_path: Path) -> None:
    v = Volunteer(
        Identity.generate(), "http://127.0.0.1:9", MemoryTokenStore(), Settings(use_gpu=False), tmp_path
    )
    zeros = {"grad_too_large": 0, "over_share": 0, "clipped": 0, "rollbacks": 0}
    assert v.status()["trainers_refused"] == zeros
