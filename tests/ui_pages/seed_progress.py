"""A language-model experiment's training progress for the page tests: three trainers' evaluations
around ``seed.NOW`` (one restarted late, one far behind), the newest with a sample of generated text
that also carries markup, which the page must show as text."""

from __future__ import annotations

import math

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from coordinator.config import ExperimentConfig, LanguageModel
from coordinator.db.models import ExperimentProgress

from .seed import NOW, XSS

SEED_LM = ExperimentConfig(
    name="shakespeare",
    kind="lm",
    expert_type="ffn",
    grid=[4, 4],
    lm=LanguageModel(vocab_size=65, context=64, layers=4, heads=4, dim=128, moe_every=2),
)
SAMPLE = (
    "KING RICHARD:\nWhat say you, sir? the heart of my good lord\n"
    "Is grown too heavy for the crown.\n\nQUEEN ELIZABETH:\nNay, then, I pray you, " + XSS + " & be gone."
)
#: trainer name -> (evaluations, tokens per evaluation, final loss)
CURVES = {
    "Lab GPU trainer": (14, 76_800, 1.52),
    "Dense Dave": (9, 76_800, 1.71),
    "Late Larry": (3, 38_400, 2.6),
}


def loss_at(tokens: float, floor: float) -> float:
    """A character model's validation loss: ln(65) at the start, falling towards ``floor``."""
    return floor + (math.log(65) - floor) * math.exp(-tokens / 300_000)


async def seed_progress(sessions: async_sessionmaker[AsyncSession], ids: dict[str, int]) -> None:
    """Reports of the trainers in ``CURVES`` (their account ids in ``ids``); the first has the sample."""
    async with sessions() as s, s.begin():
        for rank, (name, (count, every, floor)) in enumerate(CURVES.items()):
            for i in range(1, count + 1):
                tokens = i * every
                s.add(
                    ExperimentProgress(
                        experiment=SEED_LM.name,
                        account_id=ids[name],
                        step=tokens // 768,
                        train_tokens=tokens,
                        val_loss=loss_at(tokens, floor) + 0.02 * math.sin(i * (rank + 1)),
                        tokens_per_s=950.0 + 40 * rank,
                        sample=SAMPLE if rank == 0 and i == count else None,
                        reported_at=NOW - 60 * (count - i) - 30 * rank,
                    )
                )
