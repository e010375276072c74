"""The language model: text in, a decoder-only transformer with mixture-of-experts blocks, a loop.

Layers, bottom up (each imports only those below it, and engine.moe for its experts; model_file also
engine.wire's finiteness check)::

    errors.py      the exception tree (LmError: DataError, TokenizerMismatch, ConfigError, ModelFileError,
                   LossNotFinite)
    tokenizer.py   characters, bytes, or BPE (``tokenizers``): plain data with a sha256 an experiment names
    saved_dataset.py  a folder the optional ``datasets`` library saved (load_from_disk, offline): text
    corpus.py      --data: a text file or folder, nanoGPT's train.bin/val.bin (memory-mapped), a saved
                   dataset, or the shipped corpus (data/tinyshakespeare.txt, provenance in
                   data/README.md); the fixed 90/10 split; random windows of context + 1 tokens
    model.py       LmConfig and LanguageModel: a GPT whose mixture blocks route every token through any
                   [tokens, dim] module (remote volunteers or LocalMixtureOfExperts), tied head, generate()
    loop.py        the training loop: evaluation, metrics rows (CSV), a stop at the first non-finite loss
    model_file.py  one safetensors file holding a whole model (dense part, every expert, config,
                   tokenizer): ``lah export`` writes it, a local model loads it after checking every tensor

A researcher's own model uses :class:`~engine.moe.RemoteMixtureOfExperts` the same way
:class:`LanguageModel` does: as an ``nn.Module`` over ``[tokens, dim]``.

May import: engine.moe, engine.wire
"""

from __future__ import annotations

from .corpus import DEFAULT_CORPUS, TRAIN_FRACTION, Corpus, open_corpus, read_text
from .errors import (
    ConfigError,
    DataError,
    GradientNotFinite,
    LmError,
    LossNotFinite,
    ModelFileError,
    TokenizerMismatch,
)
from .loop import CallCounters, CsvLog, Metrics, TrainSettings, evaluate, train
from .model import LanguageModel, LmConfig, grid_name
from .tokenizer import BpeTokenizer, ByteTokenizer, CharTokenizer, Tokenizer, check_same

__all__ = [
    "DEFAULT_CORPUS",
    "TRAIN_FRACTION",
    "BpeTokenizer",
    "ByteTokenizer",
    "CallCounters",
    "CharTokenizer",
    "ConfigError",
    "Corpus",
    "CsvLog",
    "DataError",
    "GradientNotFinite",
    "LanguageModel",
    "LmConfig",
    "LmError",
    "LossNotFinite",
    "Metrics",
    "ModelFileError",
    "Tokenizer",
    "TokenizerMismatch",
    "TrainSettings",
    "check_same",
    "evaluate",
    "grid_name",
    "open_corpus",
    "read_text",
    "train",
]
