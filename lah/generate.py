"""``lah generate``: text from a model file ``lah export`` wrote, on this machine alone.

The file is loaded into a plain :class:`~engine.lm.LanguageModel` whose mixture blocks hold every
expert in process (:func:`engine.lm.model_file.read_model_file`: no swarm, no network, nothing executed
from the file), after every tensor's name, dtype and shape has been checked against the model its config
describes and every expert's bytes against the digest recorded when it was gathered. The prompt is
encoded with the tokenizer the file holds (or ``--tokenizer``, checked against the file's digest); the
continuation is sampled with ``--temperature`` and ``--top-k`` from a generator seeded with ``--seed``,
so one file, prompt and seed always print the same text.

Exit status: 0 printed; 2 a file or prompt that cannot be used (missing, not safetensors, not a model
lah export wrote, tensors that do not fit, symbols outside the tokenizer), said in one sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["run_generate"]

SMALL_MODEL_PARAMS = 20_000_000


def run_generate(
    model: Path,
    prompt: str,
    *,
    tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
    tokenizer: Path | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Print the prompt and its continuation; the exit status (module docstring)."""
    import torch

    from engine.lm import LmError
    from engine.lm.model_file import read_model_file
    from engine.lm.tokenizer import load

    try:
        given = load(tokenizer) if tokenizer is not None else None
        loaded = read_model_file(model, given)
    except LmError as e:
        say(f"lah generate: {e}")
        return 2
    try:
        ids = loaded.tokenizer.encode(prompt)
    except LmError as e:
        say(f"lah generate: the prompt cannot be encoded: {e}")
        return 2
    if not ids:
        say("lah generate: the prompt encodes to no tokens: give at least one symbol")
        return 2
    # One sequence at a time: small models' matrices are too small to share out; threads only contend.
    if sum(p.numel() for p in loaded.model.parameters()) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
    out = loaded.model.eval().generate(
        torch.tensor([ids], dtype=torch.long),
        tokens,
        temperature=temperature,
        top_k=top_k or None,
        generator=torch.Generator().manual_seed(seed),
    )
    say(loaded.tokenizer.decode(out[0].tolist()))
    return 0
