"""Shared by the account, token and signaling-auth tests: services on the ``db`` fixture, an app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.accounts import bind_message
from coordinator.accounts.api_accounts import setup_routes
from coordinator.config import CoordinatorConfig
from coordinator.hub.signaling import SignalingHub
from coordinator.services import SERVICES, Services, open_services
from engine.p2p.identity import Identity

HUB = web.AppKey("test_hub", SignalingHub)


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def config(tmp_path: Path, **overrides: Any) -> CoordinatorConfig:
    return CoordinatorConfig(token_key_path=str(tmp_path / "token.key"), **overrides)


async def services(
    db: AsyncEngine, tmp_path: Path, clock: FakeClock | None = None, **overrides: Any
) -> Services:
    clock = clock or FakeClock()
    return await open_services(config(tmp_path, **overrides), engine=db, clock=clock, monotonic=clock)


def app(services: Services, *, hub: bool = True) -> web.Application:
    application = web.Application()
    application[SERVICES] = services
    setup_routes(application)
    if hub:
        signaling = SignalingHub(authorize=services.authorize_peer, limiter=services.ws_limiter)
        application[HUB] = signaling
        application.router.add_get("/ws/signal", signaling.handle)
    return application


async def volunteer_with_host(services: Services, name: str) -> tuple[int, str, Identity]:
    """A registered account with one bound host: (account id, token, host identity)."""
    account = await services.accounts.register(name)
    identity = Identity.generate()
    await services.accounts.bind_host(
        account.id, identity.public_key, identity.sign(bind_message(account.id))
    )
    return account.id, services.tokens.issue(account.id, account.role), identity
