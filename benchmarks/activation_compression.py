"""How far expert calls' activations compress before the language model notices (issue 33, item 2).

The language model (engine/lm, lm_quality's quick settings: 4 layers, 128 wide, 2 mixture layers of
16 x 16 experts, top 4, batch 12 x 64 tokens) trained at equal tokens with every expert call's tensors
passed through the REAL wire codec, both ways and both passes: the trainer's inputs and the host's
outputs (forward), the trainer's output gradients and the host's input gradients (backward), each
``engine.wire.encode_tensor`` then ``decode_tensor`` exactly as a call's message carries it (per expert
call, row blocks as ``encode_message`` picks them). The experts run in process
(``LocalMixtureOfExperts``), so what differs between runs is the codec and the model's wire width only.

Configurations: float16 (what ``wire="float16"`` sends: the uncompressed reference), int8 (``wire="int8"``,
the baseline of the ratios), int4 (``wire="int4"``), and a low-rank boundary (``LmConfig.wire_rank`` r,
engine/moe/low_rank.py) at r = d/2, d/4, d/8, d/16 and d/32 with int8 and with int4. For each: the validation
loss at the end, bytes on the wire per training token (summed payload sizes of every encoded tensor,
all four directions, over the training steps), the ratio of int8's bytes to its bytes, and whether its
loss is within 2% of float16's. ``compression_at_2pct`` is the largest ratio whose loss is.

The reference and the winner are repeated over seeds where ``--seeds`` asks; the JSON gives each
configuration's median and spread.

    .venv/bin/python benchmarks/activation_compression.py [--steps 300] [--seeds 2]
    # on a shared box, in parts: --only float16,int8 --steps 200 > a.log ...; then --combine a.log b.log
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn

from engine.lm import LanguageModel, LmConfig, TrainSettings, open_corpus, train
from engine.moe import LocalMixtureOfExperts
from engine.wire import Compression, decode_tensor, encode_tensor

TOLERANCE = 0.02
TARGET = 16


@dataclass(frozen=True)
class Setting:
    """One run's wire: a format's name, its compression and a low-rank boundary's rank (0: none)."""

    wire: str
    rank: int = 0

    @property
    def label(self) -> str:
        return self.wire if not self.rank else f"{self.wire} r={self.rank}"

    @property
    def compression(self) -> Compression:
        return {"float16": Compression.FLOAT16, "int8": Compression.INT8, "int4": Compression.INT4}[self.wire]


class Counter:
    """Payload bytes of every tensor encoded while training (evaluation passes are not counted)."""

    def __init__(self) -> None:
        self.bytes = 0


def through_wire(t: torch.Tensor, compression: Compression, counter: Counter, count: bool) -> torch.Tensor:
    """``t`` as the receiver decodes it: encoded and decoded by engine.wire, the payload's bytes counted."""
    meta, payload = encode_tensor(t.detach(), compression)
    if count:
        counter.bytes += len(payload)
    return decode_tensor(meta, memoryview(bytearray(payload))).to(t.dtype)


class _Wire(torch.autograd.Function):
    """Identity in autograd's eyes; forward values and backward gradients both cross the wire."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, compression: Compression, counter: Counter, count: bool
    ) -> torch.Tensor:
        ctx.compression, ctx.counter = compression, counter
        return through_wire(x, compression, counter, count)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return through_wire(grad, ctx.compression, ctx.counter, True), None, None, None


class WireExpert(nn.Module):
    """An expert as a trainer reaches it: inputs and their gradients cross the wire one way, outputs
    and theirs the other, each in ``compression``."""

    def __init__(self, expert: nn.Module, compression: Compression, counter: Counter) -> None:
        super().__init__()
        self.expert, self.compression, self.counter = expert, compression, counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = torch.is_grad_enabled()  # training passes only: evaluation runs without gradients
        wire, comp, counter = _Wire.apply, self.compression, self.counter
        sent: torch.Tensor = wire(x, comp, counter, count)  # type: ignore[no-untyped-call]
        back: torch.Tensor = wire(self.expert(sent), comp, counter, count)  # type: ignore[no-untyped-call]
        return back


def build(lm: LmConfig, setting: Setting, counter: Counter, seed: int) -> LanguageModel:
    config = replace(lm, wire_rank=setting.rank)
    torch.manual_seed(seed)

    def mixture(_block: int) -> nn.Module:
        layer = LocalMixtureOfExperts(config.mixture_width, config.grid, config.expert_spec, config.k_best)
        layer.experts = nn.ModuleList(WireExpert(e, setting.compression, counter) for e in layer.experts)
        return layer

    return LanguageModel(config, mixture)


def run(lm: LmConfig, corpus: Any, settings: TrainSettings, setting: Setting, seed: int) -> dict[str, Any]:
    counter = Counter()
    model = build(lm, setting, counter, seed)
    started = time.monotonic()
    rows = list(train(model, corpus, replace(settings, seed=seed)))
    last = rows[-1]
    assert last.val_loss is not None
    tokens = last.train_tokens
    out = {
        "label": setting.label,
        "seed": seed,
        "val_loss": round(last.val_loss, 4),
        "bytes_per_token": round(counter.bytes / tokens, 2),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        f"{setting.label:>14} seed {seed}: val loss {out['val_loss']:.4f}, "
        f"{out['bytes_per_token']:.1f} wire bytes/token, {out['seconds']:.0f} s",
        flush=True,
    )
    print("RUN " + json.dumps(out), flush=True)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    losses = [r["val_loss"] for r in runs]
    return {
        "val_loss": round(statistics.median(losses), 4),
        "val_loss_min": min(losses),
        "val_loss_max": max(losses),
        "seeds": [r["seed"] for r in runs],
        "bytes_per_token": statistics.median(r["bytes_per_token"] for r in runs),
    }


def all_settings(d: int) -> list[Setting]:
    out = [Setting("float16"), Setting("int8"), Setting("int4")]
    for rank in (d // 2, d // 4, d // 8, d // 16, d // 32):
        out += [Setting("int8", rank), Setting("int4", rank)]
    return out


def table(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each configuration's median over seeds, its ratio to int8's bytes, its loss against float16's."""
    out = {label: summary(rs) for label, rs in runs.items()}
    ref = out["float16"]["val_loss"]
    base = out["int8"]["bytes_per_token"]
    for row in out.values():
        row["ratio_vs_int8"] = round(base / row["bytes_per_token"], 2)
        row["loss_vs_float16"] = round(row["val_loss"] / ref - 1, 4)
        row["within_2pct"] = row["val_loss"] <= ref * (1 + TOLERANCE)
    return out


def best(rows: dict[str, dict[str, Any]]) -> str:
    return max((r for r in rows if rows[r]["within_2pct"]), key=lambda r: rows[r]["ratio_vs_int8"])


def report(runs: dict[str, list[dict[str, Any]]], steps: int, tokens: int, d: int, seconds: float) -> None:
    rows = table(runs)
    winner = best(rows)
    print(
        f"\n{'wire':>14} {'val loss':>9} {'(min-max, seeds)':>22} {'vs f16':>7} {'B/token':>8} {'x int8':>7}"
    )
    for label, r in rows.items():
        print(
            f"{label:>14} {r['val_loss']:9.4f} ({r['val_loss_min']:.4f}-{r['val_loss_max']:.4f}, "
            f"{len(r['seeds'])}) {100 * r['loss_vs_float16']:+6.2f}% {r['bytes_per_token']:8.1f} "
            f"{r['ratio_vs_int8']:7.2f}{'' if r['within_2pct'] else '  (over 2%)'}"
        )
    ratio = rows[winner]["ratio_vs_int8"]
    print(f"compression_at_2pct = {ratio} ({winner}); target {TARGET}")
    result = {
        "benchmark": "activation_compression",
        "steps": steps,
        "train_tokens_per_run": tokens,
        "dim": d,
        "compression_at_2pct": ratio,
        "compression_at_2pct_wire": winner,
        "target": TARGET,
        "meets_target": ratio >= TARGET,
        "configs": rows,
        "seconds": round(seconds, 1),
    }
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300, help="steps per run (lm_quality's quick 300)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds for float16, int8 and the winner")
    parser.add_argument("--budget-s", type=float, default=1500.0, help="no repeat seeds past this")
    parser.add_argument("--only", default="", help="run these labels (comma-separated) and print RUN lines")
    parser.add_argument("--seed", type=int, default=0, help="with --only: the seed (default TrainSettings')")
    parser.add_argument("--combine", nargs="*", type=Path, help="report the RUN lines of these logs")
    parser.add_argument("--data", type=Path, help="a text file or folder (default: the shipped corpus)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # on a shared 2-core box, 2 threads run 10x slower than 1 (contention)
    settings = TrainSettings(steps=args.steps, eval_every=args.steps)
    lm = LmConfig(vocab_size=65)  # the shipped corpus' characters; replaced below when a corpus is read
    t0 = time.monotonic()
    if args.combine:
        runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in all_settings(lm.dim)}
        seconds = 0.0
        for log in args.combine:
            for line in log.read_text().splitlines():
                if line.startswith("RUN "):
                    r = json.loads(line[4:])
                    runs[r["label"]].append(r)
                    seconds += r["seconds"]
        runs = {k: v for k, v in runs.items() if v}
        report(runs, args.steps, args.steps * settings.batch * lm.context, lm.dim, seconds)
        return
    corpus = open_corpus(args.data)
    lm = LmConfig(vocab_size=corpus.vocab_size)
    chosen = all_settings(lm.dim)
    if args.only:
        chosen = [s for s in chosen if s.label in args.only.split(",")]
    print(
        f"corpus {corpus.name}; {args.steps} steps of {settings.batch} x {lm.context} tokens; d={lm.dim}, "
        f"{len(lm.moe_blocks)} mixture layers of {lm.experts_per_layer} experts (top {lm.k_best}); "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    seed = args.seed or settings.seed
    runs = {s.label: [run(lm, corpus, settings, s, seed)] for s in chosen}
    if args.only:
        return
    winner = best(table(runs))
    for extra in range(seed + 1, seed + args.seeds):
        for s in chosen:
            if s.label not in ("float16", "int8", winner):
                continue
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: {s.label} seed {extra} not run", flush=True)
                continue
            runs[s.label].append(run(lm, corpus, settings, s, extra))
    report(runs, args.steps, args.steps * settings.batch * lm.context, lm.dim, time.monotonic() - t0)


if __name__ == "__main__":
    main()
