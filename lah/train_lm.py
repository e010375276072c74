"""``lah train`` for an experiment of kind ``lm``: the language model, its text, checkpoints, metrics.

The experiment's config (``coordinator.config.LanguageModel``) fixes the model's shape, the trainer's
batch and learning rate, and the sha256 of the tokenizer every trainer must use. ``--data`` is the text
(the shipped corpus by default), tokenized at character level or by ``--tokenizer FILE`` (the
experiment's tokenizer file, e.g. a BPE); a tokenizer whose digest differs, or a vocabulary another size
than the model's, is refused before anything is trained. The model's mixture blocks are the experiment's
grids on the volunteers (:func:`engine.trainer.lm.remote_lm`); its dense part is trained here, with the
experiment's other trainers when it sets a target batch size (one collaborative step per target).

Every evaluation appends a metrics row to ``<data-dir>/lm-<experiment>/metrics.csv`` (and to TensorBoard
under ``tensorboard/`` where ``torch.utils.tensorboard`` imports) and writes a checkpoint of the dense part
and its optimizer there (atomic, the newest three kept); ``--resume`` continues from the newest one. A
loss that is not finite stops at that step; a checkpoint that cannot be written (a full disk) stops
too; both keep every checkpoint already written. Every evaluation is also posted to the coordinator with
a sample of ``SAMPLE_TOKENS`` generated there and then (:mod:`lah.lm_progress`), in the background: the
experiment's page (``<coordinator>/experiments/<name>``) draws this trainer's curve; a coordinator that
does not take it costs a warning, never a step.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Collaboration", "LmExperiment", "data_seed", "lm_of", "open_lm_data", "train_language_model"]

logger = logging.getLogger(__name__)
CHECKPOINTS_KEPT = 3
SAMPLE_TOKENS = 200  # of generated text with each evaluation posted (the experiment's page shows it)


class LmTrainError(Exception):
    """The researcher's to fix (exit status 2); ``lah.train`` turns it into its TrainError."""


@dataclass(frozen=True)
class LmExperiment:
    name: str
    lm: Any  # engine.lm.LmConfig
    trainer: Any  # engine.trainer.TrainerConfig
    settings: Any  # engine.lm.TrainSettings
    tokenizer_digest: str
    corpus: str
    grids: list[str]


def data_seed(peer_id: str) -> int:
    """Which windows this trainer draws: its own, so that trainers of one collaboration do not all
    compute gradients on the same text, and the same after ``--resume`` (the identity is kept)."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "little")


class Collaboration:
    """The loop's ``apply`` when the experiment sets a target batch size: each batch's gradients go to
    the collaborative optimizer, which steps once the trainers together reach the target. As the
    digits trainer does, a step that fails (a peer gone mid-round, the DHT slow) is logged and its
    gradients stay for the next batch; ``stop`` is set at the collaboration's step ``stop_at``
    (``--steps`` counts the dense model's steps, the trainers' common clock)."""

    def __init__(
        self, collab: Any, loop: Any, timeout_s: float, *, stop_at: int | None, stop: threading.Event
    ) -> None:
        self.collab, self.loop, self.timeout_s = collab, loop, timeout_s
        self.stop_at, self.stop = stop_at, stop
        self.steps: list[tuple[int, int]] = []  # (epoch, group size) of each step this trainer took
        self.failures = 0

    def __call__(self, windows: int) -> None:
        from engine.collab import CollabError
        from engine.dht import DHTError

        try:
            report = self.loop.run(self.collab.step(windows), self.timeout_s)
        except (CollabError, DHTError, TimeoutError) as e:
            self.failures += 1
            logger.warning("a collaborative step failed (its gradients wait for the next): %s", e)
            report = None
        if report is not None and report.samples > 0:
            self.steps.append((report.epoch, report.group_size))
        if self.stop_at is not None and self.collab.epoch >= self.stop_at:
            self.stop.set()

    def describe(self) -> str:
        """The evaluation line's prefix: the collaboration's step and the last group's size."""
        group = self.steps[-1][1] if self.steps else 0
        return f"collaborative step {self.collab.epoch} (last group {group}), "

    def summary(self) -> str:
        sizes = sorted({size for _, size in self.steps})
        return (
            f"collaboration: at its step {self.collab.epoch}; this trainer took {len(self.steps)} steps "
            f"(groups of {', '.join(map(str, sizes)) or '-'}), {self.failures} failed and retried"
        )


def lm_of(experiment: dict[str, Any]) -> LmExperiment:
    """The model, the layers' trainer config and the loop's settings of an ``lm`` experiment's JSON."""
    from engine.lm import LmError, TrainSettings, grid_name
    from engine.swarm.experiment import lm_config
    from engine.trainer.lm import layer_config

    try:
        spec = experiment["lm"]
        name = str(experiment["name"])
        lm = lm_config(experiment)
        trainer = layer_config(
            lm,
            name,
            batch_size=int(spec["batch_size"]),
            lr=float(spec["lr"]),
            target_batch_size=int(experiment.get("target_batch_size", 0)),
        )
        settings = TrainSettings(steps=10**9, batch=trainer.batch_size, lr=trainer.lr, eval_every=100)
        return LmExperiment(
            name,
            lm,
            trainer,
            settings,
            str(spec.get("tokenizer_digest", "")),
            str(spec.get("corpus", "")),
            [grid_name(name, b) for b in lm.moe_blocks],
        )
    except (KeyError, TypeError, ValueError, LmError) as e:
        raise LmTrainError(
            f"the coordinator's language-model config is not one lah train understands: {e}"
        ) from e


def open_lm_data(experiment: LmExperiment, data: Path | None, tokenizer: Path | None) -> Any:
    """The corpus to train on, tokenized as the experiment says; refusals say what to pass instead."""
    from engine.lm import LmError, check_same, open_corpus, read_text
    from engine.lm.tokenizer import CharTokenizer, load

    try:
        if tokenizer is not None:
            tok = load(tokenizer)
        elif data is None or not (data.is_dir() and (data / "train.bin").exists()):
            from engine.lm import DEFAULT_CORPUS

            tok = CharTokenizer.fit(read_text(data or DEFAULT_CORPUS))
        else:
            tok = None  # token files: ids already
        if tok is not None and experiment.tokenizer_digest:
            check_same(tok, experiment.tokenizer_digest)
        corpus = open_corpus(data, tok)
        corpus.check_fits(experiment.lm.context, experiment.settings.batch)
    except LmError as e:
        raise LmTrainError(str(e)) from e
    if corpus.vocab_size != experiment.lm.vocab_size:
        raise LmTrainError(
            f"{corpus.name} has a vocabulary of {corpus.vocab_size}; the experiment's model has "
            f"{experiment.lm.vocab_size}: pass the experiment's tokenizer with --tokenizer FILE "
            "(or the text it was built from)"
        )
    return corpus


def train_language_model(
    node: Any,
    loop: Any,
    experiment: LmExperiment,
    corpus: Any,
    *,
    steps: int | None,
    stop: threading.Event,
    folder: Path,
    resume: bool,
    say: Callable[[str], None],
) -> int:
    """Train until ``steps`` or ``stop``; the exit status (0 done or stopped, 2 the researcher's)."""
    from dataclasses import replace

    import torch

    from engine.lm import CsvLog, LossNotFinite, train
    from engine.moe.checkpoint import CheckpointStore, restore_state, snapshot_state
    from engine.moe.errors import CheckpointError
    from engine.swarm import SKIPPABLE
    from engine.trainer.lm import call_counters, remote_lm

    from .lm_progress import ProgressPoster, model_sample
    from .lm_text import sample_text

    cfg, lm = experiment.trainer, experiment.lm
    say(f"text: {corpus.describe()}")
    model = remote_lm(node.peer, node.finder, loop, lm, experiment.name, cfg, node.observe, seed=0)
    together: Collaboration | None = None
    if cfg.target_batch_size > 0:
        collab = loop.run(node.collaborate(model), 60)
        optimizer = collab.optimizer
        together = Collaboration(collab, loop, cfg.collab_timeout_s, stop_at=steps, stop=stop)
        say(
            f"training the dense part with the experiment's other trainers: target {cfg.target_batch_size} "
            f"windows a step, now at step {collab.epoch}"
            + (f", until step {steps}" if steps is not None else "")
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        say("this experiment has no target batch size: training alone")
    store = CheckpointStore(folder / "checkpoints", keep=CHECKPOINTS_KEPT)
    start = 0
    if resume:
        try:
            ckpt = store.load_latest()
        except OSError as e:
            raise LmTrainError(f"cannot read the checkpoints in {store.directory}: {e}") from e
        if ckpt is None:
            raise LmTrainError(f"--resume: no checkpoint in {store.directory} to resume from")
        start = int(ckpt.meta.get("step", 0))
        if together is not None and together.collab.epoch > 0:
            # The collaboration went on without us: its state (taken on joining) is newer than ours.
            say(f"resumed at step {start}; the dense part is the collaboration's, at its step {collab.epoch}")
        else:
            try:
                restore_state(model, optimizer, ckpt)
            except CheckpointError as e:
                raise LmTrainError(
                    f"the checkpoint in {store.directory} does not fit this experiment's model: {e}"
                ) from e
            say(f"resumed at step {start} from {store.files()[-1]}")
    local_steps = start + steps if steps is not None and together is None else 10**9
    settings = replace(experiment.settings, steps=local_steps, seed=data_seed(node.identity.peer_id))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        log = CsvLog(folder / "metrics.csv")
    except OSError as e:
        raise LmTrainError(f"cannot write metrics in {folder}: {e}") from e
    board = _tensorboard(folder / "tensorboard")
    node.hold_steps = True  # a step's receipts wait until its loss and gradients prove finite
    node.expert_spec = lm.expert_spec  # what spot checks recompute hosts' answers with
    poster = ProgressPoster(node.api, node.token, loop, experiment.name)
    last = None
    try:
        for row in train(
            model, corpus, settings, optimizer, log, skippable=SKIPPABLE,
            counters=lambda: call_counters(node), start_step=start, stop=stop, apply=together,
            settle=node.settle_step,
        ):  # fmt: skip
            last = row
            if board is not None:
                for key, value in row.flat().items():
                    if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                        board.add_scalar(key, value, row.step)
                board.flush()
            try:
                store.save(
                    snapshot_state(model, optimizer, {"step": row.step, "experiment": experiment.name})
                )
            except OSError as e:
                raise LmTrainError(
                    f"cannot write a checkpoint in {store.directory} ({e}): training stopped at step "
                    f"{row.step}; the checkpoints already written are kept (--resume continues from them)"
                ) from e
            poster.post(row, lambda: model_sample(model, corpus, SAMPLE_TOKENS))
            c = row.calls
            say(
                (together.describe() if together is not None else "")
                + f"step {row.step}: loss {row.loss:.3f}, val loss {row.val_loss:.3f}, "
                f"{row.tokens_per_s:.0f} tokens/s, {row.skipped_steps} skipped; calls {c.calls_ok} ok, "
                f"{c.calls_failed} failed, {c.calls_late} late; {c.bytes_sent + c.bytes_received} bytes"
            )
    except LossNotFinite as e:
        kept = store.files()
        where = f"the last good checkpoint is {kept[-1]}" if kept else "no checkpoint had been written yet"
        raise LmTrainError(f"{e}; {where} (lower the learning rate, then --resume)") from e
    finally:
        log.close()
        if board is not None:
            board.close()
        poster.flush()
    if last is not None:
        say(f"done at step {last.step}: validation loss {last.val_loss:.3f}; metrics in {folder}")
        if together is not None:
            say(together.summary())
        say("a sample: " + sample_text(model, corpus, 120).replace("\n", " / "))
    return 0


def _tensorboard(folder: Path) -> Any:
    """A SummaryWriter where ``torch.utils.tensorboard`` imports (the ``tensorboard`` extra), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("tensorboard is not installed: metrics go to CSV only")
        return None
    return SummaryWriter(str(folder))
