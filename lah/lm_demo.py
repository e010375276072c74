"""``lah demo --experiment lm``: a language model trained through a local swarm of volunteer processes.

The coordinator runs one experiment of kind ``lm`` (``coordinator.config.LanguageModel``): a GPT of
:class:`~engine.lm.LmConfig` whose mixture blocks are grids of the volunteers' experts. ``volunteers``
processes (:mod:`lah.local_volunteer`) host them; a trainer node in this process builds the model with
remote mixture blocks (:func:`engine.trainer.lm.remote_lm`), trains it on the corpus with
:func:`engine.lm.train` (a batch that a layer could not serve at all is skipped and counted), prints
validation loss every evaluation, and ends with a sample of generated text. The trainer signs
receipts for every answered call, so the volunteers appear on the leaderboard, and posts each
evaluation (and, at the end, the sample) to the coordinator (:mod:`lah.lm_progress`), so the
experiment's page (``/experiments/shakespeare``) draws its curve: no sample is generated for it.

:func:`run_lm` is also the benchmark's (``benchmarks/lm_quality.py``): ``wrap_peer`` stands between the
model's layers and the trainer's Peer (fault and latency injection).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.lm import Corpus, CsvLog, LmConfig, Metrics, TrainSettings, grid_name, train
from engine.swarm import SKIPPABLE
from engine.trainer.lm import call_counters, layer_config, mixtures, remote_lm, trainer_threads

from .lm_progress import ProgressPoster, model_sample
from .local_swarm import LocalSwarm

if TYPE_CHECKING:
    pass

__all__ = ["LmRun", "lm_experiment", "run_lm"]

logger = logging.getLogger(__name__)
EXPERIMENT = "shakespeare"
NO_SAMPLE = "(no sample: pre-tokenized data has no tokenizer to decode one, or the swarm did not answer)"


@dataclass
class LmRun:
    rows: list[Metrics]
    val_loss: float  # the last evaluation's
    tokens_per_s: float  # training tokens per second of the whole run (evaluations included)
    train_tokens: int
    skipped_steps: int
    short_rows: int  # tokens passed through for want of any answer
    requests: dict[str, int]  # "ok" / failure codes, per expert
    served: dict[str, int]  # volunteer name -> expert calls answered
    host_credit: dict[str, float]  # volunteer name -> credit on the coordinator's leaderboard
    cpu_s: dict[str, float]  # process -> CPU seconds (this one's, each volunteer's)
    sample: str
    wall_s: float
    leaderboard_url: str = ""
    hosted: dict[str, int] = field(default_factory=dict)  # volunteer name -> experts hosted
    experiment_url: str = ""  # the experiment's page: the curve and the sample the run posted
    posted: int = 0  # evaluations the coordinator took


def lm_experiment(lm: LmConfig, settings: TrainSettings, *, name: str = EXPERIMENT, digest: str = "") -> Any:
    """The coordinator's experiment for ``lm`` (``ExperimentConfig`` of kind ``lm``)."""
    from coordinator.config import ExperimentConfig, LanguageModel

    return ExperimentConfig(
        name=name,
        kind="lm",
        expert_type="ffn",
        grid=list(lm.grid),
        lm=LanguageModel(
            vocab_size=lm.vocab_size,
            context=lm.context,
            layers=lm.layers,
            heads=lm.heads,
            dim=lm.dim,
            moe_every=lm.moe_every,
            k_best=lm.k_best,
            expert_hidden=lm.expert_spec.hidden or 0,
            batch_size=settings.batch,
            lr=settings.lr,
            tokenizer_digest=digest,
        ),
    )


def run_lm(
    corpus: Corpus,
    lm: LmConfig,
    settings: TrainSettings,
    *,
    volunteers: int = 4,
    folder: Path | None = None,
    wrap_peer: Callable[[Any], Any] | None = None,
    trainer_options: dict[str, Any] | None = None,
    say: Callable[[str], None] = print,
    csv: Path | None = None,
    sample_tokens: int = 200,
    linger: float = 0.0,
) -> LmRun:
    """Train ``lm`` on ``corpus`` through ``volunteers`` volunteer processes (module docstring)."""
    torch.set_num_threads(trainer_threads())
    digest = corpus.tokenizer.digest if corpus.tokenizer is not None else ""
    experiment = lm_experiment(lm, settings, digest=digest)
    cfg = layer_config(lm, EXPERIMENT, **(trainer_options or {}))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lah-lm-") as scratch:
        where = folder or Path(scratch)
        with LocalSwarm([experiment], where, volunteers=volunteers) as swarm:
            say(f"coordinator: {swarm.url} (SQLite in {where})")
            for name, uids in swarm.hosted.items():
                layers = ", ".join(
                    f"{sum(u.startswith(grid_name(EXPERIMENT, b) + '.') for u in uids)} of "
                    f"{grid_name(EXPERIMENT, b)}"
                    for b in lm.moe_blocks
                )
                say(f"{name} hosts {len(uids)} experts ({layers})")
            node = swarm.trainer("trainer", cfg)
            assert node.peer is not None and node.finder is not None
            uids = [
                f"{grid_name(EXPERIMENT, b)}.{i}.{j}"
                for b in lm.moe_blocks
                for i in range(lm.grid[0])
                for j in range(lm.grid[1])
            ]
            seen = swarm.loop.run(node.finder.wait_for_hosts(uids, 60), 70)
            say(f"the trainer finds {seen} of {len(uids)} experts through the DHT")
            peer = node.peer if wrap_peer is None else wrap_peer(node.peer)
            model = remote_lm(peer, node.finder, swarm.loop, lm, EXPERIMENT, cfg, node.observe, settings.seed)
            log = CsvLog(csv) if csv is not None else None
            rows: list[Metrics] = []
            poster = ProgressPoster(node.api, node.token, swarm.loop, EXPERIMENT)
            try:
                for row in train(
                    model,
                    corpus,
                    settings,
                    log=log,
                    skippable=SKIPPABLE,
                    counters=lambda: call_counters(node),
                ):
                    rows.append(row)
                    poster.post(row)  # in the background: the page's curve, no sample (it costs time)
                    c = row.calls
                    say(
                        f"step {row.step}: val loss {row.val_loss:.3f} (train {row.loss:.3f}), "
                        f"{row.tokens_per_s:.0f} tokens/s, {row.skipped_steps} skipped; expert calls "
                        f"{c.calls_ok} ok, {c.calls_failed} failed, {c.calls_late} late"
                    )
            finally:
                if log is not None:
                    log.close()
            last = rows[-1]
            made = model_sample(model, corpus, sample_tokens) if sample_tokens else None
            if made is not None:
                poster.post(last, made)  # the last evaluation again, with the run's sample: it replaces it
            poster.flush()
            sample = made if made is not None else (NO_SAMPLE if sample_tokens else "")
            swarm.loop.run(node.receipts.flush(), 30)
            time.sleep(0.5)
            board = swarm.loop.run(node.api.get("/api/leaderboard?kind=hosts&per_page=100"), 15)
            credit = {
                swarm.volunteer_ids.get(str(e.get("id", "")), str(e.get("id", ""))): float(
                    e.get("credit_total", 0.0)
                )
                for e in board.get("entries", [])
            }
            served = {swarm.volunteer_ids.get(h, h): n for h, n in node.stats.served.items()}
            if linger > 0:
                say(f"leaderboard: {swarm.url}/leaderboard (up for {linger:.0f} s)")
                say(f"the experiment's page: {swarm.url}/experiments/{EXPERIMENT}")
                time.sleep(linger)
            return LmRun(
                rows=rows,
                val_loss=float(last.val_loss if last.val_loss is not None else math.nan),
                tokens_per_s=last.tokens_per_s,
                train_tokens=last.train_tokens,
                skipped_steps=last.skipped_steps,
                short_rows=sum(m.short_rows for m in mixtures(model)),
                requests=dict(node.stats.requests),
                served=dict(sorted(served.items())),
                host_credit=credit,
                cpu_s=swarm.cpu_seconds(),
                sample=sample,
                wall_s=time.monotonic() - started,
                leaderboard_url=f"{swarm.url}/leaderboard",
                hosted={n: len(u) for n, u in swarm.hosted.items()},
                experiment_url=f"{swarm.url}/experiments/{EXPERIMENT}",
                posted=poster.sent,
            )


def demo_main(args: Any) -> int:
    """``lah demo --experiment lm``: the exit status (2 for data that cannot train the model)."""
    from engine.lm import LmError, open_corpus

    from .local_swarm import SwarmError

    try:
        corpus = open_corpus(args.data)
        lm = LmConfig(vocab_size=corpus.vocab_size)
        settings = TrainSettings(steps=args.steps or 300, eval_every=50, eval_batches=10)
        corpus.check_fits(lm.context, settings.batch)
    except LmError as e:
        print(f"lah demo: {e}")
        return 2
    print(
        f"training a {lm.layers}-layer language model on {corpus.name} ({corpus.size_bytes} bytes, "
        f"{corpus.vocab_size} symbols): {len(lm.moe_blocks)} mixture layers of {lm.experts_per_layer} "
        f"experts on {args.volunteers} volunteer processes, {settings.steps} steps",
        flush=True,
    )
    print(f"text: {corpus.describe()}", flush=True)
    try:
        run = run_lm(
            corpus,
            lm,
            settings,
            volunteers=args.volunteers,
            csv=args.csv,
            linger=args.linger if args.linger is not None else 0.0,
            say=lambda line: print(line, flush=True),
        )
    except SwarmError as e:
        print(f"lah demo: the local swarm did not start: {e}")
        return 1
    except KeyboardInterrupt:
        print("lah demo: stopped")
        return 130
    print(f"\nvalidation loss {run.val_loss:.3f} after {run.train_tokens} tokens; a sample:\n")
    print(run.sample, flush=True)
    served = ", ".join(f"{name}: {n}" for name, n in run.served.items())
    print(f"\nexpert calls answered per volunteer: {served}")
    return 0
