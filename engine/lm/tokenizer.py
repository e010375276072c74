"""Tokenizers: characters, bytes, or BPE trained offline with the ``tokenizers`` library.

Every trainer of an experiment must cut text into the same ids, or their gradients mean different
things. So a tokenizer is plain data with one canonical JSON form (:meth:`Tokenizer.to_json`), and its
sha256 (:attr:`Tokenizer.digest`) is what an experiment's config names; :func:`check_same` refuses any
other with a sentence. Nothing here runs code from a file: a saved tokenizer is a vocabulary (characters)
or ``tokenizers``' own JSON (merges and vocabulary), never a pickle.

Which to use: characters for a small corpus in one script (65 symbols for the default corpus, as
nanoGPT's ``shakespeare_char``); bytes when the text's alphabet is not known in advance (256 ids, any
UTF-8); BPE (:meth:`BpeTokenizer.train`) for larger corpora, where fewer, longer tokens make each context
reach further.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from .errors import DataError, TokenizerMismatch

__all__ = ["BpeTokenizer", "ByteTokenizer", "CharTokenizer", "Tokenizer", "check_same", "load", "parse"]


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_json(self) -> str: ...

    @property
    def digest(self) -> str: ...


def _digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


class CharTokenizer:
    """One id per distinct character of the corpus, in code point order (nanoGPT's ``shakespeare_char``)."""

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars = sorted(set(chars))
        if not self.chars or any(len(c) != 1 for c in self.chars):
            raise DataError("a character tokenizer needs at least one character, each a single one")
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(set(text))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as e:
            raise DataError(
                f"character {e.args[0]!r} is not in this tokenizer's vocabulary of {self.vocab_size}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "chars": "".join(self.chars)}, ensure_ascii=False)

    @property
    def digest(self) -> str:
        return _digest(self.to_json())


class ByteTokenizer:
    """UTF-8 bytes: 256 ids, any text, nothing to fit."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind})

    @property
    def digest(self) -> str:
        return _digest(self.to_json())


class BpeTokenizer:
    """Byte-level BPE (GPT-2's scheme) from the ``tokenizers`` library, trained on the researcher's text."""

    kind = "bpe"

    def __init__(self, inner: object) -> None:
        self._inner = inner

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> BpeTokenizer:
        """Learn merges from ``texts`` on this machine (nothing is fetched)."""
        from tokenizers import Tokenizer as HfTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if not 256 < vocab_size <= 1 << 20:
            raise DataError(f"a BPE vocabulary must hold 257 to 1,048,576 tokens, not {vocab_size}")
        tok = HfTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, text: str) -> BpeTokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        try:
            return cls(HfTokenizer.from_str(text))
        except Exception as e:  # tokenizers raises its own Exception type for any bad file
            raise DataError(f"not a tokenizers JSON file: {e}") from None

    @property
    def vocab_size(self) -> int:
        size: int = self._inner.get_vocab_size()  # type: ignore[attr-defined]
        return size

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._inner.encode(text).ids  # type: ignore[attr-defined]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._inner.decode(list(ids))  # type: ignore[attr-defined]
        return text

    def to_json(self) -> str:
        inner: str = self._inner.to_str()  # type: ignore[attr-defined]
        return json.dumps({"kind": self.kind, "tokenizer": json.loads(inner)}, sort_keys=True)

    @property
    def digest(self) -> str:
        return _digest(self.to_json())


def parse(text: str) -> Tokenizer:
    """A tokenizer from :meth:`Tokenizer.to_json`'s form."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"not a tokenizer file (JSON): {e}") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "char" and isinstance(data.get("chars"), str):
        return CharTokenizer(data["chars"])
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe" and isinstance(data.get("tokenizer"), dict):
        return BpeTokenizer.from_json(json.dumps(data["tokenizer"]))
    raise DataError(f"not a tokenizer file: kind {kind!r} (char, byte or bpe)")


def load(path: Path) -> Tokenizer:
    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read tokenizer {path}: {e}") from None


def save(tokenizer: Tokenizer, path: Path) -> None:
    """Written whole or not at all (a crash leaves the old file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tokenizer.to_json(), encoding="utf-8")
    tmp.replace(path)


def check_same(tokenizer: Tokenizer, expected_digest: str) -> None:
    """Refuse a tokenizer other than the experiment's: its ids would mean other text."""
    if tokenizer.digest != expected_digest:
        raise TokenizerMismatch(
            f"this tokenizer ({tokenizer.kind}, sha256 {tokenizer.digest[:12]}) differs from the "
            f"experiment's (sha256 {expected_digest[:12]}): train with the experiment's tokenizer file, "
            "or every trainer's tokens would mean different text"
        )
