"""The training loop, read top to bottom as nanoGPT's ``train.py`` reads: batch, loss, step, every so
often an evaluation and a log line, and a stop at the first loss that is not finite.

The loop owns no swarm: the model's mixture layers are local or remote, and the optimizer is whatever
the caller passes (a plain AdamW here; the collaborative optimizer where a target batch size is set).
Each logged step is a :class:`Metrics` row; :class:`CsvLog` appends them to a CSV file as they come, so a
run that dies leaves every row it logged.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from .corpus import Corpus
from .errors import LossNotFinite
from .model import LanguageModel

__all__ = ["CsvLog", "Metrics", "TrainSettings", "evaluate", "train"]


@dataclass(frozen=True)
class TrainSettings:
    """nanoGPT's CPU configuration for ``shakespeare_char`` (1.5M training tokens at 2,000 steps)."""

    steps: int = 2000
    batch: int = 12
    lr: float = 1e-3
    eval_every: int = 250
    eval_batches: int = 20
    seed: int = 1337


@dataclass(frozen=True)
class Metrics:
    step: int
    train_tokens: int
    loss: float
    val_loss: float | None  # only on evaluation steps
    perplexity: float | None
    tokens_per_s: float
    elapsed_s: float


class CsvLog:
    """Metrics rows appended to ``path`` (header first), flushed row by row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        new = not path.exists() or path.stat().st_size == 0
        self._file = path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, [f.name for f in fields(Metrics)])
        if new:
            self._writer.writeheader()

    def __call__(self, row: Metrics) -> None:
        self._writer.writerow(asdict(row))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@torch.no_grad()
def evaluate(model: LanguageModel, corpus: Corpus, batches: int, batch: int, seed: int = 0) -> float:
    """Mean validation cross-entropy (nats) over ``batches`` fixed-seed batches: the same windows every
    call, so evaluations of one run (and of runs that compare models) see the same text."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = corpus.batch("val", batch, model.config.context, gen)
        _, loss = model(x, y)
        assert loss is not None
        total += float(loss)
    model.train(was_training)
    return total / batches


def train(
    model: LanguageModel,
    corpus: Corpus,
    settings: TrainSettings,
    optimizer: torch.optim.Optimizer | None = None,
    log: Callable[[Metrics], None] | None = None,
) -> Iterator[Metrics]:
    """Train for ``settings.steps``, yielding a row per evaluation (and the last step). Raises
    :class:`LossNotFinite` at the first NaN or inf loss, before that step touches any weight."""
    context = model.config.context
    corpus.check_fits(context, settings.batch)
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(settings.seed)
    started = time.monotonic()
    model.train()
    for step in range(1, settings.steps + 1):
        x, y = corpus.batch("train", settings.batch, context, gen)
        _, loss = model(x, y)
        assert loss is not None
        value = float(loss.detach())
        if not math.isfinite(value):
            raise LossNotFinite(step, value)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % settings.eval_every == 0 or step == settings.steps:
            val = evaluate(model, corpus, settings.eval_batches, settings.batch)
            elapsed = time.monotonic() - started
            tokens = step * settings.batch * context
            row = Metrics(step, tokens, value, val, math.exp(val), tokens / elapsed, elapsed)
            if log is not None:
                log(row)
            yield row
