"""The collab package's one exception tree, and the counter every refusal goes through::

    CollabError
    ├── BadProgress          a progress record that is undecodable, forged, replayed or names another run
    ├── PartRejected         an all-reduce part of the wrong size, non-finite, from a non-member, or late
    │   └── WeightRefused    a weight that is not a number in [0, the round's bound] (the sender is excluded)
    ├── MatchmakingFailed    no group could be formed for an epoch (the peer steps alone and logs so)
    │   ├── GroupClosed      the others formed theirs without us: we skip the step and take their state
    │   └── GroupRefused     the leader's group breaks the share cap or the samples bound: not taken
    └── StateDownloadFailed  no donor could serve a verified copy of the collaboration's state
        ├── CorruptPart      one part did not match the hash the donors' signed records agree on
        ├── NoStateMajority  no state is vouched for by more than half of the donors (distinct peers)
        └── ManifestRefused  a manifest larger than this model's state can be, or not of this model

All-reduce itself never raises for a single peer's failure: a stalled or misbehaving sender is excluded,
a failed reducer's part falls back to the local values, and the round's report says which.

:class:`Refusals` is how a refusal of another peer's claim is told: logged with the sender (the peer
it came from) and counted by kind and by sender, so a node's status can show who was refused and why.
A refusal never raises past the component that made it: the honest members' round goes on.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field


class CollabError(Exception):
    """Base of everything the collab package raises."""


class BadProgress(CollabError):
    pass


class PartRejected(CollabError):
    pass


class WeightRefused(PartRejected):
    pass


class MatchmakingFailed(CollabError):
    pass


class GroupClosed(MatchmakingFailed):
    pass


class GroupRefused(MatchmakingFailed):
    pass


class StateDownloadFailed(CollabError):
    pass


class CorruptPart(StateDownloadFailed):
    pass


class NoStateMajority(StateDownloadFailed):
    pass


class ManifestRefused(StateDownloadFailed):
    pass


@dataclass
class Refusals:
    """Refusals of other peers' claims, by kind (the error's class name) and by sender."""

    by_kind: Counter[str] = field(default_factory=Counter)
    by_sender: Counter[str] = field(default_factory=Counter)

    def note(self, error: CollabError, sender: str, log: logging.Logger | None) -> None:
        """Count ``error`` against ``sender``; log it with the sender unless the caller logs it."""
        kind = type(error).__name__
        self.by_kind[kind] += 1
        self.by_sender[sender] += 1
        if log is not None:
            log.warning("refused (%s) from %s: %s", kind, sender, error)

    def total(self) -> int:
        return sum(self.by_kind.values())
