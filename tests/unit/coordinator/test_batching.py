"""coordinator.hub.batching.Batcher: many callers, one run per batch, one batch at a time, in order."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.hub.batching import Batcher, BatchError


class Recorder:
    """A ``run`` that records its batches and answers key * 10 (after ``delay``)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.running = 0
        self.most_at_once = 0
        self.fail_next: Exception | None = None

    async def __call__(self, keys: list[int]) -> list[int]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.batches.append(list(keys))
            await asyncio.sleep(self.delay)
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            return [k * 10 for k in keys]
        finally:
            self.running -= 1


async def test_concurrent_callers_share_one_run_and_get_their_own_answers() -> None:
    run = Recorder()
    batcher = Batcher(run, window_s=0.01)
    answers = await asyncio.gather(*(batcher.get(k) for k in range(50)))
    assert answers == [k * 10 for k in range(50)]
    assert run.batches == [list(range(50))]
    assert batcher.batches == 1 and batcher.largest == 50


async def test_batches_never_overlap_and_keep_the_order_asked() -> None:
    run = Recorder(delay=0.05)
    batcher = Batcher(run, window_s=0.0)

    async def later(k: int, wait: float) -> int:
        await asyncio.sleep(wait)
        return await batcher.get(k)

    # 1 starts a batch; 2, 3, 2 come while it runs and form the next one, repeats included, in order.
    answers = await asyncio.gather(later(1, 0), later(2, 0.01), later(3, 0.02), later(2, 0.03))
    assert answers == [10, 20, 30, 20]
    assert run.batches == [[1], [2, 3, 2]]
    assert run.most_at_once == 1


async def test_a_batch_over_the_cap_is_split() -> None:
    run = Recorder()
    batcher = Batcher(run, window_s=0.01, max_batch=4)
    answers = await asyncio.gather(*(batcher.get(k) for k in range(10)))
    assert answers == [k * 10 for k in range(10)]
    assert [len(b) for b in run.batches] == [4, 4, 2]
    assert [k for b in run.batches for k in b] == list(range(10))


async def test_a_failed_batch_fails_its_callers_and_the_next_batch_runs_afresh() -> None:
    run = Recorder()
    batcher = Batcher(run, window_s=0.01)
    run.fail_next = ConnectionError("database away")
    results = await asyncio.gather(*(batcher.get(k) for k in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert await batcher.get(7) == 70


async def test_a_cancelled_caller_does_not_cancel_the_others() -> None:
    run = Recorder(delay=0.05)
    batcher = Batcher(run, window_s=0.0)
    impatient = asyncio.ensure_future(batcher.get(1))
    patient = asyncio.ensure_future(batcher.get(2))
    await asyncio.sleep(0.01)
    impatient.cancel()
    assert await patient == 20
    assert impatient.cancelled()


async def test_an_answer_of_the_wrong_length_is_a_batch_error() -> None:
    async def short(keys: list[int]) -> list[int]:
        return keys[:-1]

    batcher = Batcher(short, window_s=0.0)
    with pytest.raises(BatchError):
        await asyncio.gather(batcher.get(1), batcher.get(2))


async def test_close_cancels_the_running_batch_and_the_waiting_callers() -> None:
    run = Recorder(delay=10.0)
    batcher = Batcher(run, window_s=0.0)
    first = asyncio.ensure_future(batcher.get(1))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(batcher.get(2))
    await asyncio.sleep(0.01)
    await batcher.close()
    for future in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await future


def test_bad_settings_are_refused() -> None:
    async def run(keys: list[int]) -> list[int]:
        return keys

    with pytest.raises(ValueError):
        Batcher(run, window_s=-1.0)
    with pytest.raises(ValueError):
        Batcher(run, max_batch=0)
