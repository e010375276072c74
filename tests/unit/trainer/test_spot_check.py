"""Spot checks judge a host only against its own state at the version it stated: an honest answer
(float16 or int8 on the wire) passes, a perturbed row is reported, a version that moved on or is
unknown is inconclusive and never a flag."""

from __future__ import annotations

import asyncio
import random
import time

import torch

from engine.moe.layer_calls import CallRecord
from engine.moe.registry import ExpertSpec, build
from engine.moe.weights import ExpertState, weights_digest
from engine.trainer.spot_check import WIRE_TOLERANCE, SpotChecker, mismatch, row_error
from engine.wire import dequantize_int8, quantize_int8

SPEC = ExpertSpec("ffn", 8, hidden=16)
HOST = "ab" * 20


def _state(module: torch.nn.Module, steps: int) -> ExpertState:
    sd = module.state_dict()
    names, tensors = list(sd), [v.detach().clone() for v in sd.values()]
    return ExpertState("ffn.0.0", HOST, tuple(names), tuple(tensors), steps, weights_digest(names, tensors))


def _record(inputs: torch.Tensor, outputs: torch.Tensor, version: int) -> CallRecord:
    return CallRecord(
        "ffn.0.0",
        HOST,
        len(inputs),
        False,
        True,
        "",
        time.time(),
        0.01,
        inputs,
        outputs,
        "0" * 32,
        None,
        version,
    )


class Harness:
    def __init__(self, steps: int = 5) -> None:
        torch.manual_seed(0)
        self.module = build(SPEC)
        self.steps = steps
        self.reports: list[tuple[str, str, str]] = []
        self.checker = SpotChecker(self.fetch, lambda uid: SPEC, self.report, fraction=1.0, max_in_flight=64)

    async def fetch(self, host: str, uid: str) -> ExpertState:
        return _state(self.module, self.steps)

    async def report(self, host: str, uid: str, start: float, end: float, reason: str) -> None:
        assert start < end
        self.reports.append((host, uid, reason))

    def answer(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(x.float()).half()  # as the host replies: float16

    async def run(self, record: CallRecord) -> None:
        self.checker.consider(record)
        await asyncio.gather(*self.checker._tasks)


async def test_honest_answers_pass_on_either_wire_format() -> None:
    h = Harness()
    for _ in range(20):
        x = torch.randn(32, 8).half()
        await h.run(_record(x, h.answer(x), 5))
        y = h.answer(x).float()
        await h.run(_record(x, dequantize_int8(*quantize_int8(y), torch.float32).view_as(y), 5))
    assert (h.checker.stats.checked, h.checker.stats.mismatches, h.reports) == (40, 0, [])


async def test_one_perturbed_row_is_reported_with_the_version_and_digest() -> None:
    h = Harness()
    x = torch.randn(32, 8).half()
    out = h.answer(x)
    out[7] += out[7].float().norm().half() * 0.1 / (8**0.5)  # one row in 32, by about a tenth of itself
    await h.run(_record(x, out, 5))
    assert h.checker.stats.mismatches == 1 and h.checker.stats.reported == 1
    host, uid, reason = h.reports[0]
    assert (host, uid) == (HOST, "ffn.0.0")
    assert "its own state at version 5" in reason and _state(h.module, 5).digest[:12] in reason


async def test_a_moved_or_unknown_version_is_inconclusive_never_a_flag() -> None:
    h = Harness(steps=6)
    x = torch.randn(4, 8).half()
    garbage = torch.randn(4, 8).half()
    await h.run(_record(x, garbage, 5))  # the host stepped before its state was read
    await h.run(_record(x, garbage, -1))  # the host could not say which version answered
    s = h.checker.stats
    assert (s.inconclusive, s.checked, s.mismatches, h.reports) == (2, 0, 0, [])


async def test_a_state_that_cannot_be_fetched_fails_the_check_alone() -> None:
    h = Harness()

    async def gone(host: str, uid: str) -> ExpertState:
        raise ConnectionError("host left")

    h.checker.fetch_state = gone
    x = torch.randn(4, 8).half()
    await h.run(_record(x, torch.randn(4, 8).half(), 5))
    assert (h.checker.stats.failed, h.checker.stats.mismatches, h.reports) == (1, 0, [])


async def test_only_a_fraction_is_checked_and_backward_or_failed_calls_never() -> None:
    h = Harness()
    h.checker.fraction, h.checker.rng = 0.1, random.Random(0)
    x = torch.randn(4, 8).half()
    for _ in range(1000):
        h.checker.consider(_record(x, h.answer(x), 5))
    await asyncio.gather(*h.checker._tasks)
    assert 60 < h.checker.stats.checked + h.checker.stats.skipped < 140
    h.checker.fraction = 1.0
    before = h.checker.stats.checked
    rec = _record(x, h.answer(x), 5)
    for other in (
        CallRecord("ffn.0.0", HOST, 4, True, True, "", 0.0, 0.0, x, h.answer(x)),
        CallRecord("ffn.0.0", HOST, 4, False, False, "timeout", 0.0, 0.0, x, None),
    ):
        await h.run(other)
    assert h.checker.stats.checked == before
    await h.run(rec)
    assert h.checker.stats.checked == before + 1


def test_row_error() -> None:
    a = torch.ones(4, 3)
    assert row_error(a, a) == 0.0
    b = a.clone()
    b[2] *= 2
    assert row_error(a, b) == 0.5
    assert row_error(a, torch.ones(4, 2)) == float("inf")
    b[0, 0] = float("nan")
    assert mismatch(a, b, 10.0)
    assert row_error(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0


async def test_each_wire_formats_tolerance_passes_honest_answers_and_catches_noise() -> None:
    from engine.wire.compression import dequantize_int4, quantize_int4

    torch.manual_seed(1)
    module = build(ExpertSpec("ffn", 64, hidden=256))
    for _ in range(20):
        y = module(torch.randn(64, 64) * 3).detach()
        scales, q = quantize_int4(y)
        back = dequantize_int4(scales, q, y.numel(), torch.float32).view_as(y)
        assert not mismatch(y, back, WIRE_TOLERANCE["int4"])
        noisy = back.clone()
        noisy[5] += torch.randn_like(noisy[5]) * noisy[5].norm() / 8
        assert mismatch(y, noisy, WIRE_TOLERANCE["int4"])
