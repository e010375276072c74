"""The swarm for a researcher's own model: the volunteers' experts as a layer in any ``torch.nn.Module``.

::

    from engine.swarm import Swarm

    with Swarm.join("https://coordinator.example", "shakespeare") as swarm:
        ffn = swarm.mixture("shakespeare_b1")          # an nn.Module over [tokens, dim]
        model = MyModel(ffn)                            # the researcher's own
        opt = swarm.optimizer(torch.optim.AdamW, model.parameters(), lr=3e-4)
        for x, y in batches:                            # the researcher's own loop
            loss = loss_fn(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        print(swarm.stats.line())

The login is ``lah train``'s (the token ``lah train login`` kept); the experiment (the coordinator's)
fixes the grids, the experts' width and type and the collaboration's target batch size; everything else
is the researcher's. Receipts credit the hosts that answered, spot checks recompute a few answers from
the answering host's own state, and the dense part steps with the experiment's other trainers when the
experiment says so, as for ``lah train``. docs/researchers.md is the guide; examples/ has two whole scripts.

Modules, bottom up (each imports only those below it, and engine.trainer, engine.collab, engine.moe,
engine.account (the trainer's login, the coordinator's client and its errors), engine.node (the data
dir's instance lock), engine.lm, engine.dht (its errors) and engine.p2p (identity, errors, and the
patches installed at join); never Qt, ``app/`` or ``coordinator/``)::

    errors       the exception tree below
    experiment   Experiment, Grid: what an experiment fixes, from the coordinator's JSON (pure),
                 and check_layer, which refuses a width, grid or expert type that does not fit,
                 before any call
    connect      the coordinator's address, the trainer's login and the experiment, in plain sentences
    layer        MixtureLayer: RemoteMixtureOfExperts with its input checked, any leading shape
    optimizer    SwarmOptimizer: the researcher's optimizer stepping with the others (engine.collab)
    stats        SwarmStats: calls answered/failed/late, bytes, hosts that served, receipts, spot checks
    session      Swarm: join, grids, mixture, optimizer, wait_for_experts, stats, flush, close

Exceptions (one tree; every message says what to do)::

    SwarmError
    ├── CoordinatorNotFound   not an http(s) URL; refused (nothing listens); unreachable (no such host,
    │                         no answer in time); something answered that is not a coordinator
    ├── LoginRequired         no trainer login for this coordinator, one no longer valid, not a trainer
    ├── UnknownExperiment     the coordinator runs no experiment of that name
    ├── UnknownGrid           the experiment offers no grid of that name
    ├── Mismatch              a layer, input or option that does not fit the experiment (a ValueError)
    └── JoinFailed            signaling or the DHT failed; another trainer holds the data dir

A step the swarm could not serve raises one of :data:`SKIPPABLE` (engine.moe's): a loop skips that
batch and goes on.

May import: engine.account, engine.collab, engine.dht, engine.lm, engine.moe, engine.node, engine.p2p,
    engine.trainer
"""

from __future__ import annotations

from engine.moe import ExpertCallFailed, NotEnoughExperts

from .errors import (
    CoordinatorNotFound,
    JoinFailed,
    LoginRequired,
    Mismatch,
    SwarmError,
    UnknownExperiment,
    UnknownGrid,
)
from .experiment import Experiment, Grid
from .layer import MixtureLayer
from .optimizer import SwarmOptimizer
from .session import Swarm
from .stats import SwarmStats

#: What a batch the swarm could not serve raises: skip it (``except SKIPPABLE: continue``).
SKIPPABLE = (ExpertCallFailed, NotEnoughExperts, TimeoutError)

__all__ = [
    "SKIPPABLE",
    "CoordinatorNotFound",
    "Experiment",
    "Grid",
    "JoinFailed",
    "LoginRequired",
    "Mismatch",
    "MixtureLayer",
    "Swarm",
    "SwarmError",
    "SwarmOptimizer",
    "SwarmStats",
    "UnknownExperiment",
    "UnknownGrid",
]
