"""One file that holds a whole language model: the dense part, every expert, the config, the tokenizer.

``lah export`` writes it from a trainer's checkpoint and the experts gathered from their hosts; ``lah
generate`` (or anyone with ``safetensors``) loads it into a plain :class:`LanguageModel` whose mixture
blocks are :class:`~engine.moe.LocalMixtureOfExperts`, with no swarm and no network. Tensors are named
as that local model's ``state_dict`` names them (an expert ``<grid>.<i>.<j>`` of block ``b`` under
``blocks.<b>.ffn.experts.<row-major cell index>.``), less the head, which is tied to the token
embedding. The safetensors metadata (strings) holds::

    format            lah-lm-export/1
    experiment        the experiment's name
    lm                LmConfig as JSON
    tokenizer_digest  the sha256 the experiment names (engine.lm.tokenizer)
    tokenizer         the tokenizer itself (JSON), when small; otherwise the reader passes the file
    experts           {uid: {host, steps, sha256, replicas, answered}} for every expert taken
    missing           [uid, ...]: experts no host answered for, left at their initialisation
    dense             {checkpoint, step}: where the dense part came from

Reading trusts nothing: every tensor's name, dtype and shape is checked against a model built here from
the config before any is loaded, values must be finite, each expert's bytes must hash to the sha256 the
file records for it (:func:`engine.moe.weights.weights_digest`, as its host computed it), and the
tokenizer must have the recorded digest. Any failure is a :class:`~.errors.ModelFileError` (or
``TokenizerMismatch``) with a sentence.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as st_save

from engine.moe.local import LocalMixtureOfExperts
from engine.moe.weights import weights_digest
from engine.wire import all_finite

from .errors import ConfigError, DataError, ModelFileError
from .model import LanguageModel, LmConfig, grid_name
from .tokenizer import Tokenizer, check_same, parse

__all__ = [
    "FORMAT",
    "ModelFile",
    "encode_model_file",
    "expert_prefixes",
    "local_model",
    "read_model_file",
    "stored_tensors",
]

FORMAT = "lah-lm-export/1"
TIED = {"head.weight": "tokens.weight"}  # stored once, under the embedding's name
TOKENIZER_INLINE_MAX = 4 << 20  # JSON bytes of a tokenizer kept in the file (a 50k BPE is about 2 MiB)
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def local_model(lm: LmConfig) -> LanguageModel:
    """The model of ``lm`` with every expert in process (freshly initialised)."""
    width = lm.mixture_width
    return LanguageModel(lm, lambda _: LocalMixtureOfExperts(width, lm.grid, lm.expert_spec, lm.k_best))


def expert_prefixes(lm: LmConfig, experiment: str) -> dict[str, str]:
    """``uid -> state_dict prefix`` of every expert of ``experiment``'s grids in the local model."""
    out = {}
    for block in lm.moe_blocks:
        cells = itertools.product(*(range(n) for n in lm.grid))
        for n, coords in enumerate(cells):
            uid = ".".join([grid_name(experiment, block), *map(str, coords)])
            out[uid] = f"blocks.{block}.ffn.{'mixture.' if lm.wire_rank else ''}experts.{n}."
    return out


def stored_tensors(model: LanguageModel) -> dict[str, torch.Tensor]:
    """The tensors a file holds for ``model``: its state, less the tied head."""
    return {k: v for k, v in model.state_dict().items() if k not in TIED}


def encode_model_file(
    model: LanguageModel,
    *,
    experiment: str,
    tokenizer_digest: str,
    tokenizer: Tokenizer | None,
    experts: dict[str, dict[str, Any]],
    missing: list[str],
    dense: dict[str, Any],
) -> bytes:
    """The file's bytes (the caller writes them atomically); ``tokenizer`` is kept when small."""
    meta = {
        "format": FORMAT,
        "experiment": experiment,
        "lm": json.dumps(dataclasses.asdict(model.config), sort_keys=True),
        "tokenizer_digest": tokenizer_digest,
        "experts": json.dumps(experts, sort_keys=True),
        "missing": json.dumps(sorted(missing)),
        "dense": json.dumps(dense, sort_keys=True),
    }
    if tokenizer is not None and len(text := tokenizer.to_json()) <= TOKENIZER_INLINE_MAX:
        meta["tokenizer"] = text
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in stored_tensors(model).items()}
    return st_save(tensors, metadata=meta)


@dataclass
class ModelFile:
    model: LanguageModel
    experiment: str
    tokenizer: Tokenizer
    experts: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)


def read_model_file(path: str | os.PathLike[str], tokenizer: Tokenizer | None = None) -> ModelFile:
    """Load and check a file (module docstring); ``tokenizer``: for a file that does not hold its own."""
    where = Path(path)
    if not where.is_file():
        raise ModelFileError(f"{where}: no such file")
    try:
        with safe_open(str(where), framework="pt") as f:
            meta = dict(f.metadata() or {})
            lm, experiment, experts, missing = _header(where, meta)
            tok = _tokenizer(where, meta, tokenizer, lm)
            model = local_model(lm)
            want = stored_tensors(model)
            _check_layout(where, f, want)
            got = {name: f.get_tensor(name) for name in want}
    except SafetensorError as e:
        raise ModelFileError(f"{where} is not a safetensors file ({e})") from None
    except OSError as e:
        raise ModelFileError(f"cannot read {where}: {e}") from None
    bad = [name for name, t in got.items() if not all_finite(t)]
    if bad:
        raise ModelFileError(f"{where}: {len(bad)} tensors hold NaN or infinite values, e.g. {bad[0]}")
    _check_experts(where, lm, experiment, experts, got)
    model.load_state_dict({**got, **{alias: got[name] for alias, name in TIED.items()}}, strict=True)
    return ModelFile(model, experiment, tok, experts, missing, meta)


def _header(where: Path, meta: dict[str, str]) -> tuple[LmConfig, str, dict[str, dict[str, Any]], list[str]]:
    if meta.get("format") != FORMAT:
        raise ModelFileError(
            f"{where} is a safetensors file, but not a model lah export wrote (format "
            f"{str(meta.get('format'))[:40]!r}, not {FORMAT!r})"
        )
    try:
        config = json.loads(meta["lm"])
        fields = {f.name for f in dataclasses.fields(LmConfig)}
        if not isinstance(config, dict) or set(config) - fields:
            raise ValueError(f"unknown fields {sorted(set(config) - fields)[:5]}")
        lm = LmConfig(**{**config, "grid": tuple(config.get("grid", ()))})
        experts = json.loads(meta.get("experts", "{}"))
        missing = json.loads(meta.get("missing", "[]"))
        experiment = meta["experiment"]
        if not isinstance(experts, dict) or not all(isinstance(v, dict) for v in experts.values()):
            raise ValueError("experts is not an object of objects")
        if not isinstance(missing, list) or not all(isinstance(u, str) for u in missing):
            raise ValueError("missing is not a list of uids")
    except (KeyError, TypeError, ValueError, ConfigError) as e:
        raise ModelFileError(
            f"{where}: its metadata does not describe a model ({type(e).__name__}: {e})"
        ) from None
    return lm, experiment, experts, missing


def _tokenizer(where: Path, meta: dict[str, str], given: Tokenizer | None, lm: LmConfig) -> Tokenizer:
    digest = meta.get("tokenizer_digest", "")
    if given is not None:
        tok = given
    elif "tokenizer" in meta:
        try:
            tok = parse(meta["tokenizer"])
        except DataError as e:
            raise ModelFileError(f"{where}: its tokenizer does not parse: {e}") from None
    else:
        raise ModelFileError(
            f"{where} holds no tokenizer (too large to keep, or the model was trained on token files): "
            "pass the experiment's tokenizer file with --tokenizer FILE"
        )
    if digest:
        check_same(tok, digest)
    if tok.vocab_size != lm.vocab_size:
        raise ModelFileError(
            f"{where}: the tokenizer has {tok.vocab_size} symbols; the model's vocabulary is {lm.vocab_size}"
        )
    return tok


def _check_layout(where: Path, f: Any, want: dict[str, torch.Tensor]) -> None:
    """Names, dtypes and shapes from the file's header, before a byte of any tensor is loaded."""
    have = set(f.keys())
    lacking, extra = [n for n in want if n not in have], sorted(have - set(want))
    if lacking or extra:
        raise ModelFileError(
            f"{where} does not fit the model its config describes: "
            + "; ".join(
                part
                for part in (
                    f"{len(lacking)} tensors missing (e.g. {', '.join(lacking[:3])})" if lacking else "",
                    f"{len(extra)} not in the model (e.g. {', '.join(extra[:3])})" if extra else "",
                )
                if part
            )
        )
    for name, t in want.items():
        part = f.get_slice(name)
        shape, dtype = tuple(part.get_shape()), _DTYPES.get(part.get_dtype(), part.get_dtype())
        if shape != tuple(t.shape) or dtype != str(t.dtype).removeprefix("torch."):
            raise ModelFileError(
                f"{where} does not fit the model its config describes: {name} is {dtype} {shape}; the "
                f"model's is {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
            )


def _check_experts(
    where: Path,
    lm: LmConfig,
    experiment: str,
    experts: dict[str, dict[str, Any]],
    got: dict[str, torch.Tensor],
) -> None:
    """Each recorded expert's bytes hash to the sha256 its host sent: the file holds what was gathered."""
    prefixes = expert_prefixes(lm, experiment)
    unknown = sorted(set(experts) - set(prefixes))
    if unknown:
        raise ModelFileError(f"{where} records experts its model has no place for: {', '.join(unknown[:3])}")
    for uid, info in experts.items():
        prefix = prefixes[uid]
        names = [n for n in got if n.startswith(prefix)]
        digest = weights_digest([n[len(prefix) :] for n in names], [got[n] for n in names])
        if digest != info.get("sha256"):
            raise ModelFileError(
                f"{where}: expert {uid}'s weights hash to {digest[:12]}, not the "
                f"{str(info.get('sha256'))[:12]} recorded when it was gathered: the file was altered"
            )
