"""benchmarks/activation_compression.py's helpers: the bytes it counts are the codec's, gradients cross
the wire too, and compression_at_2pct is the largest ratio within 2% of float16."""

from __future__ import annotations

import torch

from benchmarks.activation_compression import (
    Counter,
    Setting,
    WireExpert,
    all_settings,
    best,
    table,
    through_wire,
)
from engine.wire import Compression


def test_through_wire_counts_the_payload_and_returns_the_decoded_tensor() -> None:
    x = torch.randn(12, 128)
    counter = Counter()
    y = through_wire(x, Compression.INT8, counter, True)
    assert counter.bytes == 12 * (128 + 4)  # a float32 scale per row of 128
    assert 0 < float((y - x).abs().max()) <= float(x.abs().max()) / 127
    through_wire(x, Compression.INT4, counter, False)
    assert counter.bytes == 12 * (128 + 4)


def test_a_wire_expert_sends_inputs_outputs_and_both_gradients() -> None:
    counter = Counter()
    expert = WireExpert(torch.nn.Linear(128, 128), Compression.FLOAT16, counter)
    x = torch.randn(4, 128, requires_grad=True)
    expert(x).sum().backward()
    assert counter.bytes == 4 * 4 * 128 * 2
    assert x.grad is not None
    with torch.no_grad():
        expert(x)
    assert counter.bytes == 4 * 4 * 128 * 2  # evaluation is not counted


def test_the_largest_ratio_within_two_percent_wins() -> None:
    def run(label: str, loss: float, nbytes: float) -> list[dict[str, object]]:
        return [{"label": label, "seed": 1, "val_loss": loss, "bytes_per_token": nbytes}]

    rows = table(
        {
            "float16": run("float16", 2.00, 8000),
            "int8": run("int8", 2.01, 4000),
            "int4 r=16": run("int4 r=16", 2.04, 250),
            "int4 r=8": run("int4 r=8", 2.05, 125),
        }
    )
    assert rows["int4 r=16"]["ratio_vs_int8"] == 16.0 and rows["int4 r=16"]["within_2pct"]
    assert not rows["int4 r=8"]["within_2pct"]
    assert best(rows) == "int4 r=16"


def test_the_settings_cover_the_issue_ranks_with_both_codecs() -> None:
    labels = [s.label for s in all_settings(128)]
    assert labels[:3] == ["float16", "int8", "int4"]
    assert {"int8 r=64", "int4 r=64", "int8 r=32", "int4 r=32", "int8 r=16", "int4 r=16"} <= set(labels)
    assert Setting("int4", 16).compression == Compression.INT4
