"""The whole coordinator on a real socket: register, bind a host, join signaling, get an assignment."""

import base64
import time
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import update

from coordinator.accounts.accounts import bind_message
from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.db.models import Host
from coordinator.server.app import RunningCoordinator, start_full
from engine.p2p import Identity, Peer, SignalingError
from engine.p2p.patches import pin_host_addresses

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 16, "hidden": 32})


async def test_volunteer_joins_and_is_assigned(tmp_path: Path) -> None:
    pin_host_addresses(["127.0.0.1"])
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
    )
    running = await start_full(config)
    me = Identity.generate()
    try:
        async with aiohttp.ClientSession(running.url) as http:
            r = await http.post("/api/accounts", json={"name": "Ada", "team": "Night Owls"})
            assert r.status == 201, await r.text()
            reg = await r.json()
            token, account = reg["token"], reg["account"]["id"]
            auth = {"Authorization": f"Bearer {token}"}

            # Not bound yet: signaling refuses and so does the assignment.
            stranger = Peer(me, running.signaling_url, token=token)
            with pytest.raises(SignalingError, match="host_not_bound"):
                await stranger.start()
            await stranger.stop()
            r = await http.post(
                "/api/assignment", json={"peer_id": me.peer_id, "memory_bytes": 1 << 30}, headers=auth
            )
            assert r.status == 403

            proof = me.sign(bind_message(account))
            body = {
                "public_key": base64.b64encode(me.public_key).decode(),
                "signature": base64.b64encode(proof).decode(),
            }
            r = await http.post("/api/hosts", json=body, headers=auth)
            assert r.status in (200, 201), await r.text()

            peer = Peer(me, running.signaling_url, token=token)
            await peer.start()
            try:
                r = await http.post(
                    "/api/assignment", json={"peer_id": me.peer_id, "memory_bytes": 1 << 30}, headers=auth
                )
                assert r.status == 200, await r.text()
                got = await r.json()
                assert sorted(e["uid"] for e in got["experts"]) == [
                    "ffn.0.0",
                    "ffn.0.1",
                    "ffn.1.0",
                    "ffn.1.1",
                ]
                assert got["experts"][0]["spec"] == {"arch": "ffn", "dim": 16, "hidden": 32}
                assert me.peer_id in running.hub.online()
            finally:
                await peer.stop()
            # The node reports the energy it estimates it spent; it adds up, within sane bounds (an
            # hour since its previous report, here).
            for delta, status in ((0.25, 200), (0.5, 200), (-1.0, 400), (1e6, 400)):
                await _last_energy_report_at(running, me.peer_id, time.time() - 3600)
                r = await http.post(
                    "/api/hosts/energy", json={"peer_id": me.peer_id, "kwh_delta": delta}, headers=auth
                )
                assert r.status == status, await r.text()
            assert (await r.json())["error"] == "invalid_request"
            r = await http.post(
                "/api/hosts/energy", json={"peer_id": "ab" * 20, "kwh_delta": 0.1}, headers=auth
            )
            assert r.status == 403  # someone else's host
            async with running.services.sessions() as session:
                host = await session.get(Host, me.peer_id)
                assert host is not None and host.energy_kwh == 0.75
            r = await http.get("/api/me", headers=auth)
            me_data = await r.json()
            assert me_data["credit"] == {"total": 0.0, "recent": 0.0, "rank": 1}
            assert me_data["hosts"] == [me.peer_id]
            for path in ("/", "/leaderboard", "/swarm", "/api/leaderboard"):
                r = await http.get(path)
                assert r.status == 200, path
    finally:
        await running.stop()


async def _last_energy_report_at(running: RunningCoordinator, peer_id: str, at: float) -> None:
    async with running.services.sessions() as session, session.begin():
        await session.execute(update(Host).where(Host.peer_id == peer_id).values(energy_reported_at=at))
