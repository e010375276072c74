"""engine.lm's text in: the shipped corpus and its stated split, every kind of --data, every tokenizer,
and each bad input refused with a sentence (empty, binary, too short, ids beyond the vocabulary, a
tokenizer that differs from the experiment's)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.lm import (
    DEFAULT_CORPUS,
    BpeTokenizer,
    ByteTokenizer,
    CharTokenizer,
    DataError,
    TokenizerMismatch,
    check_same,
    open_corpus,
)
from engine.lm import tokenizer as tokenizers


def test_the_shipped_corpus_is_the_published_one_with_its_split() -> None:
    assert hashlib.sha256(DEFAULT_CORPUS.read_bytes()).hexdigest() == (
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    )
    corpus = open_corpus()
    assert (len(corpus.train), len(corpus.val), corpus.vocab_size) == (1_003_854, 111_540, 65)
    assert corpus.tokenizer is not None
    assert corpus.tokenizer.decode(corpus.train[:14].tolist()) == "First Citizen:"


def test_batches_are_next_token_windows_and_repeat_with_the_seed() -> None:
    corpus = open_corpus()
    x, y = corpus.batch("train", 4, 16, torch.Generator().manual_seed(3))
    x2, _ = corpus.batch("train", 4, 16, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (4, 16) and torch.equal(x, x2)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_a_folder_of_text_files_is_read_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second " * 200)
    (tmp_path / "a.txt").write_text("first " * 200)
    corpus = open_corpus(tmp_path)
    assert corpus.tokenizer is not None
    assert corpus.tokenizer.decode(corpus.train[:6].tolist()) == "first "


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "holds no text"),
        (b"   \n\n", "holds no text"),
        (b"abc\x00def", "binary"),
        (b"\xff\xfe abc", "not UTF-8"),
    ],
)
def test_bad_text_is_refused_with_a_sentence(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=why):
        open_corpus(path)


def test_missing_data_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        open_corpus(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="holds no files"):
        open_corpus(tmp_path)


def test_text_too_short_for_one_context_and_batch(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("to be or not to be " * 5)
    corpus = open_corpus(path)
    with pytest.raises(DataError, match=r"fewer than the .* that a context of 64 and a batch of 12 need"):
        corpus.check_fits(64, 12)


def _token_files(folder: Path, train: np.ndarray, val: np.ndarray, meta: object) -> None:
    folder.mkdir(exist_ok=True)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps(meta))


def test_pre_tokenized_files_are_memory_mapped(tmp_path: Path) -> None:
    _token_files(
        tmp_path,
        np.arange(5000, dtype=np.uint16) % 300,
        np.arange(500, dtype=np.uint16),
        {"vocab_size": 1000},
    )
    corpus = open_corpus(tmp_path)
    assert isinstance(corpus.train, np.memmap) and corpus.vocab_size == 1000 and corpus.tokenizer is None
    x, y = corpus.batch("train", 2, 8, torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64 and int(x.max()) < 300 and torch.equal(x[:, 1:], y[:, :-1])


def test_uint32_token_files(tmp_path: Path) -> None:
    _token_files(
        tmp_path,
        np.full(400, 70_000, np.uint32),
        np.full(100, 3, np.uint32),
        {"vocab_size": 80_000, "dtype": "uint32"},
    )
    x, _ = open_corpus(tmp_path).batch("train", 1, 8, torch.Generator())
    assert int(x[0, 0]) == 70_000


def test_ids_beyond_the_vocabulary_are_found_in_their_batch(tmp_path: Path) -> None:
    _token_files(tmp_path, np.full(400, 999, np.uint16), np.zeros(100, np.uint16), {"vocab_size": 500})
    with pytest.raises(DataError, match=r"token id 999 .* beyond the vocabulary of 500"):
        open_corpus(tmp_path).batch("train", 2, 8, torch.Generator())


@pytest.mark.parametrize(
    "meta, why",
    [
        ({}, "vocab_size must be"),
        ({"vocab_size": 10, "dtype": "float32"}, "vocab_size must be"),
        ({"vocab_size": 70_000}, "does not fit uint16"),
    ],
)
def test_bad_token_metadata(tmp_path: Path, meta: object, why: str) -> None:
    _token_files(tmp_path, np.zeros(100, np.uint16), np.zeros(10, np.uint16), meta)
    with pytest.raises(DataError, match=why):
        open_corpus(tmp_path)


def test_token_files_of_odd_size(tmp_path: Path) -> None:
    _token_files(tmp_path, np.zeros(100, np.uint16), np.zeros(10, np.uint16), {"vocab_size": 10})
    (tmp_path / "val.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match=r"val\.bin: missing, empty, or not a whole number"):
        open_corpus(tmp_path)


def test_char_and_byte_tokenizers_round_trip() -> None:
    text = "O Romeo, Romeo! wherefore art thou Romeo?"
    char = CharTokenizer.fit(text)
    assert char.decode(char.encode(text)) == text and char.vocab_size == len(set(text))
    with pytest.raises(DataError, match="not in this tokenizer's vocabulary"):
        char.encode("Juliet")
    byte = ByteTokenizer()
    assert byte.decode(byte.encode("naïve \u2013 ok")) == "naïve \u2013 ok"


def test_bpe_is_trained_here_saved_and_loaded_alike(tmp_path: Path) -> None:
    text = DEFAULT_CORPUS.read_text()[:200_000]
    bpe = BpeTokenizer.train([text], vocab_size=512)
    assert bpe.vocab_size == 512
    ids = bpe.encode("Before we proceed any further, hear me speak.")
    assert len(ids) < 40 and bpe.decode(ids) == "Before we proceed any further, hear me speak."
    path = tmp_path / "tokenizer.json"
    tokenizers.save(bpe, path)
    again = tokenizers.load(path)
    assert again.digest == bpe.digest and again.encode("hear me") == bpe.encode("hear me")
    check_same(again, bpe.digest)


def test_a_tokenizer_that_differs_from_the_experiments_is_refused() -> None:
    ours = CharTokenizer.fit("abc")
    with pytest.raises(TokenizerMismatch, match="differs from the experiment's"):
        check_same(CharTokenizer.fit("abd"), ours.digest)
    for tok in (ours, ByteTokenizer()):
        assert tokenizers.parse(tok.to_json()).digest == tok.digest


@pytest.mark.parametrize(
    "text", ["not json", "[]", '{"kind": "sentencepiece"}', '{"kind": "bpe", "tokenizer": {"x": 1}}']
)
def test_a_file_that_is_no_tokenizer(text: str) -> None:
    with pytest.raises(DataError, match="tokenizer"):
        tokenizers.parse(text)
