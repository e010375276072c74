"""Where a node fits in the swarm: its expert assignment and the peers to bootstrap its DHT from.

``POST /api/assignment`` (bearer token; the peer must be bound to the token's account) takes the
node's capacity and answers with the experts to host, each with its spec (architecture name and
sizes from the coordinator's experiment config: no code travels) and a time after which the
assignment lapses unless the node asks again. Each expert comes with ``proof``: the coordinator's
signature (base64) of ``engine.wire.statements.assignment_signed_bytes(host public key, uid,
experiment, expires_at)``, which the host puts in its DHT declarations; ``coordinator_key`` (base64)
is what trainers check those proofs against. ``part_of`` names the language model a grid is a layer
of ("" for a classifier's grid): the tray app links the model's page on the site.

What a node claims is checked against what a machine can have: ``memory_bytes`` at most
``MAX_MEMORY_BYTES`` for its device (more would win it the whole grid), an energy report at most
``MAX_HOST_KW`` times the hours since the host's previous report (or since it was bound). A trainer's
(or an admin's) account does not host: 403 ``trainer_cannot_host`` if it offers memory (with none it
gets no experts, only the peers and the key, as a trainer asks).
"""

from __future__ import annotations

import base64
import random
import time
from datetime import UTC
from typing import Any

import msgspec
from aiohttp import web
from sqlalchemy import select, update

from engine.wire.statements import assignment_signed_bytes

from ..config import ExperimentConfig
from ..db.models import Host
from ..http.framework import ApiError, account_errors, authenticate, read_body
from ..hub.signaling import HUB_KEY
from ..services import SERVICES
from .assignment import Capacity, TrainerCannotHost, assign_host

# The largest memory one device of a volunteer's machine plausibly offers: big servers' RAM, the
# largest accelerators (a node uses one device), Apple's largest unified memory.
MAX_MEMORY_BYTES = {"cpu": 4 << 40, "cuda": 256 << 30, "mps": 512 << 30}
MAX_HOST_KW = 3.0  # a workstation with several GPUs at full power stays below this


class CapacityBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    peer_id: str
    device: str = "cpu"
    memory_bytes: int = 0
    upload_bytes_per_s: int = 0


def expert_spec(experiment: ExperimentConfig) -> dict[str, Any]:
    """The engine registry's ExpertSpec fields for this experiment's experts."""
    hp = experiment.hyperparams
    spec: dict[str, Any] = {"arch": experiment.expert_type, "dim": int(hp.get("d_model", hp.get("dim", 64)))}
    for name in ("hidden", "heads", "seq_len"):
        if name in hp:
            spec[name] = int(hp[name])
    return spec


@account_errors
async def assignment(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    claims, _ = await authenticate(request)
    body = await read_body(request, CapacityBody)
    if body.device not in ("cpu", "cuda", "mps"):
        raise ApiError(400, "invalid_request", f"unknown device {body.device!r}")
    limit = MAX_MEMORY_BYTES[body.device]
    if not 0 <= body.memory_bytes <= limit:
        raise ApiError(
            400, "invalid_request", f"memory_bytes must be within [0, {limit}] for a {body.device} device"
        )
    if await services.accounts.host_owner(body.peer_id) != claims.sub:
        raise ApiError(403, "host_not_bound", "bind this host to your account first (POST /api/hosts)")
    config = services.config
    now = time.time()
    try:
        pairs = await assign_host(
            services.sessions,
            config.grids,
            body.peer_id,
            Capacity(body.device, body.memory_bytes, body.upload_bytes_per_s),
            now=now,
            ttl_s=config.assignment_ttl_s,
        )
    except TrainerCannotHost as e:
        raise ApiError(403, "trainer_cannot_host", str(e)) from e
    by_name = {e.name: e for e in config.grids}
    expires = now + config.assignment_ttl_s
    async with services.sessions() as session:
        host_key = bytes(
            (await session.execute(select(Host.public_key).where(Host.peer_id == body.peer_id))).scalar_one()
        )

    def proof(name: str, uid: str) -> str:
        signed = services.tokens.sign_statement(assignment_signed_bytes(host_key, uid, name, expires))
        return base64.b64encode(signed).decode()

    experts = [
        {
            "experiment": name,
            "uid": uid,
            "spec": expert_spec(by_name[name]),
            "expires_at": expires,
            "proof": proof(name, uid),
            "part_of": by_name[name].part_of,  # a language model's layer names its model (the app links it)
        }
        for name, uid in pairs
    ]
    hub = request.app.get(HUB_KEY)
    online = [p for p in (await hub.online_all() if hub is not None else []) if p != body.peer_id]
    bootstrap = random.sample(online, min(len(online), config.bootstrap_peers))
    coordinator_key = base64.b64encode(services.tokens.public_key_bytes).decode()
    return web.json_response(
        {
            "experts": experts,
            "bootstrap": bootstrap,
            "ttl_s": config.assignment_ttl_s,
            "coordinator_key": coordinator_key,
        }
    )


class EnergyBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    peer_id: str
    kwh_delta: float  # since the host's previous report


MAX_KWH_PER_REPORT = 10.0  # a busy 1 kW machine reporting every few minutes stays far below this


@account_errors
async def energy(request: web.Request) -> web.StreamResponse:
    """A host adds the energy its node estimates it spent on contributed work since its last report."""
    services = request.app[SERVICES]
    claims, _ = await authenticate(request)
    body = await read_body(request, EnergyBody)
    if not 0.0 <= body.kwh_delta <= MAX_KWH_PER_REPORT:
        raise ApiError(400, "invalid_request", f"kwh_delta must be within [0, {MAX_KWH_PER_REPORT}]")
    if await services.accounts.host_owner(body.peer_id) != claims.sub:
        raise ApiError(403, "host_not_bound", "this host is not bound to your account")
    now = time.time()
    async with services.sessions() as session, session.begin():
        # Written first (SQLite's write lock), so concurrent reports of one host cannot both spend
        # the same elapsed time.
        last = (
            await session.execute(
                update(Host)
                .where(Host.peer_id == body.peer_id)
                .values(energy_reported_at=Host.energy_reported_at)
                .returning(Host.energy_reported_at, Host.bound_at)
            )
        ).one()
        bound_at = last[1] if last[1].tzinfo is not None else last[1].replace(tzinfo=UTC)  # SQLite: naive UTC
        since = last[0] if last[0] > 0 else bound_at.timestamp()
        allowed = MAX_HOST_KW * max(0.0, now - since) / 3600.0
        if body.kwh_delta > allowed:
            raise ApiError(
                422,
                "implausible_energy",
                f"{body.kwh_delta} kWh in {max(0.0, now - since):.0f} s is more than {MAX_HOST_KW} kW",
            )
        await session.execute(
            update(Host)
            .where(Host.peer_id == body.peer_id)
            .values(energy_kwh=Host.energy_kwh + body.kwh_delta, energy_reported_at=now)
        )
        total = (
            await session.execute(select(Host.energy_kwh).where(Host.peer_id == body.peer_id))
        ).scalar_one()
    return web.json_response({"peer_id": body.peer_id, "energy_kwh": total})


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/api/assignment", assignment)
    app.router.add_post("/api/hosts/energy", energy)
