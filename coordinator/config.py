"""The coordinator's configuration: a TOML file, then ``LAH_*`` environment variables on top.

Experiments are defined here (expert type from the engine's registry, grid shape, hyperparameters):
no code travels to volunteers, only names and numbers.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

Positive = Annotated[int, msgspec.Meta(gt=0)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
# https, or http to a loopback address (tests): the rule the app's update check applies to it.
_MANIFEST_URL = re.compile(r"^(https://[^\s/:]+|http://(127(\.\d{1,3}){3}|\[::1\]))(:\d+)?(/\S*)?$")
#: A grid's name, as the uids of its experts begin (engine.moe.server.UID_PATTERN, which hosts enforce:
#: a uid is also a folder name on every OS). An experiment's name is its grid's, and a language model's
#: grids are ``<name>_b<block>``.
_GRID = re.compile(r"[a-z][a-z0-9_]{0,31}")


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


class LanguageModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A decoder-only transformer (``engine.lm.LmConfig``) whose every ``moe_every``-th block's
    feed-forward part is a grid of the volunteers' experts, and how its trainers train and tokenize.

    ``tokenizer_digest`` is the sha256 of the tokenizer every trainer must use (``engine.lm``'s
    ``Tokenizer.digest``); a trainer whose tokenizer differs is refused. Empty: the character
    tokenizer of whatever corpus the trainer brings (fine for one researcher, not for a team)."""

    vocab_size: Positive = 65
    context: Positive = 64
    layers: Positive = 4
    heads: Positive = 4
    dim: Positive = 128
    moe_every: NonNegative = 2  # 1: every block's feed-forward part is a mixture; 2: every other one
    k_best: Positive = 4
    expert_hidden: NonNegative = 0  # 0: 4 * dim / k_best (the dense block's FLOPs per token)
    batch_size: Positive = 12  # windows of `context` tokens per trainer step
    lr: Annotated[float, msgspec.Meta(gt=0)] = 1e-3
    tokenizer: Literal["char", "byte", "bpe"] = "char"
    tokenizer_digest: Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{64})?$")] = ""
    corpus: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "tinyshakespeare"

    @property
    def moe_blocks(self) -> list[int]:
        """The blocks whose feed-forward part is a mixture (as ``LmConfig.moe_blocks``: the last of
        every ``moe_every``)."""
        if not self.moe_every:
            return []
        return [i for i in range(self.layers) if i % self.moe_every == self.moe_every - 1]

    @property
    def hidden(self) -> int:
        return self.expert_hidden or max(1, 4 * self.dim // self.k_best)


def layer_name(experiment: str, block: int) -> str:
    """The grid of block ``block`` of a language-model experiment (``engine.lm.grid_name`` agrees)."""
    return f"{experiment}_b{block}"


class ExperimentConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One experiment. ``kind = "classifier"``: one grid of experts around a dense classifier
    (``dense``). ``kind = "lm"``: a language model (``lm``) with one grid per mixture block, each
    ``grid`` in shape and an experiment of its own to assignment, replication, checkpoints and credit
    (:meth:`grids`); the dense part (attention, embeddings, gates, head) is the trainers'."""

    name: str
    expert_type: str  # a name in engine.moe.registry
    grid: list[int]  # e.g. [4, 4]: uids "<name>.i.j" (a language model: "<name>_b<block>.i.j")
    hyperparams: dict[str, float | int | str] = {}
    replication: int = 2  # every expert hosted by at least this many hosts
    expert_cost: float = 1.0  # credit per sample served (forward; backward counts double)
    # Trainers of this experiment train the dense part together (engine.collab), stepping once the
    # collaboration has processed this many samples; 0: each trainer trains alone.
    target_batch_size: Annotated[int, msgspec.Meta(ge=0)] = 0
    dense: DenseModel = DenseModel()
    kind: Literal["classifier", "lm"] = "classifier"
    lm: LanguageModel | None = None
    part_of: str = ""  # a language model's grid: the experiment it is a layer of

    def __post_init__(self) -> None:
        grids = [self.name]
        if self.kind == "lm" and self.lm is not None:
            grids = [layer_name(self.name, block) for block in self.lm.moe_blocks]
        if not all(_GRID.fullmatch(g) for g in grids):
            raise msgspec.ValidationError(
                "an experiment's name is a lowercase letter, then lowercase letters, digits or _, short "
                f"enough that each of its grids ({', '.join(grids)}) has at most 32 characters: not "
                f"{self.name!r}"
            )
        if self.kind != "lm":
            return
        if self.lm is None:
            raise msgspec.ValidationError(f"experiment {self.name!r} is of kind lm: give it an [lm] table")
        if self.expert_type != "ffn":
            raise msgspec.ValidationError(f"a language model's experts are ffn, not {self.expert_type!r}")
        if self.lm.dim % self.lm.heads:
            raise msgspec.ValidationError(
                f"lm.dim {self.lm.dim} is not divisible by lm.heads {self.lm.heads}"
            )
        if not self.lm.moe_blocks:
            raise msgspec.ValidationError(f"experiment {self.name!r} has no mixture blocks (lm.moe_every)")

    def grids(self) -> list[ExperimentConfig]:
        """The grids of experts this experiment asks volunteers to host: itself, or a language
        model's one per mixture block (experts' width and hidden size from ``lm``)."""
        if self.kind != "lm" or self.lm is None:
            return [self]
        hyperparams: dict[str, float | int | str] = {"d_model": self.lm.dim, "hidden": self.lm.hidden}
        return [
            ExperimentConfig(
                name=layer_name(self.name, block),
                expert_type="ffn",
                grid=list(self.grid),
                hyperparams=hyperparams,
                replication=self.replication,
                expert_cost=self.expert_cost,
                part_of=self.name,
            )
            for block in self.lm.moe_blocks
        ]


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
    # Credit a host may earn per hour of serving, by the device it declared (coordinator.credit.rules);
    # one trainer account may grant a host at most pair_credit_share of it.
    host_credit_per_hour: dict[str, float] = msgspec.field(
        default_factory=lambda: {"cpu": 2.0e7, "cuda": 2.0e8, "mps": 5.0e7}
    )
    pair_credit_share: float = 0.5
    invite_ttl_s: int = 14 * 86400  # how long an invitation code stays valid
    exports_dir: str | None = None  # the site's daily dumps; None: "exports" in the user data dir
    # The signed release manifest this project's apps check (GET /api/updates); None: they check none.
    update_manifest_url: str | None = None
    experiments: list[ExperimentConfig] = []

    def __post_init__(self) -> None:
        names = [g.name for e in self.experiments for g in e.grids()]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise msgspec.ValidationError(f"two experiments or layers are called {', '.join(clash)}")
        url = self.update_manifest_url
        if url is not None and not _MANIFEST_URL.match(url):
            raise msgspec.ValidationError(
                f"update_manifest_url must be an https address (plain http only to 127.x.x.x or [::1], "
                f"for tests), not {url!r}"
            )

    @property
    def grids(self) -> list[ExperimentConfig]:
        """Every grid of experts volunteers host: a classifier's own, a language model's layers."""
        return [g for e in self.experiments for g in e.grids()]


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
    "update_manifest_url": str,
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
