"""Where a node fits in the swarm: its expert assignment and the peers to bootstrap its DHT from.

``POST /api/assignment`` (bearer token; the peer must be bound to the token's account) takes the
node's capacity and answers with the experts to host, each with its spec (architecture name and
sizes from the coordinator's experiment config: no code travels) and a time after which the
assignment lapses unless the node asks again.
"""

from __future__ import annotations

import random
import time
from typing import Any

import msgspec
from aiohttp import web

from .api_accounts import authenticate, json_errors, read_body
from .assignment import Capacity, assign_host
from .config import ExperimentConfig
from .http import ApiError
from .services import SERVICES
from .signaling import HUB_KEY


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


@json_errors
async def assignment(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    claims, _ = await authenticate(request)
    body = await read_body(request, CapacityBody)
    if body.device not in ("cpu", "cuda", "mps"):
        raise ApiError(400, "invalid_request", f"unknown device {body.device!r}")
    if not 0 <= body.memory_bytes <= 1 << 44:
        raise ApiError(400, "invalid_request", "memory_bytes out of range")
    if await services.accounts.host_owner(body.peer_id) != claims.sub:
        raise ApiError(403, "host_not_bound", "bind this host to your account first (POST /api/hosts)")
    config = services.config
    now = time.time()
    pairs = await assign_host(
        services.sessions,
        config.experiments,
        body.peer_id,
        Capacity(body.device, body.memory_bytes, body.upload_bytes_per_s),
        now=now,
        ttl_s=config.assignment_ttl_s,
    )
    by_name = {e.name: e for e in config.experiments}
    expires = now + config.assignment_ttl_s
    experts = [
        {"experiment": name, "uid": uid, "spec": expert_spec(by_name[name]), "expires_at": expires}
        for name, uid in pairs
    ]
    hub = request.app.get(HUB_KEY)
    online = [p for p in (hub.online() if hub is not None else []) if p != body.peer_id]
    bootstrap = random.sample(online, min(len(online), config.bootstrap_peers))
    return web.json_response({"experts": experts, "bootstrap": bootstrap, "ttl_s": config.assignment_ttl_s})


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/api/assignment", assignment)
