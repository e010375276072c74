"""The coordinator's aiohttp application and how to start it (in-process for tests and the demo)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from engine.p2p.signaling_protocol import IceServer

from .. import site
from ..accounts import api_accounts, api_trainers
from ..config import CoordinatorConfig
from ..credit import api_ledger
from ..credit.receipts import Verifier
from ..http.framework import account_errors, authenticate, error_response
from ..hub.presence import ReplicaGroup
from ..hub.signaling import HUB_KEY, SignalingHub
from ..hub.turn import TurnConfig
from ..replicas.outage import HEALTH_CHECKS, database_check, database_outage, run_checks
from ..services import SERVICES, Services, open_services
from ..swarm import api_collab, api_progress, api_swarm

# Connections the kernel holds for us before we accept them (capped by net.core.somaxconn). When a
# replica dies, its thousand peers reconnect to the survivors within a second; with aiohttp's default
# of 128 the queue overflowed, the kernel dropped the proxy's SYNs, and each retransmission (1 s, 3 s,
# then the proxy's connect timeout and retry) added seconds to the failover's slowest peers.
LISTEN_BACKLOG = 4096


def create_app(
    ice_servers: Sequence[IceServer] = (), turn: TurnConfig | None = None, hub: SignalingHub | None = None
) -> web.Application:
    """Signaling alone, open to any key holder: the transport demo and tests use this."""
    app = web.Application()
    hub = hub or SignalingHub(ice_servers=tuple(ice_servers), turn=turn)
    app[HUB_KEY] = hub

    async def close_sockets(_: web.Application) -> None:
        await hub.close_all()

    app.on_shutdown.append(close_sockets)
    app.router.add_get("/ws/signal", hub.handle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/api/peers", _peers)
    return app


async def _healthz(request: web.Request) -> web.Response:
    """200 while every check in ``HEALTH_CHECKS`` passes (the proxy's health check), else 503."""
    checks = await run_checks(request.app.get(HEALTH_CHECKS, {}))
    ok = all(checks.values())
    return web.json_response({"ok": ok, "checks": checks}, status=200 if ok else 503)


async def _peers(request: web.Request) -> web.StreamResponse:
    """Who is online: for account holders on the full coordinator (a bearer token of an enabled
    account), from this machine only on the signaling-only hub (demos and tests)."""
    if SERVICES in request.app:
        return await _peers_for_accounts(request)
    if request.remote not in ("127.0.0.1", "::1"):
        return error_response(403, "forbidden", "the peer list is served to this machine only")
    return await _peer_list(request)


@account_errors
async def _peers_for_accounts(request: web.Request) -> web.StreamResponse:
    await authenticate(request)
    return await _peer_list(request)


async def _peer_list(request: web.Request) -> web.Response:
    hub = request.app[HUB_KEY]
    return web.json_response({"online": await hub.online_all(), "stats": vars(hub.stats)})


async def create_full_app(config: CoordinatorConfig, services: Services | None = None) -> web.Application:
    """The whole coordinator: accounts, token-gated signaling, assignment, ledger, site.

    Opens the database (running migrations) unless ``services`` is given.
    """
    services = services or await open_services(config)
    stun = [IceServer(urls=list(config.stun_urls))] if config.stun_urls else []
    turn = TurnConfig(tuple(config.turn.urls), config.turn.secret, config.turn.ttl_s) if config.turn else None
    hub = SignalingHub(
        ice_servers=stun,
        turn=turn,
        authorize=services.authorize_peer,
        limiter=services.ws_limiter,
        offers=services.offer_gate,
        recheck=services.refused_peers,
        address_of=services.client_address,
    )
    app = create_app(hub=hub)
    app[SERVICES] = services
    app.middlewares.append(database_outage)  # a database that is away: 503, not 500
    app[HEALTH_CHECKS] = {"database": database_check(services.engine)}  # replicas add "relay"
    # Ed25519 checks hold the GIL: a pool of spawned processes (started on the first big batch)
    # is what lets receipt ingestion use more than one core.
    workers = config.verify_workers if config.verify_workers is not None else (os.cpu_count() or 1)
    verifier = Verifier(workers=workers)

    async def close_services(_: web.Application) -> None:
        verifier.close()
        await services.close()

    app.on_cleanup.append(close_services)
    if services.engine.dialect.name == "postgresql":
        app.cleanup_ctx.append(_replica_group(hub, services))
    app.cleanup_ctx.append(services.housekeeping)
    api_accounts.setup_routes(app)
    api_ledger.setup_routes(app, api_ledger.LedgerDeps.of(config, services.sessions, verifier))
    api_swarm.setup_routes(app)
    api_collab.setup_routes(app)
    api_trainers.setup_routes(app)
    api_progress.setup_routes(app)
    app.router.add_get("/api/updates", _updates)
    site.setup_routes(app)
    # Range sums every few minutes; daily dumps, written by a child process.
    site.start_jobs(
        app,
        site.services_sessions,
        site.services_exports_dir,
        get_database_url=site.services_database_url,
        leader=services.leader,  # with replicas: on one of them at a time
    )
    return app


async def _updates(request: web.Request) -> web.Response:
    """Where this project's apps look for releases (``update_manifest_url``; null: nowhere). Public: the
    app asks before it has a token in hand, and a manifest is believed only for the release key's
    signature, never for where it was found."""
    url = request.app[SERVICES].config.update_manifest_url
    return web.json_response({"manifest_url": url}, headers={"Cache-Control": "max-age=300"})


def _replica_group(hub: SignalingHub, services: Services) -> Callable[[web.Application], AsyncIterator[None]]:
    """On PostgreSQL every coordinator is a replica of a group (maybe of one): presence and relaying
    go through the database, so another process on the same URL joins with no flag at all."""

    async def relay_check() -> bool:  # a replica that cannot relay leaves the proxy's rotation
        return hub.healthy()

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        group = ReplicaGroup(services.engine)
        await group.start(hub)
        hub.group = group
        app[HEALTH_CHECKS]["relay"] = relay_check
        yield
        await hub.close_all()  # before the group's rows go: no socket outlives its presence
        hub.group = None
        await group.stop()

    return ctx


@dataclass
class RunningCoordinator:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def hub(self) -> SignalingHub:
        return self.runner.app[HUB_KEY]

    @property
    def services(self) -> Services:
        return self.runner.app[SERVICES]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
    """Start the signaling-only coordinator on the running loop; port 0 picks a free one."""
    return await _serve(create_app(ice_servers, turn), host, port)


async def start_full(config: CoordinatorConfig, services: Services | None = None) -> RunningCoordinator:
    """Start the whole coordinator on ``config.host``/``config.port`` (port 0 picks a free one)."""
    return await _serve(await create_full_app(config, services), config.host, config.port)


async def _serve(app: web.Application, host: str, port: int) -> RunningCoordinator:
    runner = web.AppRunner(app, handle_signals=False, max_line_size=site.MAX_REQUEST_LINE)
    await runner.setup()
    tcp = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
    await tcp.start()
    server = tcp._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    bound_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    return RunningCoordinator(runner, host, bound_port)
