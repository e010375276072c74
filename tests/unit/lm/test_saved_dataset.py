"""--data as a dataset saved on disk by the ``datasets`` library: built here from local files, opened
offline, its text column and splits used as stated, and each bad folder refused with a sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import datasets  # the datasets extra: make test installs it
import pytest

from engine.lm import DataError, open_corpus
from engine.lm.saved_dataset import is_saved_dataset

LINES = [f"line {i}: to be, or not to be, that is the question." for i in range(200)]


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no cache outside the test


def test_a_dataset_built_from_local_text_files_trains_90_10(tmp_path: Path) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(LINES), encoding="utf-8")
    built = datasets.load_dataset(
        "text", data_files=str(source), split="train", cache_dir=str(tmp_path / "c")
    )
    saved = tmp_path / "saved"
    built.save_to_disk(str(saved))
    assert is_saved_dataset(saved)

    corpus = open_corpus(saved)

    joined = "\n\n".join(LINES)
    cut = int(len(joined) * 0.9)
    assert corpus.tokenizer is not None
    assert corpus.tokenizer.decode(corpus.train.tolist()) == joined[:cut]
    assert corpus.tokenizer.decode(corpus.val.tolist()) == joined[cut:]
    assert "split 90/10" in corpus.name and "first 90%" in corpus.describe()


def test_a_dataset_dict_keeps_its_own_train_and_validation_splits(tmp_path: Path) -> None:
    train = datasets.Dataset.from_dict({"id": list(range(100)), "text": LINES[:100]})
    val = datasets.Dataset.from_dict({"id": list(range(20)), "text": LINES[100:120]})
    saved = tmp_path / "dict"
    datasets.DatasetDict({"train": train, "validation": val}).save_to_disk(str(saved))

    corpus = open_corpus(saved)

    assert corpus.tokenizer is not None
    assert corpus.tokenizer.decode(corpus.val.tolist()) == "\n\n".join(LINES[100:120])
    assert corpus.tokenizer.decode(corpus.train.tolist()) == "\n\n".join(LINES[:100])
    assert "train / validation" in corpus.name and corpus.split == "its own train and validation splits"


def test_the_only_string_column_is_the_text(tmp_path: Path) -> None:
    saved = tmp_path / "body"
    datasets.Dataset.from_dict({"n": list(range(50)), "body": LINES[:50]}).save_to_disk(str(saved))
    corpus = open_corpus(saved)
    assert corpus.tokenizer is not None
    assert corpus.tokenizer.decode(corpus.train[:7].tolist()) == "line 0:"


def test_bad_saved_datasets_are_refused_with_a_sentence(tmp_path: Path) -> None:
    two = tmp_path / "two"
    datasets.Dataset.from_dict({"a": ["x"] * 5, "b": ["y"] * 5}).save_to_disk(str(two))
    with pytest.raises(DataError, match="several text columns and none called 'text': a, b"):
        open_corpus(two)

    numbers = tmp_path / "numbers"
    datasets.Dataset.from_dict({"n": [1, 2, 3]}).save_to_disk(str(numbers))
    with pytest.raises(DataError, match="has no text column"):
        open_corpus(numbers)

    blank = tmp_path / "blank"
    datasets.Dataset.from_dict({"text": ["", "  ", "\n"]}).save_to_disk(str(blank))
    with pytest.raises(DataError, match="holds no text"):
        open_corpus(blank)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="cannot be read"):
        open_corpus(broken)


def test_without_the_datasets_library_the_folder_is_named_and_the_extra_suggested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": LINES}).save_to_disk(str(saved))
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    with pytest.raises(DataError, match=r"datasets library, which is not installed here: pip install"):
        open_corpus(saved)
