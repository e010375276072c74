"""The training loop, read top to bottom as nanoGPT's ``train.py`` reads: batch, loss, step, every so
often an evaluation and a log line, and a stop at the first loss that is not finite.

The loop owns no swarm: the model's mixture layers are local or remote, and the optimizer is whatever
the caller passes (a plain AdamW here; the collaborative optimizer where a target batch size is set).
Each logged step is a :class:`Metrics` row; :class:`CsvLog` appends them to a CSV file as they come, so a
run that dies leaves every row it logged. Through a swarm, ``skippable`` names the errors that cost a
step rather than the run (a layer whose every host timed out): such a step is counted and its batch
dropped, as DMoE drops what it cannot get; ``counters`` adds the swarm's figures (expert calls answered,
failed and late, bytes each way) to every row.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from engine.wire import all_finite

from .corpus import Corpus
from .errors import GradientNotFinite, LossNotFinite
from .model import LanguageModel

__all__ = ["CallCounters", "CsvLog", "Metrics", "TrainSettings", "evaluate", "train"]


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
class CallCounters:
    """A swarm's running totals, as a trainer sees them (all zero for a model without remote layers)."""

    calls_ok: int = 0
    calls_failed: int = 0
    calls_late: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class Metrics:
    step: int
    train_tokens: int
    loss: float
    val_loss: float | None  # only on evaluation steps
    perplexity: float | None
    tokens_per_s: float
    elapsed_s: float
    skipped_steps: int = 0
    calls: CallCounters = field(default_factory=CallCounters)

    def flat(self) -> dict[str, float | int | None]:
        """One CSV or TensorBoard row: the call counters as columns of their own."""
        row = {k: v for k, v in asdict(self).items() if k != "calls"}
        return row | asdict(self.calls)


COLUMNS = [f.name for f in fields(Metrics) if f.name != "calls"] + [f.name for f in fields(CallCounters)]


class CsvLog:
    """Metrics rows appended to ``path`` (header first), flushed row by row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        new = not path.exists() or path.stat().st_size == 0
        self._file = path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, COLUMNS)
        if new:
            self._writer.writeheader()

    def __call__(self, row: Metrics) -> None:
        self._writer.writerow(row.flat())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@torch.no_grad()
def evaluate(
    model: LanguageModel,
    corpus: Corpus,
    batches: int,
    batch: int,
    seed: int = 0,
    skippable: tuple[type[BaseException], ...] = (),
) -> float:
    """Mean validation cross-entropy (nats) over ``batches`` fixed-seed batches: the same windows every
    call, so evaluations of one run (and of runs that compare models) see the same text. A batch that
    fails with a ``skippable`` error is left out (NaN when every one was)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total, counted = 0.0, 0
    for _ in range(batches):
        x, y = corpus.batch("val", batch, model.config.context, gen)
        try:
            _, loss = model(x, y)
        except skippable:
            continue
        assert loss is not None
        total += float(loss)
        counted += 1
    model.train(was_training)
    return total / counted if counted else float("nan")


def train(
    model: LanguageModel,
    corpus: Corpus,
    settings: TrainSettings,
    optimizer: torch.optim.Optimizer | None = None,
    log: Callable[[Metrics], None] | None = None,
    *,
    skippable: tuple[type[BaseException], ...] = (),
    counters: Callable[[], CallCounters] | None = None,
    start_step: int = 0,
    stop: threading.Event | None = None,
    apply: Callable[[int], None] | None = None,
    settle: Callable[[bool], None] | None = None,
) -> Iterator[Metrics]:
    """Train from ``start_step`` (a resumed run's) to ``settings.steps``, yielding a row per evaluation
    (and the last step, and the step at which ``stop`` was set). Raises :class:`LossNotFinite` at the
    first NaN or inf loss, before that step touches any weight or asks any expert for a backward pass,
    and :class:`GradientNotFinite` at the first step whose loss is finite but a gradient is not, before
    that step touches any weight. The batches of step ``n`` are the same whether or not the run was
    resumed. ``apply(windows)`` takes the step's gradients instead of ``optimizer.step()`` (a
    collaborative optimizer, which steps once the team has enough windows). ``settle(good)`` is told,
    after each step, whether the experts' work of that step earned anything (False: that step stopped
    the run; the trainer's receipts of it are withheld)."""
    context = model.config.context
    corpus.check_fits(context, settings.batch)
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    started = time.monotonic()
    skipped = 0
    model.train()
    for step in range(start_step + 1, settings.steps + 1):
        gen = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
        x, y = corpus.batch("train", settings.batch, context, gen)
        try:
            _, loss = model(x, y)
            assert loss is not None
            value = float(loss.detach())
            if not math.isfinite(value):
                _settle(settle, False)
                raise LossNotFinite(step, value)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            bad = first_non_finite_gradient(model)
            if bad is not None:
                _settle(settle, False)
                raise GradientNotFinite(step, value, bad)
            if apply is None:
                opt.step()
            else:
                apply(settings.batch)
        except skippable:
            skipped += 1
            value = float("nan")
        _settle(settle, True)
        stopping = stop is not None and stop.is_set()
        if step % settings.eval_every == 0 or step == settings.steps or stopping:
            val = evaluate(model, corpus, settings.eval_batches, settings.batch, skippable=skippable)
            elapsed = time.monotonic() - started
            tokens = step * settings.batch * context
            rate = (step - start_step) * settings.batch * context / elapsed
            row = Metrics(
                step,
                tokens,
                value,
                val,
                math.exp(val) if math.isfinite(val) else None,
                rate,
                elapsed,
                skipped,
                counters() if counters is not None else CallCounters(),
            )
            if log is not None:
                log(row)
            yield row
        if stopping:
            return


def first_non_finite_gradient(model: torch.nn.Module) -> str | None:
    """The name of the first parameter whose gradient holds a NaN or an inf, or None."""
    for name, p in model.named_parameters():
        if p.grad is not None and not all_finite(p.grad):
            return name
    return None


def _settle(settle: Callable[[bool], None] | None, good: bool) -> None:
    if settle is not None:
        settle(good)
