"""The collab package's one exception tree::

    CollabError
    ├── BadProgress          a progress record that is undecodable, forged, replayed or names another run
    ├── PartRejected         an all-reduce part of the wrong size, non-finite, from a non-member, or late
    ├── MatchmakingFailed    no group could be formed for an epoch (the peer steps alone and logs so)
    │   └── GroupClosed      the others formed theirs without us: we skip the step and take their state
    └── StateDownloadFailed  no donor could serve a verified copy of the collaboration's state
        └── CorruptPart      one part did not match the hash the donors' signed records agree on

All-reduce itself never raises for a single peer's failure: a stalled or misbehaving sender is excluded,
a failed reducer's part falls back to the local values, and the round's report says which.
"""

from __future__ import annotations


class CollabError(Exception):
    """Base of everything the collab package raises."""


class BadProgress(CollabError):
    pass


class PartRejected(CollabError):
    pass


class MatchmakingFailed(CollabError):
    pass


class GroupClosed(MatchmakingFailed):
    pass


class StateDownloadFailed(CollabError):
    pass


class CorruptPart(StateDownloadFailed):
    pass
