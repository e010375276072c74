"""The CPU cap between batches: rest after work, shared by every pool of a node, never on the results."""

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from engine.moe.batching import DutyCycle, TaskPool
from engine.resources import Settings
from engine.resources.limits import cpu_pause_after


def busy(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    until = time.perf_counter() + 0.02  # 20 ms of compute per batch
    while time.perf_counter() < until:
        pass
    return [batch[0] * 2]


async def run(duty: DutyCycle | None, n: int) -> float:
    with ThreadPoolExecutor(1) as executor:
        pool = TaskPool("t", busy, executor, max_wait_s=0.0, duty=duty)
        t0 = time.monotonic()
        for _ in range(n):  # one request at a time: one batch each
            out = await pool.submit(torch.ones(1, 4))
            assert torch.equal(out[0], torch.full((1, 4), 2.0))
        elapsed = time.monotonic() - t0
        await pool.drain(5)
    return elapsed


async def test_duty_cycle_keeps_compute_under_its_share() -> None:
    free = await run(None, 10)
    duty = DutyCycle(lambda b: 3 * b)  # a 25% share: rest three times as long as it worked
    capped = await run(duty, 10)
    assert duty.rested_s >= 9 * 3 * 0.02 * 0.9  # the last batch's rest comes after the run
    assert capped >= free + 0.45, (free, capped)


def test_rest_follows_the_volunteers_cap() -> None:
    settings = Settings(cpu_threads=2, cpu_max_percent=25)
    # 2 threads busy for 1 s on a 4-core machine is 50%; to stay under 25% rest another 1 s.
    assert abs(cpu_pause_after(1.0, settings, cpu_count=4) - 1.0) < 1e-9
    assert cpu_pause_after(1.0, Settings(cpu_threads=1, cpu_max_percent=50), cpu_count=2) == 0.0
