"""Where ``lah train`` keeps the trainer account's token: :mod:`engine.account.trainer_tokens`.

The store lives in the engine so that a researcher's own script (:mod:`engine.swarm`) finds the token
``lah train login`` kept; this module is the name ``lah`` and its tests import it by.
"""

from __future__ import annotations

from engine.account.trainer_tokens import (
    KEYRING_SERVICE,
    START_REFRESH_S,
    TOKEN_FILE,
    TrainerCredentials,
    default_trainer_dir,
    fresh,
    token_key,
)

__all__ = [
    "KEYRING_SERVICE",
    "START_REFRESH_S",
    "TOKEN_FILE",
    "TrainerCredentials",
    "default_trainer_dir",
    "fresh",
    "token_key",
]
