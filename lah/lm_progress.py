"""A language model's evaluations, posted to the coordinator for the experiment's page.

``lah train`` (:mod:`lah.train_lm`) posts every evaluation with a short sample of what the model writes;
``lah demo --experiment lm`` (:mod:`lah.lm_demo`) posts every evaluation and, at the end, its last one
again with the run's sample (the coordinator replaces a row at the same tokens). Posts go out on the
trainer node's loop in the order they were made, each bounded by ``timeout_s``: the training thread
never waits for the coordinator, and a post that fails costs a warning, never a step. ``flush`` waits
(bounded) for the posts in flight, before the node stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["ProgressPoster", "model_sample"]

logger = logging.getLogger(__name__)
SAMPLE_TOKENS = 200


class ProgressPoster:
    """``api``: the node's ``CoordinatorApi``; ``token``: its account's token (refreshed as needed);
    ``loop``: the ``LoopThread`` the node runs on."""

    def __init__(
        self,
        api: Any,
        token: Callable[[], Awaitable[str]],
        loop: Any,
        experiment: str,
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self.api, self.token, self.loop, self.experiment = api, token, loop, experiment
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self._lock: asyncio.Lock | None = None  # made on the loop: posts land in the order they were made
        self._pending: list[concurrent.futures.Future[bool]] = []

    def post(self, row: Any, sample: str | Callable[[], str | None] | None = None) -> bool:
        """Send ``row`` (an ``engine.lm.Metrics``) in the background; False when it has nothing to draw
        (no finite validation loss), and nothing is sent. ``sample``: the text, or what makes it, called
        (on this thread, where the model is) only when the row is sent."""
        from engine.account.coordinator_api import progress_report

        if progress_report(row.step, row.train_tokens, row.val_loss, row.tokens_per_s) is None:
            return False
        text = sample() if callable(sample) else sample
        body = progress_report(row.step, row.train_tokens, row.val_loss, row.tokens_per_s, text)
        assert body is not None
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(asyncio.run_coroutine_threadsafe(self._send(body), self.loop.loop))
        return True

    async def _send(self, body: dict[str, Any]) -> bool:
        from engine.account.errors import CoordinatorError, CoordinatorUnreachable

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.api.post_progress(await self.token(), self.experiment, body)
            except (CoordinatorError, CoordinatorUnreachable, TimeoutError) as e:
                self.failed += 1
                logger.warning("evaluation of step %d not posted to the coordinator: %s", body["step"], e)
                return False
            except Exception:  # a bug here must not reach the training loop
                self.failed += 1
                logger.exception("posting the evaluation of step %d failed", body["step"])
                return False
            self.sent += 1
            return True

    def flush(self, timeout_s: float = 15.0) -> None:
        """Wait up to ``timeout_s`` for the posts in flight (those still going then are left to fail)."""
        if self._pending:
            concurrent.futures.wait(self._pending, timeout_s)
        self._pending = [f for f in self._pending if not f.done()]


def model_sample(model: Any, corpus: Any, tokens: int = SAMPLE_TOKENS) -> str | None:
    """``tokens`` of text from ``model``, made where the evaluation was, or None where there is none to
    show (pre-tokenized data, or a swarm that did not answer: the page keeps the previous sample)."""
    from engine.swarm import SKIPPABLE

    from .lm_text import generate_text

    if corpus.tokenizer is None:
        return None
    try:
        return generate_text(model, corpus, tokens).removeprefix("\n")  # the prompt is not the model's
    except SKIPPABLE as e:
        logger.info("no sample this evaluation: the swarm did not answer: %s", e)
        return None
