"""Expert checkpoints: weights and optimizer state in safetensors files, written atomically.

A checkpoint is one ``.safetensors`` file: model tensors under ``model.<name>``, optimizer tensors under
``optim.<param index>.<key>``, and everything that is not a tensor (param groups, scalar state, the spec,
the step count) as JSON in the file's header metadata. Nothing is pickled, so loading a file cannot run
code, even one copied from another machine.

Writes are atomic: the bytes go to a temporary file in the same directory, are fsynced, renamed over the
final name with ``os.replace`` and the directory is fsynced, so a crash leaves either the old set of files
or the new one. Loading still trusts nothing: a file cut short (a crash on a filesystem that reorders, a
full disk, a copy interrupted) fails to parse and is skipped with a log line, and the previous checkpoint
is used. The last ``keep`` files are kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from engine.files import atomic_write

from .errors import CheckpointError

__all__ = ["Checkpoint", "CheckpointStore", "restore_state", "snapshot_state"]

logger = logging.getLogger(__name__)

FORMAT = "lah-expert-checkpoint/1"
_NAME = re.compile(r"^ckpt-(\d{10})\.safetensors$")


@dataclass
class Checkpoint:
    """One checkpoint in memory: tensors (on the CPU) plus JSON-able metadata."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)


def snapshot_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any]
) -> Checkpoint:
    """Copy model and optimizer state to CPU tensors (call on the thread that trains, so it is consistent)."""
    tensors = {
        f"model.{k}": v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()
    }
    opt = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in opt["param_groups"]]
    return Checkpoint(tensors, {**meta, "param_groups": groups, "optim_scalars": scalars})


def restore_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    """Load a checkpoint into a model and its optimizer; a mismatch is a :class:`CheckpointError`."""
    weights = {k[len("model.") :]: v for k, v in ckpt.tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"weights do not fit the model: {e}") from None
    state: dict[int, dict[str, Any]] = {}
    for key, value in ckpt.tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for index, scalars in ckpt.meta.get("optim_scalars", {}).items():
        state.setdefault(int(index), {}).update(scalars)
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in ckpt.meta.get("param_groups", [])
    ]
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"optimizer state does not fit: {e}") from None


class CheckpointStore:
    """Numbered checkpoint files in one directory: ``save`` appends, ``load_latest`` reads back."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = Path(directory)
        self.keep = keep

    def files(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def save(self, ckpt: Checkpoint) -> Path:
        """Write atomically as the newest checkpoint, then drop all but the newest ``keep``. Blocking I/O."""
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = self.files()
        number = int(_NAME.match(existing[-1].name).group(1)) + 1 if existing else 1  # type: ignore[union-attr]
        path = self.directory / f"ckpt-{number:010d}.safetensors"
        meta = {"format": FORMAT, "meta": json.dumps(ckpt.meta, sort_keys=True)}
        data = st_save(ckpt.tensors, metadata=meta)
        atomic_write(path, data)
        for old in self.files()[: -self.keep]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
        return path

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that parses; broken ones are skipped with a warning. ``None`` if none."""
        for stray in self.directory.glob("*.tmp") if self.directory.is_dir() else ():
            with contextlib.suppress(OSError):
                stray.unlink()  # a write that never reached os.replace
        for path in reversed(self.files()):
            try:
                return read_checkpoint(path)
            except CheckpointError as e:
                logger.warning("skipping checkpoint %s: %s; falling back to the previous one", path, e)
        return None


def read_checkpoint(path: Path) -> Checkpoint:
    """Parse one file; anything wrong with it is a :class:`CheckpointError`."""
    try:
        data = path.read_bytes()
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
        raw_meta = header.get("__metadata__") or {}
        if raw_meta.get("format") != FORMAT:
            raise CheckpointError(f"not a {FORMAT} file")
        meta = json.loads(raw_meta["meta"])
    except (OSError, SafetensorError, ValueError, KeyError) as e:
        raise CheckpointError(f"unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError("metadata is not a JSON object")
    return Checkpoint(tensors, meta)
