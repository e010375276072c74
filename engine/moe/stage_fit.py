"""Which stage a host's memory budget holds: pure arithmetic, so a stage that does not fit is refused with
a sentence before it is built, not by an out-of-memory error in the middle of a call.

A hosted stage holds on its device (:func:`stage_memory`):

- ``state``: every parameter four times in float32 (weight, gradient, Adam's two moments): 16 bytes each;
- ``work``: the activations autograd keeps for the largest batch the worker runs at once
  (``batch_tokens`` tokens through every block, :func:`.stage.stage_activation_bytes_per_token`), plus
  one block's worth for the backward's temporaries;
- ``kept``: the budget of kept forward graphs on the device (:mod:`.graphs`; whatever does not fit there
  is recomputed, so it is a budget, not a function of the depth).

A stage fits when their sum is at most ``HEADROOM`` of the budget (the rest: the allocator's
fragmentation and cuBLAS/flash workspaces). :func:`largest_stage` is the policy: the model fixes ``dim``
(a stage maps the residual stream to itself), the host picks the FFN width (``4 dim``, else ``2 dim``,
else ``dim``: the widest at which one block fits) and then the deepest stack that fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SpecError
from .registry import MAX_DEPTH, ExpertSpec
from .stage import stage_activation_bytes_per_token, stage_parameters

__all__ = [
    "HEADROOM",
    "StageMemory",
    "StageTooLarge",
    "check_host_fits",
    "check_stage_fits",
    "largest_stage",
    "stage_memory",
]

#: Share of the budget a stage may plan to use; the rest absorbs fragmentation and kernel workspaces.
HEADROOM = 0.9
#: Bytes per parameter: float32 weight, gradient and Adam's two moments.
STATE_BYTES_PER_PARAM = 16
GIB = float(1 << 30)


class StageTooLarge(SpecError):
    """A stage whose planned memory is over the host's budget (the message says what would fit). Part
    of the package's one tree (under :class:`~.errors.SpecError`), kept here beside the arithmetic."""


@dataclass(frozen=True)
class StageMemory:
    """A stage's planned device memory, in bytes, by what holds it."""

    state: int
    work: int
    kept: int

    @property
    def total(self) -> int:
        return self.state + self.work + self.kept

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB ({self.state / GIB:.1f} weights and Adam state, "
            f"{self.work / GIB:.1f} activations, {self.kept / GIB:.1f} kept graphs)"
        )


def stage_memory(spec: ExpertSpec, *, batch_tokens: int, kept_bytes: int = 0) -> StageMemory:
    """Device memory a hosted ``stage`` spec plans for (see the module docstring)."""
    if spec.arch != "stage":
        raise SpecError(f"{spec.arch!r} is not a stage; only stages are sized here")
    if batch_tokens < 1 or kept_bytes < 0:
        raise SpecError(f"batch_tokens must be >= 1 and kept_bytes >= 0, got {batch_tokens}, {kept_bytes}")
    hidden = spec.hidden_size
    per_token = stage_activation_bytes_per_token(spec.dim, hidden, spec.heads)
    return StageMemory(
        state=STATE_BYTES_PER_PARAM * stage_parameters(spec.dim, hidden, spec.depth),
        work=batch_tokens * (spec.depth + 1) * per_token,
        kept=kept_bytes,
    )


def fits(memory: StageMemory, budget_bytes: int) -> bool:
    return memory.total <= HEADROOM * budget_bytes


def check_stage_fits(
    spec: ExpertSpec, budget_bytes: int, *, batch_tokens: int, kept_bytes: int = 0
) -> StageMemory:
    """The host's refusal: :class:`StageTooLarge` with a sentence saying what it needs, what the budget
    is and the deepest stack of this width that would fit; the planned memory otherwise."""
    need = stage_memory(spec, batch_tokens=batch_tokens, kept_bytes=kept_bytes)
    if fits(need, budget_bytes):
        return need
    deepest = _deepest(spec, budget_bytes, batch_tokens, kept_bytes)
    instead = f"it holds at most {deepest} blocks of this width" if deepest else "it holds no block of it"
    raise StageTooLarge(
        f"a stage of {spec.depth} blocks at d={spec.dim} (hidden {spec.hidden_size}) needs {need.describe()} "
        f"for batches of {batch_tokens} tokens, over {HEADROOM:.0%} of this host's "
        f"{budget_bytes / GIB:.1f} GiB budget: {instead}"
    )


def check_host_fits(
    specs: Mapping[str, ExpertSpec], budget_bytes: int, *, batch_tokens: int, kept_bytes: int = 0
) -> int:
    """An assignment's stages together against one host's budget (they share its device): their planned
    bytes (the kept graphs counted once: the host's experts share one cache), or :class:`StageTooLarge`
    naming them. Other architectures are not planned here (an FFN of d=1024 is 0.2 GiB with Adam)."""
    stages = {uid: spec for uid, spec in sorted(specs.items()) if spec.arch == "stage"}
    if not stages:
        return 0
    if len(stages) == 1:
        ((_, spec),) = stages.items()
        return check_stage_fits(spec, budget_bytes, batch_tokens=batch_tokens, kept_bytes=kept_bytes).total
    plans = {uid: stage_memory(spec, batch_tokens=batch_tokens) for uid, spec in stages.items()}
    # One worker thread runs one batch at a time: the activations of the largest batch, not of all.
    total = sum(p.state for p in plans.values()) + max(p.work for p in plans.values()) + kept_bytes
    if total <= HEADROOM * budget_bytes:
        return total
    raise StageTooLarge(
        f"{len(stages)} stages ({', '.join(stages)}) need {total / GIB:.1f} GiB together for batches of "
        f"{batch_tokens} tokens, over {HEADROOM:.0%} of this host's {budget_bytes / GIB:.1f} GiB budget"
    )


def largest_stage(
    dim: int,
    heads: int,
    budget_bytes: int,
    *,
    seq_len: int,
    batch_tokens: int,
    kept_bytes: int = 0,
    max_depth: int = MAX_DEPTH,
) -> ExpertSpec:
    """The deepest stage of the widest FFN (4, 2 or 1 times ``dim``) at which one block fits the budget."""
    for hidden in (4 * dim, 2 * dim, dim):
        probe = ExpertSpec("stage", dim, hidden, heads, seq_len, depth=1)
        depth = min(max_depth, _deepest(probe, budget_bytes, batch_tokens, kept_bytes))
        if depth >= 1:
            return ExpertSpec("stage", dim, hidden, heads, seq_len, depth=depth)
    one = stage_memory(
        ExpertSpec("stage", dim, dim, heads, seq_len, depth=1),
        batch_tokens=batch_tokens,
        kept_bytes=kept_bytes,
    )
    raise StageTooLarge(
        f"not one block at d={dim} fits: even with hidden {dim} it needs {one.describe()} for batches of "
        f"{batch_tokens} tokens, over {HEADROOM:.0%} of this host's {budget_bytes / GIB:.2f} GiB budget"
    )


def _deepest(spec: ExpertSpec, budget_bytes: int, batch_tokens: int, kept_bytes: int) -> int:
    """The largest depth in [0, MAX_DEPTH] of ``spec``'s width that fits (memory grows with depth)."""
    lo, hi = 0, MAX_DEPTH
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = ExpertSpec("stage", spec.dim, spec.hidden, spec.heads, spec.seq_len, depth=mid)
        if fits(stage_memory(trial, batch_tokens=batch_tokens, kept_bytes=kept_bytes), budget_bytes):
            lo = mid
        else:
            hi = mid - 1
    return lo
