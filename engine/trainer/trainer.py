"""The trainer: the digits DMoE model trained through remote experts.

:class:`Trainer` runs synchronous PyTorch on the calling thread: the optimizer updates the dense
parameters (input layer, gates, head); experts update themselves on their hosts from the gradients
they receive. A step whose mixture cannot get ``k_min`` answers is skipped. Its place in the swarm
(account, Peer, DHT, finder, receipts, spot checks, the collaborative optimizer) is a
:class:`~.node.TrainerNode`.

With ``target_batch_size`` (the experiment's), the dense parameters are trained collaboratively
(DeDLOC, :mod:`engine.collab`): the trainer thread hands each batch's gradients to the node's
:class:`~engine.collab.CollaborativeOptimizer` on the loop (it blocks there while its group averages).

No credit for nothing: a step whose loss is not finite stops before its backward pass (no expert is
asked for one), a step with a non-finite gradient stops before the optimizer, and either raises
:class:`StepNotFinite` naming the step and the cause; ``settle(False)`` tells the node to withhold the
receipts of that step (``settle(True)`` after every other step releases them).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from engine.collab import CollabError, CollaborativeOptimizer
from engine.dht import DHTError
from engine.moe import ExpertCallFailed, LoopThread, NotEnoughExperts, RemoteMixtureOfExperts
from engine.moe.layer_calls import CallRecord
from engine.moe.mixture import ExpertFinder
from engine.moe.registry import ExpertSpec
from engine.p2p import Peer
from engine.wire import all_finite

from .model import Digits, DigitsDMoE, LocalMixtureOfExperts

__all__ = [
    "StepNotFinite",
    "TrainStats",
    "Trainer",
    "TrainerConfig",
    "dense_digest",
    "local_model",
    "remote_mixture",
    "remote_model",
]

logger = logging.getLogger(__name__)


class StepNotFinite(RuntimeError):
    """A training step whose loss or gradients are not finite: the run stops there (``lah train``:
    exit status 2). ``step`` is the batch's number (from 1), ``cause`` what was not finite."""

    def __init__(self, step: int, cause: str) -> None:
        super().__init__(
            f"step {step}: {cause}; training stopped there (no backward pass, optimizer step or receipt "
            "for that step)"
        )
        self.step, self.cause = step, cause


def first_non_finite_gradient(model: nn.Module) -> str | None:
    """The name of the first parameter whose gradient holds a NaN or an inf, or None."""
    for name, p in model.named_parameters():
        if p.grad is not None and not all_finite(p.grad):
            return name
    return None


@dataclass(frozen=True)
class TrainerConfig:
    uid_prefix: str = "ffn"
    grid: tuple[int, ...] = (4, 4)
    dim: int = 64
    hidden: int = 256
    k_best: int = 4
    k_min: int = 1
    grace_s: float = 0.3
    timeout: float = 5.0  # per expert request
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    spot_check_fraction: float = 0.02
    wire: str = "float16"  # expert calls: "float16" or "int8" (engine.moe.client.WIRE_FORMATS)
    dht_client: bool = True  # look up and publish, hold nobody's records: the loop stays for expert calls
    target_batch_size: int = 0  # >0: train the dense part with the experiment's other trainers
    gather_s: float = 2.0  # collaborative matchmaking: how long peers due for a step gather
    collab_timeout_s: float = 300.0  # the longest one collaborative step may block the trainer
    status_interval_s: float = 5.0  # collaborative: how often the coordinator hears how it goes

    @property
    def step_timeout_s(self) -> float:
        """The longest a step may wait: expert lookup, forward and backward, each bounded."""
        return 3 * self.timeout + 6.0


@dataclass
class TrainStats:
    steps: int = 0
    skipped_steps: int = 0
    max_step_s: float = 0.0
    elapsed_s: float = 0.0
    last_loss: float = float("nan")
    requests: Counter[str] = field(default_factory=Counter)  # "ok" / failure codes
    served: Counter[str] = field(default_factory=Counter)  # host peer id -> answered requests
    samples: int = 0  # samples this trainer computed gradients on
    epoch: int = 0  # collaborative: the dense model's optimizer steps (the collaboration's epoch)
    collab_steps: list[tuple[int, int]] = field(default_factory=list)  # (epoch, group size) per step
    collab_samples: int = 0  # collaborative: samples this trainer contributed to the steps it took
    last_round_s: float = float("nan")  # collaborative: the last all-reduce round's seconds
    collab_s: float = 0.0  # collaborative: seconds spent matching, averaging and taking state

    @property
    def samples_per_s(self) -> float:
        """Samples per second of training, collaboration time included."""
        wall = self.elapsed_s + self.collab_s
        return self.samples / wall if wall > 0 else 0.0


def remote_model(
    peer: Peer,
    finder: ExpertFinder,
    loop: LoopThread,
    config: TrainerConfig,
    observer: Callable[[CallRecord], None] | None = None,
    *,
    in_features: int = 64,
    n_classes: int = 10,
) -> DigitsDMoE:
    torch.manual_seed(config.seed)
    moe = remote_mixture(peer, finder, loop, config, config.uid_prefix, observer, pass_short=False)
    return DigitsDMoE(moe, config.dim, in_features, n_classes)


def remote_mixture(
    peer: Any,
    finder: ExpertFinder,
    loop: LoopThread,
    config: TrainerConfig,
    grid: str,
    observer: Callable[[CallRecord], None] | None = None,
    *,
    pass_short: bool = True,
) -> RemoteMixtureOfExperts:
    """A mixture layer over grid ``grid`` of ``config``'s shape (``peer``: a Peer, or what stands in
    for one, as benchmarks' fault injection does); ``pass_short``: see RemoteMixtureOfExperts."""
    return RemoteMixtureOfExperts(
        peer,
        finder,
        loop=loop,
        in_features=config.dim,
        grid_size=config.grid,
        uid_prefix=grid,
        k_best=config.k_best,
        k_min=config.k_min,
        grace_s=config.grace_s,
        timeout=config.timeout,
        observer=observer,
        wire=config.wire,
        pass_short=pass_short,
    )


def local_model(config: TrainerConfig) -> DigitsDMoE:
    torch.manual_seed(config.seed)
    spec = ExpertSpec("ffn", config.dim, config.hidden)
    return DigitsDMoE(LocalMixtureOfExperts(config.dim, config.grid, spec, config.k_best), config.dim)


class Trainer:
    """Trains ``model`` on ``data`` with Adam on every parameter it holds (remote experts hold none).

    With ``collab`` (whose optimizer is then the one used) each batch's gradients go to the
    collaboration on ``loop`` instead of a local step; ``data_seed`` orders this trainer's batches
    (trainers of one collaboration should see different ones; default: the config's seed)."""

    def __init__(
        self,
        model: nn.Module,
        data: Digits,
        config: TrainerConfig,
        *,
        collab: CollaborativeOptimizer | None = None,
        loop: LoopThread | None = None,
        data_seed: int | None = None,
        settle: Callable[[bool], None] | None = None,
    ) -> None:
        """``settle(good)``: told after each step whether its experts' work earns receipts (the node's
        ``settle_step``)."""
        if collab is not None and loop is None:
            raise ValueError("a collaborative trainer needs the loop its collaboration runs on")
        self.model, self.data, self.config = model, data, config
        self.collab, self.loop = collab, loop
        self.settle = settle
        self.optimizer = (
            collab.optimizer if collab is not None else torch.optim.Adam(model.parameters(), lr=config.lr)
        )
        self.stats = TrainStats()
        self._stop = threading.Event()
        self._gen = torch.Generator().manual_seed(config.seed if data_seed is None else data_seed)
        self._order = torch.empty(0, dtype=torch.long)

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._order) < self.config.batch_size:
            self._order = torch.randperm(len(self.data.x_train), generator=self._gen)
        index, self._order = self._order[: self.config.batch_size], self._order[self.config.batch_size :]
        return self.data.x_train[index], self.data.y_train[index]

    def step(self) -> float | None:
        """One optimizer step; ``None`` when the mixture could not get enough answers (skipped).
        Raises :class:`StepNotFinite` (module docstring)."""
        self.model.train()
        x, y = self._batch()
        t0 = time.monotonic()
        number = self.stats.steps + self.stats.skipped_steps + 1
        try:
            loss = nn.functional.cross_entropy(self.model(x), y)
            value = float(loss.detach())
            if not math.isfinite(value):
                self._refuse(number, f"the loss is {value}")
            self.optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            bad = first_non_finite_gradient(self.model)
            if bad is not None:
                self._refuse(number, f"the gradient of {bad} is not finite (loss {value:.4g})")
            if self.collab is None:
                self.optimizer.step()
            result: float | None = value
        except (NotEnoughExperts, ExpertCallFailed, TimeoutError):
            result = None
        if self.settle is not None:
            self.settle(True)
        took = time.monotonic() - t0
        if result is not None:
            self.stats.samples += len(x)
            if self.collab is not None:
                self._collab_step(len(x))
        self.stats.max_step_s = max(self.stats.max_step_s, took)
        self.stats.elapsed_s += took
        if result is None:
            self.stats.skipped_steps += 1
        else:
            self.stats.steps += 1
            self.stats.last_loss = result
        return result

    def _refuse(self, number: int, cause: str) -> None:
        if self.settle is not None:
            self.settle(False)
        raise StepNotFinite(number, cause)

    def _collab_step(self, batch_size: int) -> None:
        """Hand this batch's gradients to the collaboration; it steps when the target is reached."""
        assert self.collab is not None and self.loop is not None
        t0 = time.monotonic()
        try:
            report = self.loop.run(self.collab.step(batch_size), self.config.collab_timeout_s)
        except (CollabError, DHTError, TimeoutError) as e:
            # The gradients stay accumulated (or were applied locally): the next batch tries again.
            logger.warning("collaborative step failed: %s", e)
            report = None
        self.stats.collab_s += time.monotonic() - t0
        if report is not None and report.samples > 0:
            self.stats.collab_steps.append((report.epoch, report.group_size))
            self.stats.collab_samples += report.samples
            if report.round is not None:
                self.stats.last_round_s = report.round.seconds
        self.stats.epoch = self.collab.epoch

    def train(
        self, steps: int, *, progress: bool = True, on_step: Callable[[int], None] | None = None
    ) -> TrainStats:
        bar = tqdm(range(steps), desc="training", unit="step", disable=not progress, leave=True)
        for i in bar:
            loss = self.step()
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3f}", skipped=self.stats.skipped_steps)
            if on_step is not None:
                on_step(i)
        bar.close()
        return self.stats

    def train_epochs(
        self, epochs: int, *, progress: bool = True, max_batches: int | None = None
    ) -> TrainStats:
        """Collaborative: train until the dense model has taken ``epochs`` steps (or ``max_batches``
        batches, when given, as a bound for a collaboration that stalls)."""
        assert self.collab is not None, "train_epochs is for a collaborative trainer"
        bar = tqdm(total=epochs, desc="collaborating", unit="epoch", disable=not progress, leave=True)
        batches = 0
        while (
            self.collab.epoch < epochs
            and (max_batches is None or batches < max_batches)
            and not self._stop.is_set()
        ):
            loss = self.step()
            batches += 1
            bar.update(min(self.collab.epoch, epochs) - bar.n)
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3f}", batches=batches)
        bar.close()
        return self.stats

    def stop(self) -> None:
        """Ask :meth:`train_epochs`, from another thread, to return after the current batch."""
        self._stop.set()

    @torch.no_grad()
    def evaluate(self, batch_size: int = 512, *, progress: bool = False) -> float:
        """Test accuracy (a batch the mixture cannot answer counts as wrong)."""
        self.model.train(False)  # evaluation mode
        correct, total = 0, len(self.data.x_test)
        starts = range(0, total, batch_size)
        for s in tqdm(starts, desc="testing", unit="batch", disable=not progress, leave=False):
            x, y = self.data.x_test[s : s + batch_size], self.data.y_test[s : s + batch_size]
            try:
                correct += int((self.model(x).argmax(1) == y).sum())
            except (NotEnoughExperts, ExpertCallFailed, TimeoutError):
                continue
        return correct / total


def dense_digest(model: nn.Module) -> str:
    """SHA-256 over the model's parameters (the dense part: remote experts hold none), in order:
    collaborating trainers that took the same steps have the same digest."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
