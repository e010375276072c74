"""The trainer: a model whose DMoE layer calls volunteers' experts, with receipts and spot checks.

::

    model.py             digits data (sklearn, bundled), DigitsDMoE (LocalMixtureOfExperts from engine.moe)
    receipts.py          receipt / spot-check signing (the coordinator's bytes), ReceiptBook (batches, kept in
                         an outbox on disk until the coordinator answers: nothing lost in an outage)
    spot_check.py        SpotChecker: a random fraction of forwards recomputed from the answering host's own
                         state at the version it stated (moe.state), compared row by row
    collab_status.py     CollabStatusReporter: a collaborative trainer's status reports to the coordinator
    trainer.py           TrainerConfig, Trainer (training loop, tqdm, accuracy), the remote and local models,
                         StepNotFinite (a step whose loss or gradients are not finite stops the run)
    node.py              TrainerNode, the swarm side: account, Peer, DHT client, finder, receipts, spot
                         checks; with target_batch_size, the dense part steps with other trainers
                         (engine.collab)
    lm.py                the language model (engine.lm) with one remote mixture per block, and its local twin
                         (imported as engine.trainer.lm: the digits trainer does not load engine.lm)

The coordinator's HTTP API is the engine's one client of it, ``engine.account.coordinator_api``
(its errors: ``engine.account.CoordinatorError`` and ``CoordinatorUnreachable``); the trainer uses that
client, its errors and the Credentials it returns, and nothing of the volunteer's ``engine.node``.

May import: engine.account, engine.collab, engine.dht, engine.lm, engine.moe, engine.p2p, engine.wire
"""

from .model import Digits, DigitsDMoE, LocalMixtureOfExperts, load_digits_split
from .node import TrainerNode
from .receipts import ReceiptBook, Work, sign_receipt, sign_spot_check
from .spot_check import SpotChecker
from .trainer import (
    StepNotFinite,
    Trainer,
    TrainerConfig,
    TrainStats,
    dense_digest,
    local_model,
    remote_model,
)

__all__ = [
    "Digits",
    "DigitsDMoE",
    "LocalMixtureOfExperts",
    "ReceiptBook",
    "SpotChecker",
    "StepNotFinite",
    "TrainStats",
    "Trainer",
    "TrainerConfig",
    "TrainerNode",
    "Work",
    "dense_digest",
    "load_digits_split",
    "local_model",
    "remote_model",
    "sign_receipt",
    "sign_spot_check",
]
