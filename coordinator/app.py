"""The coordinator's aiohttp application and how to start it (in-process for tests and the demo)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from engine.p2p.signaling_protocol import IceServer

from .signaling import SignalingHub
from .turn import TurnConfig

HUB_KEY = web.AppKey("hub", SignalingHub)


def create_app(ice_servers: Sequence[IceServer] = (), turn: TurnConfig | None = None) -> web.Application:
    app = web.Application()
    hub = SignalingHub(ice_servers=tuple(ice_servers), turn=turn)
    app[HUB_KEY] = hub
    app.router.add_get("/ws/signal", hub.handle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/api/peers", _peers)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _peers(request: web.Request) -> web.Response:
    hub = request.app[HUB_KEY]
    return web.json_response({"online": hub.online(), "stats": vars(hub.stats)})


@dataclass
class RunningCoordinator:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def hub(self) -> SignalingHub:
        return self.runner.app[HUB_KEY]

    @property
    def signaling_url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws/signal"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start(
    host: str = "127.0.0.1",
    port: int = 0,
    ice_servers: Sequence[IceServer] = (),
    turn: TurnConfig | None = None,
) -> RunningCoordinator:
    """Start the coordinator on the running loop; port 0 picks a free one."""
    runner = web.AppRunner(create_app(ice_servers, turn), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    bound_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    return RunningCoordinator(runner, host, bound_port)
