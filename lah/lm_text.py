"""Text from a language model while it trains: a sample after a prompt, decoded by the corpus's
tokenizer. The demo prints one at its end, ``lah train`` at its end, and the progress poster sends one
with each evaluation; a swarm that does not answer during sampling costs the sample, never the run.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.lm import Corpus
from engine.swarm import SKIPPABLE

__all__ = ["generate_text", "sample_text"]


def generate_text(model: Any, corpus: Corpus, tokens: int = 200, prompt: str = "\n", seed: int = 0) -> str:
    """``tokens`` sampled after ``prompt``, decoded (the corpus has a tokenizer); raises ``SKIPPABLE``."""
    assert corpus.tokenizer is not None
    ids = corpus.tokenizer.encode(prompt) or [0]
    idx = torch.tensor([ids], dtype=torch.long)
    out = model.generate(idx, tokens, generator=torch.Generator().manual_seed(seed))
    return str(corpus.tokenizer.decode(out[0].tolist()))


def sample_text(model: Any, corpus: Corpus, tokens: int = 200, prompt: str = "\n", seed: int = 0) -> str:
    """``tokens`` sampled after ``prompt`` (decoded), or a sentence saying why there is none."""
    if corpus.tokenizer is None:
        return "(pre-tokenized data: no tokenizer to decode a sample with)"
    try:
        return generate_text(model, corpus, tokens, prompt, seed)
    except SKIPPABLE as e:
        return f"(no sample: the swarm did not answer: {e})"
