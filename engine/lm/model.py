"""A decoder-only transformer whose feed-forward blocks may be mixtures of experts.

As in nanoGPT's ``model.py``: token and position embeddings, ``layers`` pre-norm blocks of causal
self-attention and a feed-forward part, a final norm, and a head tied to the token embedding. What
differs is the feed-forward part of the blocks :attr:`LmConfig.moe_blocks` names: there it is any module
that maps ``[tokens, dim]`` to ``[tokens, dim]`` (a :class:`~engine.moe.RemoteMixtureOfExperts` over
volunteers, a :class:`~engine.moe.LocalMixtureOfExperts` in process), and routing is per token: a batch
of ``B`` windows of ``T`` tokens is ``B * T`` samples of the mixture. The model does not know whether
its experts are remote.

Experts are residual (``x + FFN(norm(x))``, :class:`~engine.moe.registry.FeedForwardExpert`), so a
mixture's output already holds the residual stream; the dense blocks use the same module with a hidden
width of ``4 * dim``. A mixture of ``k_best`` experts of hidden width ``4 * dim / k_best`` then spends the
same FLOPs per token as a dense block (:meth:`LmConfig.dense_twin` builds that comparison).

``wire_rank`` r (0, the default: off) puts each mixture behind a low-rank boundary
(:class:`~engine.moe.LowRankBoundary`): the block sends ``down(x)``, r numbers a token, to a mixture over
``[tokens, r]`` whose experts lift it to ``dim`` and project their answer back (``ExpertSpec.wire_rank``),
and adds ``up`` of the mixture's answer to the residual stream, so the wire carries r numbers a token
each way instead of ``dim`` (benchmarks/activation_compression.py measures what it costs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

from engine.moe.low_rank import LowRankBoundary
from engine.moe.registry import ExpertSpec, FeedForwardExpert

from .errors import ConfigError

__all__ = ["LanguageModel", "LmConfig", "grid_name"]

#: Builds the feed-forward part of block ``i`` (one of ``moe_blocks``): ``[tokens, w] -> [tokens, w]`` with
#: ``w`` the config's ``mixture_width`` (``dim``, or ``wire_rank`` behind a low-rank boundary).
MixtureFactory = Callable[[int], nn.Module]


def grid_name(experiment: str, block: int) -> str:
    """The grid of experts of block ``block`` of language-model experiment ``experiment``: its uids are
    ``<grid>.<i>.<j>`` (the coordinator's ``layer_name`` agrees)."""
    return f"{experiment}_b{block}"


@dataclass(frozen=True)
class LmConfig:
    vocab_size: int
    context: int = 64
    layers: int = 4
    heads: int = 4
    dim: int = 128
    moe_every: int = 2  # a mixture in every block (1), every other block (2, the 2nd and 4th), none (0)
    grid: tuple[int, ...] = field(default=(16, 16))
    k_best: int = 4
    expert_hidden: int = 0  # 0: 4 * dim / k_best, the dense block's FLOPs per token
    wire_rank: int = 0  # 0: experts take rows of dim; r: a low-rank boundary, rows of r on the wire

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "layers", "heads", "dim", "k_best"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, not {value!r}")
        if self.dim % self.heads:
            raise ConfigError(f"dim {self.dim} is not divisible by heads {self.heads}")
        rank = self.wire_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= self.dim:
            raise ConfigError(f"wire_rank must be an int in [0, dim={self.dim}] (0: off), not {rank!r}")
        if self.moe_every < 0 or not self.grid or any(n < 1 for n in self.grid):
            raise ConfigError(
                f"moe_every must be >= 0 and every grid size >= 1, not {self.moe_every}, {self.grid}"
            )

    @property
    def moe_blocks(self) -> tuple[int, ...]:
        if not self.moe_every:
            return ()
        return tuple(i for i in range(self.layers) if i % self.moe_every == self.moe_every - 1)

    @property
    def experts_per_layer(self) -> int:
        return math.prod(self.grid)

    @property
    def mixture_width(self) -> int:
        """The width of the rows a mixture (and its expert calls) carries: ``wire_rank``, else ``dim``."""
        return self.wire_rank or self.dim

    @property
    def expert_spec(self) -> ExpertSpec:
        hidden = self.expert_hidden or max(1, 4 * self.dim // self.k_best)
        return ExpertSpec("ffn", self.dim, hidden=hidden, wire_rank=self.wire_rank)

    def dense_twin(self) -> LmConfig:
        """The same model with a dense feed-forward part everywhere: the FLOPs-matched baseline."""
        return replace(self, moe_every=0)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LmConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, c))
        return out


class Block(nn.Module):
    """``x + attn(norm(x))``, then the feed-forward part (residual inside it) over every token."""

    def __init__(self, config: LmConfig, ffn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.dim)
        self.attn = CausalSelfAttention(config)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        b, t, c = x.shape
        out: torch.Tensor = self.ffn(x.reshape(b * t, c)).view(b, t, c)
        return out


class LanguageModel(nn.Module):
    """The model of :class:`LmConfig`; ``mixture`` builds the feed-forward part of each mixture block."""

    def __init__(self, config: LmConfig, mixture: MixtureFactory | None = None) -> None:
        super().__init__()
        if config.moe_blocks and mixture is None:
            raise ConfigError(f"blocks {config.moe_blocks} are mixtures: give a factory that builds them")
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.dim)
        self.positions = nn.Embedding(config.context, config.dim)
        self.blocks = nn.ModuleList(
            Block(
                config,
                self._mixture(mixture, i)  # type: ignore[arg-type]
                if i in config.moe_blocks
                else FeedForwardExpert(config.dim, 4 * config.dim),
            )
            for i in range(config.layers)
        )
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied
        # nanoGPT's initialisation for the dense part; experts keep the registry's, which is what a
        # volunteer's host builds, so a local mixture starts where a remote one does.
        for name, module in self.named_modules():
            if ".experts." not in f".{name}.":
                _init(module)

    def _mixture(self, factory: MixtureFactory, block: int) -> nn.Module:
        rank = self.config.wire_rank
        inner = factory(block)
        return LowRankBoundary(inner, self.config.dim, rank) if rank else inner

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[batch, time, vocab]``, and the mean next-token cross-entropy (nats) with targets."""
        t = idx.shape[1]
        if t > self.config.context:
            raise ConfigError(f"a window of {t} tokens is longer than the context of {self.config.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def dense_parameters(self) -> list[nn.Parameter]:
        """What a trainer trains and averages with others: everything but the mixtures' experts."""
        experts = {
            id(p)
            for i in self.config.moe_blocks
            for name, p in self._ffn(i).named_parameters()
            if ".experts." in f".{name}"  # behind a low-rank boundary: mixture.experts.
        }
        return [p for p in self.parameters() if id(p) not in experts]

    def _ffn(self, block: int) -> nn.Module:
        ffn: nn.Module = self.blocks[block].ffn  # type: ignore[assignment]
        return ffn

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        new_tokens: int,
        temperature: float = 0.8,
        top_k: int | None = 40,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``new_tokens`` sampled after ``idx`` ``[batch, time]``, the window cut to the context."""
        for _ in range(new_tokens):
            logits, _ = self(idx[:, -self.config.context :])
            logits = logits[:, -1, :] / max(temperature, 1e-6)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def _init(module: nn.Module) -> None:
    """nanoGPT's initialisation: normal(0, 0.02) weights, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
