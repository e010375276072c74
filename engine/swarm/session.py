"""Swarm: a researcher's own model and training loop, with the volunteers' experts in it.

``Swarm.join`` logs in with the trainer token ``lah train login`` kept (the keyring, or a token file),
reads the experiment from the coordinator, and starts a :class:`~engine.trainer.TrainerNode`: a Peer
on the coordinator's signaling, a DHT client bootstrapped from the peers it names, the expert finder,
the receipt book and the spot checker, all on one :class:`~engine.moe.LoopThread` so the researcher's
synchronous torch code can call into them. ``mixture`` gives a layer per grid (checked against what
the experiment fixes before any call), ``optimizer`` the dense part's optimizer (collaborative when the
experiment sets a target batch size), ``stats`` what the swarm did, ``close`` flushes the receipts and
leaves. Identity and lock live in the data dir, as ``lah train``'s do (the same default), so a
researcher's script and ``lah train`` with one data dir never run at once.

The transport's patches are installed on join (idempotent: ``install`` runs once per process, as the
``lah`` command does at its start), and ``LAH_HOST_ADDRESSES`` pins ICE candidates as it does for
``lah train`` (loopback swarms, tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from engine.account.coordinator_api import CoordinatorApi
from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.account.tokens import Credentials
from engine.account.trainer_tokens import TrainerCredentials, default_trainer_dir
from engine.dht import DHTError
from engine.moe import ExpertSpec, LoopThread
from engine.node.errors import AlreadyRunning
from engine.node.lock import InstanceLock
from engine.p2p import Identity
from engine.p2p.errors import P2PError
from engine.trainer import TrainerConfig, TrainerNode
from engine.trainer.trainer import remote_mixture

from .connect import check_url, explain_refusal, explain_unreachable, login_hint, prepare, probe
from .errors import JoinFailed, LoginRequired, Mismatch, SwarmError, UnknownExperiment, UnknownGrid
from .experiment import Experiment, Grid, check_layer, parse_experiment
from .layer import MixtureLayer
from .optimizer import SwarmOptimizer, dense_module, run_name
from .stats import SwarmStats, collect

__all__ = ["FIXED", "OPTIONS", "Swarm"]

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 15.0  # each request to the coordinator
#: TrainerConfig fields a script may set on join (the rest the experiment fixes).
OPTIONS = frozenset(
    {"timeout", "grace_s", "k_min", "wire", "spot_check_fraction", "gather_s", "collab_timeout_s", "seed"}
)
FIXED = frozenset({"uid_prefix", "grid", "dim", "hidden", "k_best", "target_batch_size", "batch_size", "lr"})


class Swarm:
    """One experiment of one coordinator, joined (see the module docstring; make it with :meth:`join`)."""

    def __init__(
        self,
        url: str,
        experiment: Experiment,
        node: TrainerNode,
        loop: LoopThread,
        lock: InstanceLock,
        say: Callable[[str], None],
    ) -> None:
        self.url, self.experiment, self.node, self.loop = url, experiment, node, loop
        self._lock, self._say = lock, say
        self._layers: list[MixtureLayer] = []
        self._optimizer: SwarmOptimizer | None = None
        self._final: SwarmStats | None = None

    # -- joining ---------------------------------------------------------------------------------

    @classmethod
    def join(
        cls,
        coordinator_url: str,
        experiment: str,
        *,
        token_file: str | Path | None = None,
        data_dir: str | Path | None = None,
        wait_s: float = 30.0,
        say: Callable[[str], None] | None = None,
        **options: Any,
    ) -> Swarm:
        """Log in, read ``experiment``, join its swarm; wait up to ``wait_s`` until every expert of
        its grids has a host in the DHT (0: do not wait). ``token_file``: the one given to ``lah
        train login --token-file`` (default: the keyring, else ``data_dir``'s file); ``data_dir``:
        identity and lock (default: ``lah train``'s); ``options``: the trainer's own settings
        (:data:`OPTIONS`, e.g. ``timeout=10.0`` per expert request). Raises :class:`SwarmError`s."""
        say = say or logger.info
        url = check_url(coordinator_url)
        if not isinstance(experiment, str) or not experiment:
            raise UnknownExperiment(f"name the experiment to join (a non-empty string), not {experiment!r}")
        _check_options(options)
        home = Path(data_dir) if data_dir is not None else default_trainer_dir()
        store = TrainerCredentials(home, Path(token_file) if token_file is not None else None)
        _pin_addresses()
        loop = LoopThread("swarm-loop")
        lock: InstanceLock | None = None
        node: TrainerNode | None = None
        try:
            credentials, account, raw = _login(loop, url, experiment, store, token_file)
            spec = parse_experiment(raw)
            lock = InstanceLock(home / "train.lock")
            try:
                lock.acquire()
            except AlreadyRunning as e:
                raise JoinFailed(
                    f"another trainer (pid {e.pid}) uses the data dir {home}: give this one its own "
                    "data_dir= (log in there too, or pass token_file=)"
                ) from e
            defaults: dict[str, Any] = {"timeout": 10.0, "grace_s": 0.3} if spec.kind == "lm" else {}
            config = TrainerConfig(
                uid_prefix=spec.name,
                batch_size=spec.batch_size,
                lr=spec.lr,
                target_batch_size=spec.target_batch_size,
                **(defaults | options),
            )
            node = TrainerNode(
                url,
                account,
                loop=loop,
                identity=Identity.load_or_create(home / "identity.key"),
                config=config,
                credentials=credentials,
                on_credentials=lambda c: _keep(store, url, c),  # the old token is revoked by then
                outbox_dir=home / "outbox",  # receipts and reports wait there while the coordinator is away
            )
            grid = next(iter(spec.grids.values()))  # spot checks recompute answers with its spec
            node.expert_spec = ExpertSpec(grid.expert_type, grid.dim, grid.hidden)
            try:
                loop.run(node.start(), 60)
            except (TimeoutError, RuntimeError, P2PError, DHTError, CoordinatorUnreachable) as e:
                raise JoinFailed(f"could not join the swarm of {url}: {type(e).__name__}: {e}") from e
            except CoordinatorError as e:
                raise explain_refusal(url, experiment, e) from e
            swarm = cls(url, spec, node, loop, lock, say)
        except BaseException:
            if node is not None:
                _quietly(loop, node.stop(), 30)
            loop.close()
            if lock is not None:
                lock.release()
            raise
        say(f"{account} ({node.identity.peer_id[:12]}…) joined experiment {spec.name} at {url}")
        if wait_s > 0:
            try:
                seen = swarm.wait_for_experts(wait_s)
            except BaseException:  # Ctrl+C while waiting: leave as cleanly as after training
                swarm.close()
                raise
            found = ", ".join(f"{seen[g.name]} of {g.experts} in {g.name}" for g in spec.grids.values())
            say(f"experts found through the DHT: {found}")
        return swarm

    # -- what the experiment offers ------------------------------------------------------------

    @property
    def grids(self) -> dict[str, Grid]:
        """The experiment's grids by name: shape, experts' width and type, top-k."""
        return dict(self.experiment.grids)

    @property
    def batch_size(self) -> int:
        """Samples per step the experiment suggests (a collaborative step counts them by default)."""
        return self.experiment.batch_size

    @property
    def lr(self) -> float:
        """The learning rate the experiment suggests."""
        return self.experiment.lr

    @property
    def target_batch_size(self) -> int:
        """Samples the collaboration processes per optimizer step (0: each trainer steps alone)."""
        return self.experiment.target_batch_size

    @property
    def peer_id(self) -> str:
        return self.node.identity.peer_id

    # -- the layer and the optimizer -----------------------------------------------------------

    def mixture(
        self,
        grid: str,
        *,
        dim: int | None = None,
        shape: tuple[int, ...] | None = None,
        pass_short: bool | None = None,
    ) -> MixtureLayer:
        """A mixture layer over ``grid``'s experts (a new gate each call; the experts are shared).
        ``dim``/``shape``: what the model expects, refused with :class:`Mismatch` when the experiment's
        experts differ; ``pass_short``: a token with no answer passes through unchanged instead of
        failing the batch (default: a language model's layers do, a classifier's do not)."""
        self._open()
        if grid not in self.experiment.grids:
            offered = ", ".join(self.experiment.grids)
            raise UnknownGrid(f"experiment {self.experiment.name} has no grid {grid!r}; it offers: {offered}")
        g = self.experiment.grids[grid]
        check_layer(g, dim, shape)
        cfg = dataclasses.replace(self.node.config, grid=g.shape, dim=g.dim, hidden=g.hidden, k_best=g.k_best)
        assert self.node.peer is not None and self.node.finder is not None
        short = self.experiment.kind == "lm" if pass_short is None else pass_short
        mixture = remote_mixture(
            self.node.peer, self.node.finder, self.loop, cfg, grid, self.node.observe, pass_short=short
        )
        layer = MixtureLayer(g, mixture)
        self._layers.append(layer)
        return layer

    def optimizer(
        self,
        optimizer: Callable[..., torch.optim.Optimizer],
        params: Iterable[torch.nn.Parameter],
        *,
        samples: int | None = None,
        **options: Any,
    ) -> torch.optim.Optimizer | SwarmOptimizer:
        """``optimizer(params, **options)`` (e.g. ``torch.optim.AdamW``) over the dense part; with the
        experiment's target batch size, wrapped to step with the other trainers (:class:`SwarmOptimizer`,
        each ``step()`` counting ``samples``, default :attr:`batch_size`), else returned as it is."""
        self._open()
        dense = dense_module(params)
        inner = optimizer(dense.parameters(), **options)
        if not isinstance(inner, torch.optim.Optimizer):
            raise Mismatch(f"optimizer must build a torch.optim.Optimizer, not {type(inner).__name__}")
        if self.experiment.target_batch_size <= 0:
            return inner
        if self._optimizer is not None:
            raise Mismatch("this swarm already has a collaborative optimizer: one dense model per trainer")
        n = self.batch_size if samples is None else samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise Mismatch(f"samples counts each step's samples: a positive int, not {n!r}")
        run = run_name(self.experiment.name, dense, inner)
        try:
            collab = self.loop.run(self.node.collaborate(dense, inner, run=run), 60)
        except (TimeoutError, DHTError, P2PError) as e:
            raise JoinFailed(f"could not join the collaboration {run}: {type(e).__name__}: {e}") from e
        timeout_s = self.node.config.collab_timeout_s
        self._optimizer = SwarmOptimizer(collab, self.loop, samples=n, timeout_s=timeout_s)
        target = self.experiment.target_batch_size
        self._say(f"the dense part steps with the experiment's other trainers (run {run}, target {target})")
        return self._optimizer

    # -- the swarm -----------------------------------------------------------------------------

    def wait_for_experts(self, timeout: float = 30.0) -> dict[str, int]:
        """Until every expert of the experiment's grids has a host in the DHT (or ``timeout``): how
        many each grid has (a first batch then finds them instead of failing for want of answers)."""
        self._open()
        finder = self.node.finder
        assert finder is not None
        uids = {g.name: g.uids() for g in self.experiment.grids.values()}
        prefixes = sorted({u.rpartition(".")[0] + "." for us in uids.values() for u in us})

        async def poll() -> dict[str, int]:
            deadline = time.monotonic() + timeout
            while True:
                for p in prefixes:
                    await finder.children(p)  # a stale answer is refreshed behind it: poll again
                seen = {g: sum(1 for u in us if finder.hosts_of(u)) for g, us in uids.items()}
                if all(seen[g] == len(us) for g, us in uids.items()) or time.monotonic() >= deadline:
                    return seen
                await asyncio.sleep(0.5)

        return self.loop.run(poll(), timeout + 30)

    @property
    def stats(self) -> SwarmStats:
        """What the swarm did so far (after :meth:`close`: the final figures)."""
        if self._final is not None:
            return self._final
        short = sum(layer.short_rows for layer in self._layers)
        return self.loop.run(collect(self.node, short, self._optimizer), 10)

    def flush(self, timeout: float = 30.0) -> None:
        """Post the receipts queued so far now (they go every few seconds anyway)."""
        self._open()
        self.loop.run(self.node.receipts.flush(), timeout)

    def close(self) -> SwarmStats:
        """Flush the receipts, leave the swarm, free the data dir; the final :attr:`stats`."""
        if self._final is not None:
            return self._final
        try:
            try:
                self.flush()
            except (TimeoutError, RuntimeError) as e:
                logger.warning("the last receipts were not posted: %s", e)
            final = self.stats
            if (refused := self.node.refused_line()) is not None:
                self._say(refused)
            _quietly(self.loop, self.node.stop(), 30)  # a last, bounded flush of anything left
            r = self.node.receipts.stats
            self._final = dataclasses.replace(
                final,
                receipts_submitted=r.submitted,
                receipts_credited=r.accepted,
                receipts_rejected=r.rejected,
                receipts_dropped=r.dropped,
            )
        finally:
            self.loop.close()
            self._lock.release()
        return self._final

    def __enter__(self) -> Swarm:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open(self) -> None:
        if self._final is not None:
            raise SwarmError("this swarm was closed: join again")


def _check_options(options: dict[str, Any]) -> None:
    fixed = sorted(set(options) & FIXED)
    if fixed:
        raise Mismatch(f"the experiment fixes {', '.join(fixed)}: a script cannot set them")
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise Mismatch(f"join() has no option {', '.join(unknown)}; it takes {', '.join(sorted(OPTIONS))}")


def _keep(store: TrainerCredentials, url: str, credentials: Credentials) -> None:
    store.save(url, credentials)


def _pin_addresses() -> None:
    from engine.p2p.patches import install, pin_host_addresses

    pinned = os.environ.get("LAH_HOST_ADDRESSES")  # e.g. 127.0.0.1 for local swarms and tests
    if pinned:
        pin_host_addresses([a.strip() for a in pinned.split(",") if a.strip()])
    install()


def _login(
    loop: LoopThread, url: str, experiment: str, store: TrainerCredentials, token_file: str | Path | None
) -> tuple[Credentials, str, dict[str, Any]]:
    """The account's fresh credentials and name, and the experiment's JSON (errors in plain words)."""
    api = CoordinatorApi(url, timeout=HTTP_TIMEOUT_S)
    try:
        stored = store.load(url)
        if stored is None:
            loop.run(probe(api), HTTP_TIMEOUT_S + 5)  # a wrong address says so before "no login"
            where = f" in {token_file}" if token_file is not None else ""
            raise LoginRequired(f"no trainer login for {url}{where}: {login_hint(url)}")
        return loop.run(prepare(api, store, stored, experiment), 4 * HTTP_TIMEOUT_S + 5)
    except CoordinatorUnreachable as e:
        raise explain_unreachable(url, e, HTTP_TIMEOUT_S) from e
    except CoordinatorError as e:
        raise explain_refusal(url, experiment, e) from e
    finally:
        _quietly(loop, api.close(), 5)


def _quietly(loop: LoopThread, coro: Any, timeout: float) -> None:
    try:
        loop.run(coro, timeout)
    except Exception:
        logger.exception("leaving the swarm: a step failed")
