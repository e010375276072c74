"""Decentralized mixture-of-experts: hosting experts and calling them over the p2p transport.

Layers, bottom up (each imports only those below it; besides engine.p2p and engine.wire, checkpoint
uses engine.files and dht_finder engine.dht; nothing here imports Qt, app/ or coordinator/)::

    errors.py        the exception tree below
    stage.py         StageExpert: depth causal transformer blocks over [batch, seq, d] (a sample is one
                     sequence); its parameters, FLOPs and activation bytes as pure functions
    low_rank.py      LowRankExpert / LowRankBoundary: a d -> r -> d bottleneck at the expert boundary, so
                     calls carry r numbers a token (ExpertSpec.wire_rank)
    registry.py      ExpertSpec + built-in architectures (ffn, transformer, stage): the only code a host runs
    stage_fit.py     the memory a stage plans for; the deepest stage a budget holds; the host's refusal
    checkpoint.py    safetensors checkpoints, written atomically, newest valid one loaded
    cache.py         ActivationCache: forward inputs and graphs kept (LRU + TTL, byte budget) for backward
    graphs.py        KeptGraph: a forward batch's autograd graph, and the backward over kept and recomputed
    dispatch.py      Dispatcher: every batch that is ready goes to the device's worker in one hand-over
    batching.py      TaskPool: requests merged into batches on one worker thread per device
    fused.py         many experts' backward batches as one autograd call and one Adam pass (each expert
                     still takes its own step)
    guard.py         GuardConfig, NormBound, ShareWindow, JumpDetector: bounds on what bad trainers
                     can do to an expert (pure policy)
    probe.py         Probe: an expert's outputs on recent inputs, its last good state, the rollback
    backend.py       ExpertBackend: module + Adam + input checks + guards + forward/backward pools
    weights.py       an expert's weights as a host reports them: the registry's order, one sha256 both ends
                     compute (weights_digest), the layout a spec's module has (state_layout)
    server.py        ExpertServer: moe.forward / moe.backward / moe.info / moe.state handlers, stats,
                     checkpoints
    loop_thread.py   LoopThread: an asyncio loop on a thread, for synchronous torch code
    client.py        RemoteExpert: nn.Module + autograd.Function calling one hosted expert
    host_call.py     forward_many / backward_many: one batch's requests to many hosts, answers as they come
    beam.py          beam_search over the grid for a whole batch as tensor ops; plan_calls groups choices
    gather.py        fetch_state / gather_experts: every replica's weights (moe.state), checked against the
                     spec, one taken per expert (most update steps); expert_hosts: a grid's hosts
    dht_finder.py    DHTExpertFinder: beam search over DHT prefix lookups (engine.dht), TTL cache,
                     assigned hosts only where the coordinator's key is known
    layer_calls.py   ExpertCalls: one layer's requests to its chosen experts, one per host, k_min + grace;
                     CallRecord, what the layer's observer is told of each
    mixture.py       RemoteMixtureOfExperts: grid gating, k calls, k_min + grace, renormalised softmax;
                     ExpertFinder protocol + StaticExpertFinder
    local.py         LocalMixtureOfExperts: the same gating with every expert in process (the baseline)

The host side (registry → backend → server) runs on the node's event loop with compute on worker threads;
the trainer side (loop_thread → client) lets synchronous autograd call into the Peer's loop.

Exceptions (one tree)::

    MoEError
    ├── SpecError              unknown architecture or impossible sizes (also a ValueError)
    │   └── StageTooLarge      a stage over the host's memory budget (stage_fit.py; says what would fit)
    ├── CheckpointError        a checkpoint file that cannot be read or does not fit its expert
    ├── ExpertRequestError     a request the host refuses; ``code`` goes back as RemoteError.code
    │   ├── BadInput           "bad_input": wrong shape, dtype, non-finite values, bad activation id
    │   ├── UnknownExpert      "unknown_expert": no such uid on this host
    │   ├── InputsEvicted      "inputs_evicted": backward's inputs are gone; the trainer re-sends them
    │   ├── GradientTooLarge   "grad_too_large": a backward over the expert's bound on recent sizes
    │   ├── OverShare          "over_share": a trainer over its share of the expert's recent updates
    │   └── ExpertUnavailable  "unavailable": the host is shutting down
    └── ExpertCallFailed       trainer side: a remote call failed (``code``: the host's, or "timeout",
        │                      "connection", "bad_reply")
        ├── NotEnoughExperts   fewer than k_min experts answered a mixture layer in time
        └── BadExpertState     "bad_state": weights whose digest, names, dtypes or shapes do not check
                               out (``reason`` says which), or non-finite ones

May import: engine.dht, engine.files, engine.p2p, engine.wire
"""

from __future__ import annotations

from .backend import ALLOWED_DTYPES, BackendStats, ExpertBackend, default_device
from .cache import ActivationCache
from .checkpoint import Checkpoint, CheckpointStore, restore_state, snapshot_state
from .client import RemoteExpert, new_activation_id
from .errors import (
    BadExpertState,
    BadInput,
    CheckpointError,
    ExpertCallFailed,
    ExpertRequestError,
    ExpertUnavailable,
    GradientTooLarge,
    InputsEvicted,
    MoEError,
    NotEnoughExperts,
    OverShare,
    SpecError,
    UnknownExpert,
)
from .guard import GuardConfig
from .local import LocalMixtureOfExperts
from .loop_thread import LoopThread
from .low_rank import LowRankBoundary, LowRankExpert
from .mixture import ExpertFinder, RemoteMixtureOfExperts, StaticExpertFinder
from .registry import ARCHITECTURES, Architecture, ExpertSpec, build, input_shape, register
from .server import UID_PATTERN, ExpertServer
from .stage_fit import StageTooLarge, check_host_fits, check_stage_fits, largest_stage

__all__ = [
    "ALLOWED_DTYPES",
    "ARCHITECTURES",
    "UID_PATTERN",
    "ActivationCache",
    "Architecture",
    "BackendStats",
    "BadExpertState",
    "BadInput",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "ExpertBackend",
    "ExpertCallFailed",
    "ExpertFinder",
    "ExpertRequestError",
    "ExpertServer",
    "ExpertSpec",
    "ExpertUnavailable",
    "GradientTooLarge",
    "GuardConfig",
    "InputsEvicted",
    "LocalMixtureOfExperts",
    "LoopThread",
    "LowRankBoundary",
    "LowRankExpert",
    "MoEError",
    "NotEnoughExperts",
    "OverShare",
    "RemoteExpert",
    "RemoteMixtureOfExperts",
    "SpecError",
    "StageTooLarge",
    "StaticExpertFinder",
    "UnknownExpert",
    "build",
    "check_host_fits",
    "check_stage_fits",
    "default_device",
    "input_shape",
    "largest_stage",
    "new_activation_id",
    "register",
    "restore_state",
    "snapshot_state",
]
