"""The site's part of collaborative training: the swarm page's collaboration panel, the leaderboard's
Trainers tab (``/leaderboard?kind=trainers``) and the training-samples tile of a trainer's contributor
page, read through ``coordinator.swarm.collab_status`` and ``coordinator.credit.training``. ``routes``
calls its handlers; it renders with ``render`` and checks parameters with ``params``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..credit.training import account_training_samples, trainer_board
from ..swarm.collab_status import OUTCOME_LABELS, CollabView, collaborations
from .params import BadParam, int_param
from .render import SITE, error_page, render

MAX_PAGE = 400
#: The badge class of each round outcome (the word is always shown; the colour only repeats it).
OUTCOME_BADGES = {"ok": "good", "partial": "warn", "local": "warn", "timed_out": "bad"}


async def collab_panel(request: web.Request) -> list[CollabView]:
    ctx = request.app[SITE]
    config = ctx.get_config(request.app)
    return await collaborations(ctx.get_sessions(request.app), config.experiments, ctx.clock())


def panel_context() -> dict[str, Any]:
    return {"outcome_labels": OUTCOME_LABELS, "outcome_badges": OUTCOME_BADGES}


async def trainers_page(request: web.Request) -> web.Response:
    """Trainer accounts by training samples: one order (all time), so no sort or range."""
    ctx = request.app[SITE]
    try:
        extra = set(request.query) - {"kind", "page"}
        if extra:
            raise BadParam(
                "the Trainers tab ranks by training samples of all time: leave out "
                + ", ".join(sorted(extra))
            )
        page = int_param(request.query.get("page", "1"), "page", 1, MAX_PAGE)
    except BadParam as e:
        return error_page(request, 400, str(e))
    board = await trainer_board(ctx.get_sessions(request.app), page, ctx.per_page)
    return render(request, "leaderboard_trainers.html", nav="leaderboard", board=board)


async def training_samples(request: web.Request, account_id: int) -> int:
    """The account's training samples (0 for volunteers): a tile on its contributor page."""
    ctx = request.app[SITE]
    async with ctx.get_sessions(request.app)() as session:
        return await account_training_samples(session, account_id)
