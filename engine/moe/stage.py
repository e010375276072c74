"""Stage experts: a stack of ``depth`` pre-norm causal transformer blocks, so a wire byte carries depth.

Why: a home volunteer uploads about 2.5 MB/s, and a thin expert (one FFN) sends back its output and its
input gradient for every token while computing only ``6 * 12 d^2`` FLOPs a token for them: its GPU idles.
A stage's traffic is the same ``[tokens, d]`` in and out whatever its depth, and its compute grows with
the depth (SWARM's pipeline stages): FLOPs per uploaded byte are ``depth * (18 d + 3.5 seq)`` in float16
(:func:`stage_flops_per_token` has the exact count).

**What a sample is.** A stage call carries ``[batch, seq, d]``: each sample is one sequence of ``seq``
tokens of the language model's residual stream (a window of text, not a single token), because
attention mixes tokens of the same sequence. Attention is causal, so token ``t`` of a sample sees tokens
``<= t`` of that sample only, never another sample's; a language model can therefore pass each window of
a microbatch through one stage of each pool (SWARM-like), and a stage's output is the residual stream
after its blocks (no final norm: the next stage, or the model's head, norms it). On the wire this is the
``transformer`` architecture's shape: ``[batch, seq, d]`` in float16 or 8-bit, each way.

Each block is ``x + proj(attn(norm1(x)))`` then ``x + down(gelu(up(norm2(x))))``, with
``scaled_dot_product_attention`` (flash attention on a GPU: memory linear in ``seq``). No dropout: a
host recomputes forwards for backwards it kept no graph for (:mod:`.graphs`), and that must be exactly
the function the trainer saw.

This module is the network and its sizes as pure functions of integers (parameters, FLOPs, bytes);
choosing a stage for a memory budget is :mod:`.stage_fit`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils import flop_counter as flop_counter_module
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "StageBlock",
    "StageExpert",
    "flop_counter",
    "stage_activation_bytes_per_token",
    "stage_flops_per_token",
    "stage_linear_weights",
    "stage_parameters",
]


class StageBlock(nn.Module):
    """One pre-norm causal transformer block over ``[batch, seq, dim]``."""

    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, s, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out


class StageExpert(nn.Module):
    """``depth`` :class:`StageBlock` in a row: ``[batch, seq, dim] -> [batch, seq, dim]``."""

    def __init__(self, dim: int, hidden: int, heads: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(StageBlock(dim, hidden, heads) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def stage_linear_weights(dim: int, hidden: int) -> int:
    """Matmul weights of one block (qkv, proj, up, down): what the FLOP count scales with."""
    return 4 * dim * dim + 2 * dim * hidden


def stage_parameters(dim: int, hidden: int, depth: int) -> int:
    """Every parameter of a stage: matmul weights, their biases and two norms' weights and biases a block."""
    biases = 3 * dim + dim + hidden + dim
    norms = 4 * dim
    return depth * (stage_linear_weights(dim, hidden) + biases + norms)


def stage_flops_per_token(dim: int, hidden: int, depth: int, seq: int) -> int:
    """Forward plus backward FLOPs per token as ``torch.utils.flop_counter`` counts them.

    Matmuls: 2 FLOPs per weight forward, 4 backward (input and weight gradients). Attention, as torch
    counts its fused kernels: ``4 seq d`` forward and ``10 seq d`` backward per token (the scores are
    recomputed), the whole ``seq x seq`` square although causal kernels skip half of it. Norms, GELU
    and softmax are not counted (torch counts matmuls only).
    """
    return depth * (6 * stage_linear_weights(dim, hidden) + 14 * seq * dim)


def stage_activation_bytes_per_token(dim: int, hidden: int, heads: int) -> int:
    """Bytes autograd keeps per token and block for the backward (float32): ``8 d + 2 hidden`` floats
    (the block's input, both norms' outputs, q/k/v in one tensor, attention's output, the residual sum,
    the MLP's hidden before and after GELU) plus attention's log-sum-exp per head and the norms'
    statistics. The tests check it against ``saved_tensors_hooks``; on a GPU flash attention saves the
    same tensors."""
    floats = 8 * dim + 2 * hidden + heads + 4
    return 4 * floats


def flop_counter() -> FlopCounterMode:
    """``torch.utils.flop_counter.FlopCounterMode`` that also counts the CPU's fused attention.

    Torch counts its CUDA attention kernels (flash, memory-efficient, cuDNN) but not the CPU's flash
    kernel, which would make a stage's attention free on a CPU; here that kernel is counted with torch's
    own formulas for the CUDA ones, so a count on a CPU is the count on a GPU.
    """
    aten = torch.ops.aten
    registry = flop_counter_module.flop_registry
    return FlopCounterMode(
        display=False,
        custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _raw(
                registry[aten._scaled_dot_product_flash_attention]
            ),
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _raw(
                registry[aten._scaled_dot_product_flash_attention_backward]
            ),
        },
    )


def _raw(formula: Callable[..., int]) -> Callable[..., int]:
    """A registered formula (already taking shapes) marked so the counter does not wrap it again."""

    def count(*args: Any, **kwargs: Any) -> int:
        return formula(*args, **kwargs)

    count._get_raw = True  # type: ignore[attr-defined]
    return count
