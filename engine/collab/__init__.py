"""Collaborative training (DeDLOC): many trainers train one dense model, stepping together.

Layers, bottom up (each imports only those below it)::

    errors       the package's exception tree (drawn there)
    progress     signed progress values, ProgressView (replays), derive_progress / clock_offset: pure
    partition    balance_parts: part sizes from bandwidths (the LP, in closed form): pure
    codec        lossy round trip of a chunk, ErrorFeedback: pure tensor functions
    memory       glibc's allocator told to return freed buffers (mmap threshold pinned, trim)
    group        Group (members, parts, compression) and its wire form
    reducer      PartReducer: one reducer's slice of one round (exclusion, stall watchdog)
    tracker      ProgressTracker: publish / read progress in the DHT
    allreduce    AllReduceService: collab.reduce served and called, chunked, windowed, bounded
    matchmaking  Matchmaker: DHT key per epoch, one leader freezes the group (collab.join)
    state        snapshots, StateDonor (collab.state_manifest / collab.state_part), download_state
    optimizer    CollaborativeOptimizer: accumulate, decide, match, all-reduce, step, share state

May import: engine.dht, engine.p2p, engine.wire
"""

from .allreduce import AllReduceConfig, AllReduceService, RoundReport
from .errors import (
    BadProgress,
    CollabError,
    CorruptPart,
    GroupClosed,
    MatchmakingFailed,
    PartRejected,
    StateDownloadFailed,
)
from .group import Group
from .matchmaking import Matchmaker, MatchmakingConfig
from .optimizer import CollabConfig, CollaborativeOptimizer, StepReport
from .partition import balance_parts, peer_traffic, round_time_bound
from .progress import CollabProgress, LocalProgress, ProgressView, derive_progress
from .state import StateDonor, download_state
from .tracker import ProgressTracker

__all__ = [
    "AllReduceConfig",
    "AllReduceService",
    "BadProgress",
    "CollabConfig",
    "CollabError",
    "CollabProgress",
    "CollaborativeOptimizer",
    "CorruptPart",
    "Group",
    "GroupClosed",
    "LocalProgress",
    "Matchmaker",
    "MatchmakingConfig",
    "MatchmakingFailed",
    "PartRejected",
    "ProgressTracker",
    "ProgressView",
    "RoundReport",
    "StateDonor",
    "StateDownloadFailed",
    "StepReport",
    "balance_parts",
    "derive_progress",
    "download_state",
    "peer_traffic",
    "round_time_bound",
]
