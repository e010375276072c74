"""Text in, token windows out: the researcher's corpus, checked, split and sampled.

What ``--data`` may name (:func:`open_corpus`):
- a text file, or a folder of text files (read in sorted path order, every one UTF-8 text);
- a folder holding ``train.bin`` and ``val.bin``, pre-tokenized ids as nanoGPT writes them, with a
  ``meta.json`` naming ``vocab_size`` and ``dtype`` (``uint16``, the default, or ``uint32``). They are
  memory-mapped and never read whole: an id beyond the vocabulary is found in the batch that holds it.
- a dataset saved on disk by the optional ``datasets`` library (:mod:`.saved_dataset`: its text column,
  its own train/validation splits where it has them);
- nothing: the corpus shipped with the project (``engine/lm/data/tinyshakespeare.txt``).

The split is fixed and stated: the first 90% of the text (by characters, as nanoGPT's
``shakespeare_char`` cuts it) trains, the last 10% validates. Batches are random windows of
``context + 1`` tokens (inputs and next-token targets), drawn from a seeded generator so a run repeats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataError
from .saved_dataset import is_saved_dataset, read_saved_dataset
from .tokenizer import CharTokenizer, Tokenizer

__all__ = ["DEFAULT_CORPUS", "TRAIN_FRACTION", "Corpus", "open_corpus", "read_text"]

DEFAULT_CORPUS = Path(__file__).parent / "data" / "tinyshakespeare.txt"
TRAIN_FRACTION = 0.9
_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {"uint16": np.uint16, "uint32": np.uint32}


def _text_of(path: Path) -> str:
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise DataError(f"{path} is binary (it holds NUL bytes), not text: give a text file or token files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (byte {e.start} of {len(raw)}): convert it first"
        ) from None


def read_text(path: Path) -> str:
    """A text file, or every file of a folder (sorted, recursively) joined by a blank line."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"{path} holds no files")
        text = "\n\n".join(_text_of(p) for p in files)
    elif path.is_file():
        text = _text_of(path)
    else:
        raise DataError(f"{path} does not exist")
    if not text.strip():
        raise DataError(f"{path} holds no text")
    return text


@dataclass
class Corpus:
    """Token ids of both splits (arrays or memory maps) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    name: str
    size_bytes: int
    tokenizer: Tokenizer | None = None  # None for pre-tokenized files
    split: str = "the first 90% of the text trains, the last 10% validates"

    def describe(self) -> str:
        """One line for a run's log: where the text is, how many tokens each split has, how it is cut."""
        counts = f"{len(self.train):,} training and {len(self.val):,} validation tokens"
        return f"{self.name}: {counts} ({self.split})"

    def check_fits(self, context: int, batch: int) -> None:
        """Each split must hold one window more than a context (and train one batch of them)."""
        need = {"train": context + batch, "validation": context + 1}
        for split, have in (("train", len(self.train)), ("validation", len(self.val))):
            if have < need[split]:
                raise DataError(
                    f"{self.name}: its {split} split has {have} tokens, fewer than the {need[split]} that "
                    f"a context of {context} and a batch of {batch} need: give more text"
                )

    def batch(
        self, split: str, batch: int, context: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` random windows: inputs ``[batch, context]`` and targets shifted by one."""
        data = self.train if split == "train" else self.val
        starts = torch.randint(len(data) - context - 1, (batch,), generator=generator).tolist()
        rows = np.stack([np.asarray(data[s : s + context + 1], dtype=np.int64) for s in starts])
        top = int(rows.max())
        if top >= self.vocab_size:
            where = starts[int(np.argmax(rows.max(axis=1)))]
            raise DataError(
                f"{self.name}: token id {top} near position {where} of the {split} split is beyond the "
                f"vocabulary of {self.vocab_size}"
            )
        window = torch.from_numpy(rows)
        return window[:, :-1], window[:, 1:]


def _from_text(
    text: str, tokenizer: Tokenizer, name: str, size: int, validation: str | None = None
) -> Corpus:
    """``validation``: a held-out text of its own; else the last 10% of ``text`` is."""
    split = Corpus.split
    if validation is None:
        cut = int(len(text) * TRAIN_FRACTION)
        text, validation = text[:cut], text[cut:]
    else:
        split = "its own train and validation splits"
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    train = np.asarray(tokenizer.encode(text), dtype=dtype)
    val = np.asarray(tokenizer.encode(validation), dtype=dtype)
    return Corpus(train, val, tokenizer.vocab_size, name, size, tokenizer, split)


def _from_token_files(folder: Path) -> Corpus:
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(
            f"{meta_path}: token files need a meta.json with vocab_size and dtype ({e})"
        ) from None
    vocab = meta.get("vocab_size") if isinstance(meta, dict) else None
    dtype = _DTYPES.get(meta.get("dtype", "uint16")) if isinstance(meta, dict) else None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1 or dtype is None:
        raise DataError(f"{meta_path}: vocab_size must be a positive int and dtype uint16 or uint32")
    if vocab > np.iinfo(dtype).max + 1:
        raise DataError(f"{meta_path}: a vocabulary of {vocab} does not fit {np.dtype(dtype).name} ids")
    splits = []
    for name in ("train.bin", "val.bin"):
        path = folder / name
        size = path.stat().st_size if path.is_file() else -1
        if size <= 0 or size % np.dtype(dtype).itemsize:
            raise DataError(f"{path}: missing, empty, or not a whole number of {np.dtype(dtype).name} ids")
        splits.append(np.memmap(path, dtype=dtype, mode="r"))
    size = sum(int(s.nbytes) for s in splits)
    return Corpus(splits[0], splits[1], vocab, str(folder), size, None, "train.bin trains, val.bin validates")


def open_corpus(data: Path | None = None, tokenizer: Tokenizer | None = None) -> Corpus:
    """The corpus ``--data`` names (module docstring); text is tokenized by ``tokenizer``, or at
    character level when none is given."""
    path = DEFAULT_CORPUS if data is None else data
    if path.is_dir() and (path / "train.bin").exists():
        return _from_token_files(path)
    if is_saved_dataset(path):
        train, val, name = read_saved_dataset(path)
        size = len(train.encode("utf-8")) + len((val or "").encode("utf-8"))
        return _from_text(train, tokenizer or CharTokenizer.fit(train + (val or "")), name, size, val)
    text = read_text(path)
    return _from_text(text, tokenizer or CharTokenizer.fit(text), str(path), len(text.encode("utf-8")))
