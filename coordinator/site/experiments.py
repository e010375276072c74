"""The experiments' pages: ``/experiments`` (the list), ``/experiments/{name}`` (one experiment: its
validation-loss curves, the newest generated sample, its shape and how many hosts serve each grid now)
and their JSON twins under ``/api/site/experiments``.

Training progress is what trainer accounts report (``coordinator.swarm.progress``): each curve is drawn as
its trainer's and named so, and the sample says whose model wrote it; no figure of one trainer is shown
as the experiment's. A sample is text from the network: the template escapes it like any name.
``routes.setup_routes`` adds these handlers; they render with ``render``'s helpers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from ..config import ExperimentConfig
from ..db.models import Assignment
from ..swarm.assignment import expert_uids
from ..swarm.progress import Progress, TrainerCurve, experiment_progress, latest_reports
from .chart import SERIES_STYLES, LinePoint, line_chart, short_number
from .render import SECURITY_HEADERS, SITE, error_json, error_page, render


@dataclass(frozen=True)
class GridLoad:
    """One grid of experts and who serves it now (unexpired assignments, as the swarm page counts)."""

    name: str
    experts: int
    hosts: int  # distinct hosts assigned any of its experts
    covered: int  # experts with at least one host


@dataclass(frozen=True)
class Shape:
    """What an experiment is made of; the ``lm`` fields are None for a classifier."""

    name: str
    kind: str
    expert_type: str
    grid: list[int]
    experts_per_grid: int
    replication: int
    grids: list[GridLoad]
    hosts: int  # distinct hosts serving any of its grids now
    layers: int | None = None
    dim: int | None = None
    heads: int | None = None
    context: int | None = None
    vocab_size: int | None = None
    mixture_blocks: list[int] | None = None
    k_best: int | None = None
    expert_hidden: int | None = None
    tokenizer: str | None = None

    @property
    def experts(self) -> int:
        return sum(g.experts for g in self.grids)

    @property
    def covered(self) -> int:
        return sum(g.covered for g in self.grids)


def find(experiments: list[ExperimentConfig], name: str) -> ExperimentConfig | None:
    return next((e for e in experiments if e.name == name), None)


async def grid_loads(
    session: AsyncSession, grids: list[ExperimentConfig], now: float
) -> tuple[list[GridLoad], int]:
    """Each grid's load, and the distinct hosts over all of them (a host may serve several layers)."""
    names = [g.name for g in grids]
    live_now = (Assignment.experiment.in_(names), Assignment.expires_at > now)
    total = (
        await session.execute(select(func.count(func.distinct(Assignment.host_peer_id))).where(*live_now))
    ).scalar_one()
    rows = (
        await session.execute(
            select(
                Assignment.experiment,
                func.count(func.distinct(Assignment.host_peer_id)),
                func.count(func.distinct(Assignment.expert_uid)),
            )
            .where(*live_now)
            .group_by(Assignment.experiment)
        )
    ).all()
    live = {str(name): (int(hosts), int(covered)) for name, hosts, covered in rows}
    return [GridLoad(g.name, len(expert_uids(g)), *live.get(g.name, (0, 0))) for g in grids], int(total)


def shape_of(experiment: ExperimentConfig, loads: tuple[list[GridLoad], int]) -> Shape:
    base = Shape(
        experiment.name,
        experiment.kind,
        experiment.expert_type,
        list(experiment.grid),
        math.prod(experiment.grid),
        experiment.replication,
        *loads,
    )
    lm = experiment.lm
    if experiment.kind != "lm" or lm is None:
        return base
    return dataclasses.replace(
        base,
        layers=lm.layers,
        dim=lm.dim,
        heads=lm.heads,
        context=lm.context,
        vocab_size=lm.vocab_size,
        mixture_blocks=[b + 1 for b in lm.moe_blocks],  # counted from 1 on the page, as people count
        k_best=lm.k_best,
        expert_hidden=lm.hidden,
        tokenizer=lm.tokenizer,
    )


def curve_chart(progress: Progress, name: str) -> Any:
    series = [
        [
            LinePoint(
                p.train_tokens,
                p.val_loss,
                f"step {p.step:,}, {short_number(p.train_tokens)} tokens: validation loss {p.val_loss:.3f}",
            )
            for p in curve.points
        ]
        for curve in progress.curves
    ]
    return line_chart(series, f"Validation loss of {name} over training tokens, one line per trainer")


def curve_summary(curves: list[TrainerCurve]) -> str:
    """The chart in words: each line's span and latest value (names are escaped by the template)."""
    if not curves:
        return "No trainer has reported an evaluation yet."
    parts = []
    for c in curves:
        first, last = c.points[0], c.latest
        parts.append(
            f"{c.account_name}: {len(c.points)} evaluations from {short_number(first.train_tokens)} to "
            f"{short_number(last.train_tokens)} tokens, validation loss "
            f"{first.val_loss:.3f} to {last.val_loss:.3f}"
        )
    return "; ".join(parts) + "."


async def _load(request: web.Request) -> tuple[Shape, Progress] | None:
    ctx = request.app[SITE]
    experiment = find(ctx.get_config(request.app).experiments, request.match_info["name"])
    if experiment is None:
        return None
    async with ctx.get_sessions(request.app)() as session:
        loads = await grid_loads(session, experiment.grids(), ctx.clock())
        progress = await experiment_progress(session, experiment.name)
    return shape_of(experiment, loads), progress


async def experiment_page(request: web.Request) -> web.Response:
    loaded = await _load(request)
    if loaded is None:
        return error_page(
            request, 404, "There is no experiment with this name; the experiments page lists them."
        )
    shape, progress = loaded
    return render(
        request,
        "experiment.html",
        nav="experiments",
        shape=shape,
        progress=progress,
        chart=curve_chart(progress, shape.name),
        summary=curve_summary(progress.curves),
        styles=SERIES_STYLES,
    )


def shape_json(shape: Shape) -> dict[str, Any]:
    out = dataclasses.asdict(shape)
    out.update(experts=shape.experts, covered=shape.covered)
    return out


async def experiment_api(request: web.Request) -> web.Response:
    loaded = await _load(request)
    if loaded is None:
        return error_json(404, "no such experiment")
    shape, progress = loaded
    return web.json_response(
        {
            "experiment": shape_json(shape),
            "trainers_reporting": progress.trainers,
            "curves": [dataclasses.asdict(c) for c in progress.curves],
            "sample": dataclasses.asdict(progress.sample) if progress.sample is not None else None,
        },
        headers=SECURITY_HEADERS,
    )


async def _list(request: web.Request) -> list[tuple[Shape, Any]]:
    ctx = request.app[SITE]
    experiments = ctx.get_config(request.app).experiments
    async with ctx.get_sessions(request.app)() as session:
        latest = await latest_reports(session, [e.name for e in experiments])
        shapes = [shape_of(e, await grid_loads(session, e.grids(), ctx.clock())) for e in experiments]
    return [(s, latest.get(s.name)) for s in shapes]


async def experiments_page(request: web.Request) -> web.Response:
    return render(request, "experiments.html", nav="experiments", rows=await _list(request))


async def experiments_api(request: web.Request) -> web.Response:
    rows = await _list(request)
    return web.json_response(
        {
            "experiments": [
                shape_json(s) | {"latest": dataclasses.asdict(r) if r is not None else None} for s, r in rows
            ]
        },
        headers=SECURITY_HEADERS,
    )
