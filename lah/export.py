"""``lah export``: a language model trained through volunteers, as one file that runs without them.

A trainer account (``lah train login``'s) joins the swarm as ``lah train`` does, but with an identity of
its own (``export-identity.key`` in the data dir, so it may run beside a ``lah train`` of the same
account), finds the hosts of every expert of every grid of the ``lm`` experiment through the DHT
(assigned hosts only), and asks each for the expert's current weights (``moe.state``): every replica that
answers within ``--timeout`` is checked (:mod:`engine.moe.gather`) and the one with the most update steps
is taken. The dense part comes from the newest checkpoint ``lah train`` wrote for the experiment
(``<data-dir>/lm-<experiment>/checkpoints``) or ``--checkpoint``. Everything goes into one safetensors
file (:mod:`engine.lm.model_file`: tensors, config, tokenizer, and per expert which host's state was
taken after how many updates), written atomically; ``lah generate`` reads it.

An expert that no host answered for fails the export (exit 1) unless ``--allow-missing``: it then keeps
its initialisation and the file lists it under ``missing``.

Exit status: 0 written; 1 the coordinator or the swarm could not be reached, or experts are missing; 2 a
problem the researcher can fix (no login, not a language model, no checkpoint or one of another model,
another tokenizer, an output path that is a folder).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.dht.errors import DHTError
from engine.node.errors import AlreadyRunning
from engine.p2p.errors import P2PError

from .train_credentials import TrainerCredentials
from .train_data import config_of
from .trainer_session import (
    TrainError,
    default_data_dir,
    explain,
    kept_login,
    leave,
    pin_from_environment,
    prepare,
    start_node,
)

__all__ = ["ExportError", "run_export"]

logger = logging.getLogger(__name__)
FIND_S = 30.0  # the longest the export waits for the DHT to name a host for every expert


class ExportError(Exception):
    """The researcher's to fix (exit status 2)."""


class MissingExperts(Exception):
    """Experts no host answered for, without --allow-missing (exit status 1)."""


@dataclass(frozen=True)
class Dense:
    tensors: dict[str, Any]  # name -> tensor, the local model's names
    source: str
    step: int


def run_export(
    coordinator: str,
    experiment: str,
    out: Path,
    *,
    checkpoint: Path | None = None,
    data_dir: Path | None = None,
    token_file: Path | None = None,
    data: Path | None = None,
    tokenizer: Path | None = None,
    allow_missing: bool = False,
    timeout: float = 30.0,
    say: Callable[[str], None] = print,
) -> int:
    """Export (module docstring); the exit status."""
    try:
        return _run(
            coordinator, experiment, out, checkpoint, data_dir or default_data_dir(), token_file, data,
            tokenizer, allow_missing, timeout, say,
        )  # fmt: skip
    except (ExportError, TrainError) as e:
        say(f"lah export: {e}")
        return 2
    except AlreadyRunning as e:
        say(f"lah export: {e} (another lah export uses this --data-dir)")
        return 2
    except MissingExperts as e:
        say(f"lah export: {e}")
        return 1
    except CoordinatorUnreachable as e:
        say(f"lah export: {e}")
        return 1
    except (TimeoutError, RuntimeError, P2PError, DHTError) as e:
        say(f"lah export: could not reach the swarm: {type(e).__name__}: {e}")
        return 1
    except KeyboardInterrupt:
        say("lah export: stopped; nothing was written")
        return 130


def _run(
    url: str,
    name: str,
    out: Path,
    checkpoint: Path | None,
    data_dir: Path,
    token_file: Path | None,
    data: Path | None,
    tokenizer_file: Path | None,
    allow_missing: bool,
    timeout: float,
    say: Callable[[str], None],
) -> int:
    from engine.files import atomic_write
    from engine.lm.model_file import encode_model_file, expert_prefixes, local_model
    from engine.moe import LoopThread
    from engine.moe.gather import gather_experts
    from engine.node.lock import InstanceLock
    from engine.trainer import TrainerNode

    if out.is_dir():
        raise ExportError(f"--out {out} is a folder: name the file to write")
    folder = out.parent if str(out.parent) else Path(".")
    if not (folder.is_dir() and os.access(folder, os.W_OK)):  # found out now, not after the gathering
        raise ExportError(f"cannot write {out}: {folder} is not a folder this user may write in")
    store = TrainerCredentials(data_dir, token_file)
    stored = kept_login(store, url)
    pin_from_environment()
    lock = InstanceLock(data_dir / "export.lock")
    lock.acquire()
    loop = LoopThread("export-loop")
    node: TrainerNode | None = None
    try:
        credentials, account, spec = loop.run(prepare(_api(url), store, stored, name), 60)
        experiment = config_of(spec)
        if getattr(experiment, "lm", None) is None:
            raise ExportError(f"{name} is not a language model (kind lm): lah export writes language models")
        lm = experiment.lm
        tok = _tokenizer(experiment, data, tokenizer_file)
        dense = _dense(experiment, checkpoint or data_dir / f"lm-{name}")
        prefixes = expert_prefixes(lm, name)

        identity_file = data_dir / "export-identity.key"
        node = start_node(url, account, loop, identity_file, experiment.trainer, credentials, store)
        hosts = loop.run(_find_hosts(node.finder, experiment.grids, lm.grid, FIND_S), FIND_S + 30)
        found = sum(1 for h in hosts.values() if h)
        say(f"{account} joined {name}: hosts found for {found} of {len(hosts)} experts")
        gathered = loop.run(
            gather_experts(node.peer, hosts, lm.expert_spec, timeout=timeout), _bound(hosts, timeout)
        )
        missing = sorted(uid for uid, g in gathered.items() if g.taken is None)
        if missing and not allow_missing:
            raise MissingExperts(
                _missing_line(missing, gathered) + "; --allow-missing exports them untrained"
            )
        import torch

        torch.manual_seed(0)
        model = local_model(lm)
        weights = dict(dense.tensors)
        for uid, g in gathered.items():
            if g.taken is not None:
                weights.update((prefixes[uid] + n, t) for n, t in g.taken.as_dict().items())
        left = model.load_state_dict(weights, strict=False)
        assert not left.unexpected_keys, left.unexpected_keys  # names checked against the spec already
        experts = {
            uid: {
                "host": g.taken.host,
                "steps": g.taken.steps,
                "sha256": g.taken.digest,
                "replicas": len(g.hosts),
                "answered": len(g.answered),
                "agree": g.agree,
            }
            for uid, g in gathered.items()
            if g.taken is not None
        }
        blob = encode_model_file(
            model,
            experiment=name,
            tokenizer_digest=experiment.tokenizer_digest or (tok.digest if tok is not None else ""),
            tokenizer=tok,
            experts=experts,
            missing=missing,
            dense={"checkpoint": dense.source, "step": dense.step},
        )
        try:
            atomic_write(out, blob)
        except OSError as e:
            raise ExportError(f"cannot write {out}: {e}") from e
        _summary(say, gathered, missing, dense, len(blob), out)
        return 0
    except CoordinatorError as e:
        raise ExportError(explain(e, url, name)) from e
    finally:
        leave(node, loop, lock, say)


def _api(url: str) -> Any:
    from engine.account.coordinator_api import CoordinatorApi

    return CoordinatorApi(url)


def _tokenizer(experiment: Any, data: Path | None, path: Path | None) -> Any:
    """The experiment's tokenizer, found as ``lah train`` finds it (None for token files)."""
    from engine.lm import DEFAULT_CORPUS, LmError, check_same, read_text
    from engine.lm.tokenizer import CharTokenizer, load

    try:
        if path is not None:
            tok = load(path)
        elif data is not None and data.is_dir() and (data / "train.bin").exists():
            return None
        else:
            tok = CharTokenizer.fit(read_text(data or DEFAULT_CORPUS))
        if experiment.tokenizer_digest:
            check_same(tok, experiment.tokenizer_digest)
    except LmError as e:
        raise ExportError(str(e)) from e
    if tok.vocab_size != experiment.lm.vocab_size:
        raise ExportError(
            f"the tokenizer has {tok.vocab_size} symbols; the experiment's model has "
            f"{experiment.lm.vocab_size}: pass the experiment's tokenizer with --tokenizer FILE (or the text "
            "it was built from with --data)"
        )
    return tok


def _dense(experiment: Any, where: Path) -> Dense:
    """The dense part from a checkpoint file, a checkpoints folder, or ``lah train``'s folder for the
    experiment; it must be this experiment's model."""
    from engine.lm.model_file import expert_prefixes, local_model
    from engine.moe.checkpoint import Checkpoint, CheckpointStore, read_checkpoint
    from engine.moe.errors import CheckpointError

    folder = where / "checkpoints" if (where / "checkpoints").is_dir() else where
    files = [where] if where.is_file() else CheckpointStore(folder).files()
    ckpt: Checkpoint | None = None
    source, problems = str(folder), []
    for path in reversed(files):  # the newest that reads, as lah train --resume takes
        try:
            ckpt, source = read_checkpoint(path), str(path)
            break
        except (CheckpointError, OSError) as e:
            problems.append(f"{path}: {e}")
    if ckpt is None and problems:
        raise ExportError(f"cannot read the checkpoint {problems[0]}")
    if ckpt is None:
        raise ExportError(
            f"no checkpoint of the dense part in {source}: train first (lah train --experiment "
            f"{experiment.name} writes one at every evaluation) or pass --checkpoint FILE-or-FOLDER"
        )
    if ckpt.meta.get("experiment", experiment.name) != experiment.name:
        raise ExportError(
            f"{source} is a checkpoint of {ckpt.meta.get('experiment')!r}, not {experiment.name!r}"
        )
    tensors = {k.removeprefix("model."): v for k, v in ckpt.tensors.items() if k.startswith("model.")}
    experts = tuple(expert_prefixes(experiment.lm, experiment.name).values())
    import torch

    with torch.device("meta"):  # names, shapes and dtypes only: no memory for a second model
        like = local_model(experiment.lm).state_dict()
    want = {k: v for k, v in like.items() if not k.startswith(experts)}
    wrong = sorted(set(want) ^ set(tensors)) or [
        k for k, v in want.items() if tuple(v.shape) != tuple(tensors[k].shape) or v.dtype != tensors[k].dtype
    ]
    if wrong:
        raise ExportError(
            f"{source} does not fit the experiment's model ({len(wrong)} tensors differ, e.g. {wrong[0]}): "
            "a checkpoint of another model, or of the experiment before its config changed"
        )
    return Dense(tensors, source, int(ckpt.meta.get("step", 0)))


async def _find_hosts(finder: Any, grids: list[str], grid: tuple[int, ...], wait_s: float) -> dict[str, Any]:
    """Every expert's hosts, looked up again (up to ``wait_s``) while some have none yet."""
    from engine.moe.gather import expert_hosts

    deadline = time.monotonic() + wait_s
    while True:
        hosts: dict[str, Any] = {}
        for g in grids:
            hosts.update(await expert_hosts(finder.children, g, grid))
        if all(hosts.values()) or time.monotonic() >= deadline:
            return hosts
        await asyncio.sleep(1.0)  # the finder's negative cache lasts 2 s: the next pass looks up again


def _bound(hosts: dict[str, Any], timeout: float) -> float:
    """The whole gathering's limit: each round of fetches (8 at a time) within ``timeout``."""
    from engine.moe.gather import FETCHES_AT_ONCE

    fetches = sum(len(h) for h in hosts.values())
    return math.ceil(max(1, fetches) / FETCHES_AT_ONCE) * (timeout + 1.0) + 10.0


def _missing_line(missing: list[str], gathered: dict[str, Any]) -> str:
    def why(uid: str) -> str:
        g = gathered[uid]
        if not g.hosts:
            return "no host found in the DHT"
        codes = Counter(reason.partition(":")[0] for reason in g.failed.values())
        return ", ".join(f"{code} from {n} host{'s' * (n > 1)}" for code, n in sorted(codes.items()))

    shown = ", ".join(f"{uid} ({why(uid)})" for uid in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return f"no host answered for {len(missing)} experts: {shown}{more}"


def _summary(
    say: Callable[[str], None],
    gathered: dict[str, Any],
    missing: list[str],
    dense: Dense,
    size: int,
    out: Path,
) -> None:
    taken = [g for g in gathered.values() if g.taken is not None]
    hosts = {g.taken.host for g in taken}
    asked = sum(len(g.hosts) for g in gathered.values())
    answered = sum(len(g.answered) for g in gathered.values())
    compared = sum(1 for g in taken if len(g.answered) > 1)
    differ = sum(1 for g in taken if not g.agree)
    for g in sorted(gathered.values(), key=lambda g: g.uid):
        if g.failed and g.taken is not None:
            say(f"  {g.uid}: {len(g.failed)} of {len(g.hosts)} replicas did not answer: " + "; ".join(
                f"{h[:12]}: {r[:80]}" for h, r in g.failed.items()
            ))  # fmt: skip
    rule = f" ({differ} differ: took the one with the most update steps)" if compared else ""
    say(
        f"gathered {len(taken)} of {len(gathered)} experts from {len(hosts)} hosts; replicas: {answered} of "
        f"{asked} answered, {compared} experts compared across replicas{rule}"
    )
    per_host = Counter(g.taken.host for g in taken)
    if per_host:
        say("taken from: " + ", ".join(f"{h[:12]} ({n} experts)" for h, n in per_host.most_common()))
    if missing:
        say(f"missing (left at their initialisation): {len(missing)}: {', '.join(missing[:10])}")
    else:
        say("missing: none")
    say(f"dense part: {dense.source} (step {dense.step})")
    say(f"wrote {size:,} bytes to {out}")
