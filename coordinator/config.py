"""The coordinator's configuration: a TOML file, then ``LAH_*`` environment variables on top.

Experiments are defined here (expert type from the engine's registry, grid shape, hyperparameters):
no code travels to volunteers, only names and numbers.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any

import msgspec

Positive = Annotated[int, msgspec.Meta(gt=0)]


class DenseModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The dense part every trainer of the experiment builds (``lah train``): input and output sizes
    around the mixture (whose width is the experts' ``d_model``), the gating's top-k, each trainer's
    batch and learning rate, and the data set (by name: no data travels through the coordinator)."""

    in_features: Positive = 64
    classes: Positive = 10
    k_best: Positive = 4
    batch_size: Positive = 64  # one trainer's batch; the collaboration steps on target_batch_size
    lr: Annotated[float, msgspec.Meta(gt=0)] = 3e-3
    dataset: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "digits"


class ExperimentConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    expert_type: str  # a name in engine.moe.registry
    grid: list[int]  # e.g. [4, 4]: uids "<name>.i.j"
    hyperparams: dict[str, float | int | str] = {}
    replication: int = 2  # every expert hosted by at least this many hosts
    expert_cost: float = 1.0  # credit per sample served (forward; backward counts double)
    # Trainers of this experiment train the dense part together (engine.collab), stepping once the
    # collaboration has processed this many samples; 0: each trainer trains alone.
    target_batch_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    dense: DenseModel = DenseModel()


class TurnSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    urls: list[str]
    secret: str
    ttl_s: int = 3600


class CoordinatorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8470
    database_url: str | None = None  # None: SQLite in the user data dir
    public_url: str | None = None  # how pages link to themselves
    token_ttl_s: int = 24 * 3600
    token_key_path: str | None = None  # Ed25519 key that signs tokens; None: in the user data dir
    allowlist_mode: bool = False
    stun_urls: list[str] = []
    turn: TurnSection | None = None
    bootstrap_peers: int = 8  # how many online peers to hand a newcomer for the DHT
    assignment_ttl_s: int = 3600
    verify_workers: int | None = None  # processes checking receipt signatures; None: one per core
    max_ws_per_ip: int = 64
    register_per_ip_per_minute: int = 30
    # Addresses (or CIDR networks) of reverse proxies whose X-Forwarded-For is believed; empty: none.
    trusted_proxies: list[str] = []
    offers_per_minute: int = 120  # signaling offers relayed per sender (after a burst of offer_burst)
    offer_burst: int = 64
    receipts_per_account_per_minute: int = 60_000  # receipts (and batches) a trainer account may post
    max_receipt_credit: float = 10_000.0  # credit one receipt may carry; more is refused
    invite_ttl_s: int = 14 * 86400  # how long an invitation code stays valid
    exports_dir: str | None = None  # the site's daily dumps; None: "exports" in the user data dir
    experiments: list[ExperimentConfig] = []


class ConfigError(ValueError):
    pass


ENV_PREFIX = "LAH_"
_ENV_FIELDS = {
    "host": str,
    "port": int,
    "database_url": str,
    "public_url": str,
    "token_ttl_s": int,
    "allowlist_mode": lambda v: v.lower() in ("1", "true", "yes"),
    "trusted_proxies": lambda v: [p.strip() for p in v.split(",") if p.strip()],
    "exports_dir": str,
}


def load_config(path: Path | None = None, environ: dict[str, str] | None = None) -> CoordinatorConfig:
    """File values, then ``LAH_HOST``, ``LAH_PORT``, ``LAH_DATABASE_URL``, ... from the environment
    (``LAH_TRUSTED_PROXIES``: comma-separated)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read coordinator config {path}: {e}") from e
    env = os.environ if environ is None else environ
    for name, convert in _ENV_FIELDS.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            try:
                data[name] = convert(raw)  # type: ignore[operator]
            except ValueError as e:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {e}") from e
    try:
        return msgspec.convert(data, CoordinatorConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid coordinator config: {e}") from e
