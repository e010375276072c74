"""The language model three ways, same architecture, seed, tokens and batches, in one run.

(a) local: ``LocalMixtureOfExperts`` in process (``engine.trainer.lm.local_lm``): the swarm's baseline;
(b) dense: the same transformer with a dense feed-forward block everywhere, of the same FLOPs per token
    (a mixture of ``k`` experts of hidden ``4 d / k`` against one block of hidden ``4 d``);
(c) remote: the same model through a local swarm (``lah.lm_demo.run_lm``): the coordinator, 4 volunteer
    processes over the real WebRTC stack on loopback, each layer's calls to a host as one request; in the
    trainer process, between the model and its Peer, every expert request is delayed by 100 ms and 10%
    of them fail (each request is one host's share of a layer, so a failure drops all of that host's
    experts for the batch: harsher than failing experts one by one).

Character level on the shipped corpus (or ``--data``). The full run is nanoGPT's CPU configuration for
``shakespeare_char`` (batch 12 x 64 tokens, 2,000 steps: 1.5M training tokens, where nanoGPT reports a
validation loss of 1.88 nats); ``--quick`` trains 300 steps. Throughput is training tokens per second
of wall time, evaluations included, each model on this machine's cores: the local models in one process
with a thread per core, the swarm in all its processes (their CPU seconds are printed). Its spread is
over the intervals between evaluations. Targets: ``val_loss_remote`` within 5% of ``val_loss_local``,
the mixture no worse than dense, ``tokens_per_s_remote`` at least a quarter of ``tokens_per_s_local``,
and on a full run ``val_loss_remote`` at most 1.88. The last line is one JSON object.

    .venv/bin/python benchmarks/lm_quality.py --quick   # within 20 minutes on 2 cores
    .venv/bin/python benchmarks/lm_quality.py [--data FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks.dmoe_training import FaultyPeer
from engine.lm import LanguageModel, LmConfig, Metrics, TrainSettings, open_corpus, train
from engine.trainer.lm import local_lm
from lah.lm_demo import run_lm

NANOGPT_VAL_LOSS = 1.88  # nanoGPT's README: 4 layers, 4 heads, 128 wide, context 64, CPU, 2,000 steps
MAX_TRAIN_TOKENS = 1_600_000


def intervals(rows: list[Metrics]) -> list[float]:
    """Training tokens per second between consecutive evaluations (the first from the start)."""
    out, last_t, last_n = [], 0.0, 0
    for r in rows:
        if r.elapsed_s > last_t:
            out.append((r.train_tokens - last_n) / (r.elapsed_s - last_t))
        last_t, last_n = r.elapsed_s, r.train_tokens
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def run_local(model: LanguageModel, corpus: Any, settings: TrainSettings, label: str) -> list[Metrics]:
    rows = []
    for row in train(model, corpus, settings):
        rows.append(row)
        print(
            f"{label} step {row.step}: val loss {row.val_loss:.4f}, {row.tokens_per_s:.0f} tokens/s",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="300 steps: the whole run within 20 minutes")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default 2,000; --quick 300)")
    parser.add_argument("--data", type=Path, help="a text file or folder (default: the shipped corpus)")
    parser.add_argument("--volunteers", type=int, default=4)
    args = parser.parse_args()
    steps = args.steps or (300 if args.quick else 2000)
    settings = TrainSettings(steps=steps, eval_every=100 if args.quick else 250)
    corpus = open_corpus(args.data)
    lm = LmConfig(vocab_size=corpus.vocab_size)
    cores = os.cpu_count() or 1
    print(
        f"corpus {corpus.name}: {corpus.size_bytes} bytes, vocabulary {corpus.vocab_size}; {steps} steps of "
        f"{settings.batch} x {lm.context} tokens; {len(lm.moe_blocks)} mixture layers of "
        f"{lm.experts_per_layer} experts (top {lm.k_best}, hidden {lm.expert_spec.hidden})",
        flush=True,
    )
    t0 = time.monotonic()
    torch.set_num_threads(cores)
    local = run_local(local_lm(lm, settings.seed), corpus, settings, "local")
    torch.manual_seed(settings.seed)
    dense = run_local(LanguageModel(lm.dense_twin()), corpus, settings, "dense")
    faults: list[FaultyPeer] = []

    def wrap(peer: Any) -> FaultyPeer:
        faults.append(FaultyPeer(peer, 0.10, 0.100))
        return faults[-1]

    remote = run_lm(
        corpus, lm, settings, volunteers=args.volunteers, wrap_peer=wrap, sample_tokens=120,
        say=lambda line: print(f"remote {line}", flush=True),
    )  # fmt: skip
    injected = faults[0]
    assert injected.requests > 0 and injected.failed > 0.05 * injected.requests, "faults did not happen"
    print(f"remote sample:\n{remote.sample}\n", flush=True)
    v_local, v_dense, v_remote = local[-1].val_loss, dense[-1].val_loss, remote.val_loss
    assert v_local is not None and v_dense is not None
    tps_local, tps_remote = local[-1].tokens_per_s, remote.tokens_per_s
    gap = (v_remote - v_local) / v_local
    train_tokens = remote.train_tokens
    result = {
        "corpus": corpus.name,
        "corpus_bytes": corpus.size_bytes,
        "vocab_size": corpus.vocab_size,
        "steps": steps,
        "train_tokens": train_tokens,
        "experts_per_layer": lm.experts_per_layer,
        "dmoe_layers": len(lm.moe_blocks),
        "val_loss_local": round(v_local, 4),
        "val_loss_remote": round(v_remote, 4),
        "val_loss_dense": round(v_dense, 4),
        "remote_gap": round(gap, 4),
        "remote_within_5pct": gap <= 0.05,
        "mixture_not_worse_than_dense": v_local <= v_dense and v_remote <= v_dense,
        "tokens_per_s_local": round(tps_local, 1),
        "tokens_per_s_dense": round(dense[-1].tokens_per_s, 1),
        "tokens_per_s_remote": round(tps_remote, 1),
        "tokens_per_s_remote_intervals": spread(intervals(remote.rows)),
        "tokens_per_s_local_intervals": spread(intervals(local)),
        "remote_over_local": round(tps_remote / tps_local, 3),
        "remote_at_least_quarter": tps_remote >= tps_local / 4,
        "cores": cores,
        "cpu_s_remote": {k: round(v, 1) for k, v in remote.cpu_s.items()},
        "injected_requests": injected.requests,
        "injected_failures": injected.failed,
        "injected_delay_s": injected.delay_s,
        "skipped_steps_remote": remote.skipped_steps,
        "tokens_passed_through": remote.short_rows,
        "expert_calls": remote.requests,
        "volunteer_credit": remote.host_credit,
        "nanogpt_val_loss": NANOGPT_VAL_LOSS,
        "full_run_target_met": (
            None
            if train_tokens < 1_000_000
            else v_remote <= NANOGPT_VAL_LOSS and train_tokens <= MAX_TRAIN_TOKENS
        ),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
