"""A dataset saved on local disk by the ``datasets`` library (``Dataset.save_to_disk``), as text.

Researchers often hold their text as a ``datasets`` folder already (built from their own files, or
downloaded once elsewhere); ``--data`` takes such a folder where the optional ``datasets`` library is
installed (the ``datasets`` extra). Nothing is fetched: the folder is opened with ``load_from_disk``
under ``HF_DATASETS_OFFLINE=1``, and a folder that is not a saved dataset is refused rather than looked
up on a hub.

Which text, and the split (both stated in the corpus's name):
- the column named ``text``, else the dataset's only string column; several string columns and no
  ``text`` is an error that names them;
- a saved ``DatasetDict`` with a ``train`` split and a ``validation`` (or ``valid``, ``val``, ``test``)
  split uses them as they are; any other dataset is joined in row order and cut as every text corpus
  is (the first 90% of its characters train).
Rows are joined by a blank line, as the files of a text folder are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import DataError

__all__ = ["is_saved_dataset", "read_saved_dataset"]

#: Files ``save_to_disk`` writes: a DatasetDict's index, or a single Dataset's state.
_MARKERS = ("dataset_dict.json", "state.json")
VALIDATION_SPLITS = ("validation", "valid", "val", "test")


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _MARKERS)


def _load(path: Path) -> Any:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never a hub, whatever the folder says
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{path} is a dataset saved by the datasets library, which is not installed here: "
            "pip install 'learning-at-home[datasets]', or give a text file instead"
        ) from None
    try:
        return datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: the saved dataset cannot be read ({e})") from None


def _column(dataset: Any, where: str) -> str:
    strings = [name for name, kind in dataset.features.items() if getattr(kind, "dtype", None) == "string"]
    if "text" in strings:
        return "text"
    if len(strings) == 1:
        return str(strings[0])
    if not strings:
        raise DataError(f"{where} has no text column (its columns: {', '.join(dataset.column_names)})")
    raise DataError(f"{where} has several text columns and none called 'text': {', '.join(strings)}")


def _joined(dataset: Any, where: str) -> str:
    column = _column(dataset, where)
    parts = [row for row in dataset[column] if isinstance(row, str) and row.strip()]
    if not parts:
        raise DataError(f"{where}: its column {column!r} holds no text")
    return "\n\n".join(parts)


def read_saved_dataset(path: Path) -> tuple[str, str | None, str]:
    """``(train text, validation text or None, description)``: None when the dataset has no split of
    its own, and the caller cuts the text 90/10."""
    loaded = _load(path)
    splits = getattr(loaded, "keys", None)
    if splits is None:  # a single Dataset
        return _joined(loaded, str(path)), None, f"{path} (saved dataset, split 90/10)"
    names = list(splits())
    if "train" in names:
        val = next((n for n in VALIDATION_SPLITS if n in names), None)
        if val is not None:
            train_text = _joined(loaded["train"], f"{path} [train]")
            val_text = _joined(loaded[val], f"{path} [{val}]")
            return train_text, val_text, f"{path} (saved dataset, splits train / {val})"
    if not names:
        raise DataError(f"{path}: the saved dataset has no splits")
    text = "\n\n".join(_joined(loaded[n], f"{path} [{n}]") for n in names)
    return text, None, f"{path} (saved dataset, splits {' + '.join(names)} joined and cut 90/10)"
