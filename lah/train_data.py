"""What ``lah train`` trains on for a classifier experiment: the experiment's config read into a
:class:`~engine.trainer.TrainerConfig`, and ``--data`` (an ``.npz`` of numeric arrays ``x`` and ``y``)
checked against it. A language model's config and text are :mod:`lah.train_lm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .trainer_session import TrainError

__all__ = ["Experiment", "config_of", "load_data", "read_npz"]


@dataclass(frozen=True)
class Experiment:
    trainer: Any  # engine.trainer.TrainerConfig
    in_features: int
    classes: int
    dataset: str


def config_of(experiment: dict[str, Any]) -> Any:
    """The TrainerConfig (and the dense model's ends) for an experiment's JSON config; a language
    model's: :class:`lah.train_lm.LmExperiment`."""
    from engine.trainer import TrainerConfig

    if experiment.get("kind") == "lm":
        from .train_lm import LmTrainError, lm_of

        try:
            return lm_of(experiment)
        except LmTrainError as e:
            raise TrainError(str(e)) from e
    try:
        hp = experiment.get("hyperparams", {})
        dense = experiment.get("dense", {})
        if experiment["expert_type"] != "ffn":
            raise TrainError(
                f"lah train builds ffn experts' mixtures; this experiment's are {experiment['expert_type']!r}"
            )
        config = TrainerConfig(
            uid_prefix=str(experiment["name"]),
            grid=tuple(int(n) for n in experiment["grid"]),
            dim=int(hp.get("d_model", hp.get("dim", 64))),
            hidden=int(hp.get("hidden", 256)),
            k_best=int(dense.get("k_best", 4)),
            batch_size=int(dense.get("batch_size", 64)),
            lr=float(dense.get("lr", 3e-3)),
            target_batch_size=int(experiment.get("target_batch_size", 0)),
        )
        return Experiment(
            config,
            int(dense.get("in_features", 64)),
            int(dense.get("classes", 10)),
            str(dense.get("dataset", "digits")),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TrainError(f"the coordinator's experiment config is not one lah train understands: {e}") from e


NPZ_MAGIC = b"PK\x03\x04"  # an .npz is a zip archive of .npy files
SAVE_AS = "save it with numpy.savez(FILE, x=samples_by_features, y=labels)"


def read_npz(path: Path) -> tuple[Any, Any]:
    """``x`` (float32) and ``y`` from an ``.npz``; TrainError says what the file is instead. Only numeric
    arrays are read: an object array would be unpickled, and a pickle can run any code, so such a file
    is refused whatever its source (and numpy's hint to allow that is never passed on)."""
    import zipfile

    import numpy as np

    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as e:
        raise TrainError(f"cannot read {path}: {e.strerror or e}") from e
    if not head:
        raise TrainError(
            f"cannot read {path}: the file is empty; the experiment needs arrays x and y ({SAVE_AS})"
        )
    if not head.startswith(NPZ_MAGIC):
        what = "a text file" if b"\0" not in head and _decodes(head) else "not an .npz file"
        raise TrainError(f"cannot read {path}: it is {what}, not an .npz with arrays x and y ({SAVE_AS})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "x" not in npz.files or "y" not in npz.files:
                held = ", ".join(npz.files) or "nothing"
                raise TrainError(f"{path} holds {held}, not the arrays x and y ({SAVE_AS})")
            x, y = npz["x"], npz["y"]
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise TrainError(f"cannot read {path}: a damaged or cut-short .npz file ({type(e).__name__})") from e
    except ValueError as e:
        raise TrainError(
            f"cannot read {path}: it holds Python objects rather than numbers; lah train reads numbers only "
            f"({SAVE_AS})"
        ) from e
    if x.dtype.kind not in "biuf" or y.dtype.kind not in "biuf":
        raise TrainError(f"{path}: x and y must hold numbers (x holds {x.dtype}, y {y.dtype})")
    return np.asarray(x, dtype=np.float32), np.asarray(y)


def _decodes(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # cut in the middle of a character at the end: still text
    return True


def load_data(experiment: Experiment, data: Path | None) -> Any:
    """The experiment's data set: digits (sklearn's, bundled), or ``data``: an ``.npz`` with ``x``
    (samples x in_features) and ``y`` (class labels), split 80/20 with a fixed seed."""
    import numpy as np
    import torch

    from engine.trainer import Digits, load_digits_split

    if data is None:
        if experiment.dataset != "digits":
            raise TrainError(f"the experiment trains on {experiment.dataset!r}: pass it with --data FILE.npz")
        digits = load_digits_split(seed=experiment.trainer.seed)
        x_tr, y_tr, x_te, y_te = digits.x_train, digits.y_train, digits.x_test, digits.y_test
    else:
        x, y = read_npz(data)
        if (
            x.ndim != 2
            or y.ndim != 1
            or len(x) != len(y)
            or len(x) < 2
            or not np.issubdtype(y.dtype, np.integer)
        ):
            raise TrainError(f"{data}: x must be samples x features and y one integer label per sample")
        order = np.random.default_rng(0).permutation(len(x))
        cut = max(1, int(0.8 * len(x)))
        tr, te = order[:cut], order[cut:]
        x_tr, y_tr = torch.from_numpy(x[tr]), torch.from_numpy(y[tr].astype(np.int64))
        x_te, y_te = torch.from_numpy(x[te]), torch.from_numpy(y[te].astype(np.int64))
    if x_tr.shape[1] != experiment.in_features:
        raise TrainError(
            f"the data has {x_tr.shape[1]} features; the experiment's model takes {experiment.in_features}"
        )
    labels = torch.cat([y_tr, y_te])
    if int(labels.min()) < 0 or int(labels.max()) >= experiment.classes:
        raise TrainError(f"labels must lie in [0, {experiment.classes}) for this experiment")
    return Digits(x_tr, y_tr, x_te, y_te)
