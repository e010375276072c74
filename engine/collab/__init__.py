"""Collaborative training (DeDLOC): many trainers train one dense model, stepping together.

Layers, bottom up (each imports only those below it)::

    errors       the package's exception tree (drawn there), Refusals (counted, logged with the sender)
    robust       what one member can sway: centered_clip (CenteredClip, its radius, iterations and
                 bound), bounded_weights, max_share (the share cap): pure tensor functions
    progress     signed progress values, ProgressView (replays), derive_progress / clock_offset (each
                 writer's samples capped at its share of the target): pure
    partition    balance_parts: part sizes from bandwidths (the LP, in closed form, under the share
                 cap): pure
    codec        lossy round trip of a chunk, ErrorFeedback: pure tensor functions
    memory       glibc's allocator told to return freed buffers (mmap threshold pinned, trim)
    stepping     holds_back (which epoch a batch counts towards), step_scale / scaled_learning_rate
                 (how far a step goes): pure
    snapshot     a model's state as a blob and its Manifest (take, check against this model's size,
                 load), StateRecord and choose_state (the state a majority of donors vouch for): pure
    group        Group (members, parts, compression) and its wire form
    reducer      PartReducer: one reducer's slice of one round (CenteredClip or the mean; exclusion,
                 bounded weights, stall watchdog)
    tracker      ProgressTracker: publish / read progress in the DHT
    allreduce    AllReduceService: collab.reduce served and called, chunked, windowed, bounded
    state_averaging  parameters and optimizer moments averaged through the all-reduce
    matchmaking  Matchmaker: DHT key per epoch, one leader freezes the group (collab.join);
                 freeze_group / check_group: the bounds on claims every member checks
    state        StateDonor (collab.state_manifest / collab.state_part) and download_state: the
                 majority's snapshot fetched in parts from every donor of it, each part hash-checked
    optimizer    CollaborativeOptimizer: accumulate, decide, match, all-reduce, step, share state

Byzantine members (issue 28, items 1 and 2): claims are bounded by what others can check (weights,
bandwidth shares, progress, state), and every part is combined with CenteredClip. Not built: checking
that a reducer answers what it computed, accusations and bans, replayable batches.

May import: engine.dht, engine.p2p, engine.wire
"""

from .allreduce import AllReduceConfig, AllReduceService, RoundReport
from .errors import (
    BadProgress,
    CollabError,
    CorruptPart,
    GroupClosed,
    GroupRefused,
    ManifestRefused,
    MatchmakingFailed,
    NoStateMajority,
    PartRejected,
    Refusals,
    StateDownloadFailed,
    WeightRefused,
)
from .group import Group
from .matchmaking import Matchmaker, MatchmakingConfig
from .optimizer import CollabConfig, CollaborativeOptimizer, StepReport
from .partition import balance_parts, peer_traffic, round_time_bound
from .progress import CollabProgress, LocalProgress, ProgressView, derive_progress
from .robust import CenteredClipConfig, bounded_weights, centered_clip, max_share
from .state import StateDonor, download_state
from .tracker import ProgressTracker

__all__ = [
    "AllReduceConfig",
    "AllReduceService",
    "BadProgress",
    "CenteredClipConfig",
    "CollabConfig",
    "CollabError",
    "CollabProgress",
    "CollaborativeOptimizer",
    "CorruptPart",
    "Group",
    "GroupClosed",
    "GroupRefused",
    "LocalProgress",
    "ManifestRefused",
    "Matchmaker",
    "MatchmakingConfig",
    "MatchmakingFailed",
    "NoStateMajority",
    "PartRejected",
    "ProgressTracker",
    "ProgressView",
    "Refusals",
    "RoundReport",
    "StateDonor",
    "StateDownloadFailed",
    "StepReport",
    "WeightRefused",
    "balance_parts",
    "bounded_weights",
    "centered_clip",
    "derive_progress",
    "download_state",
    "max_share",
    "peer_traffic",
    "round_time_bound",
]
