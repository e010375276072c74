"""The trainer's calls to the coordinator's HTTP API: join, bootstrap peers, receipts, spot checks.

Plain HTTP through aiohttp with a finite timeout on every call; the engine never imports the coordinator.
A trainer is an account holder like a volunteer (its peer must be bound to its account to use
signaling), and its account needs the ``trainer`` role, which an admin grants, for its receipts to count.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine.p2p.identity import Identity
from engine.p2p.signaling import signaling_url_of
from engine.wire.statements import bind_message

__all__ = ["CoordinatorError", "CoordinatorHttp", "TrainerAccount"]


class CoordinatorError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"coordinator answered {status}: {body[:300]}")
        self.status = status


@dataclass(frozen=True)
class TrainerAccount:
    account_id: int
    name: str
    token: str


class CoordinatorHttp:
    """One aiohttp session to ``url``; every call times out after ``timeout`` s."""

    def __init__(self, url: str, *, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def signaling_url(self) -> str:
        return signaling_url_of(self.url)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def post(self, path: str, body: Any, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self._http().post(self.url + path, json=body, headers=headers) as r:
            text = await r.text()
            if r.status >= 400:
                raise CoordinatorError(r.status, text)
            return await r.json(content_type=None) if text else {}

    async def get(self, path: str) -> Any:
        async with self._http().get(self.url + path) as r:
            if r.status >= 400:
                raise CoordinatorError(r.status, await r.text())
            return await r.json(content_type=None)

    async def register(self, name: str, identity: Identity, team: str | None = None) -> TrainerAccount:
        """Create an account and bind ``identity``'s key to it (so it may join signaling)."""
        reg = await self.post("/api/accounts", {"name": name, "team": team})
        account = TrainerAccount(int(reg["account"]["id"]), name, str(reg["token"]))
        proof = identity.sign(bind_message(account.account_id))
        body = {
            "public_key": base64.b64encode(identity.public_key).decode(),
            "signature": base64.b64encode(proof).decode(),
        }
        await self.post("/api/hosts", body, account.token)
        return account

    async def bootstrap_peers(self, account: TrainerAccount, peer_id: str) -> list[str]:
        """Online peers to join the DHT through (an assignment with no capacity: no experts)."""
        got = await self.post("/api/assignment", {"peer_id": peer_id, "memory_bytes": 0}, account.token)
        return [str(p) for p in got.get("bootstrap", [])]

    async def post_receipts(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        answer: dict[str, Any] = await self.post("/api/receipts", {"receipts": batch})
        return answer

    async def post_spot_check(self, report: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = await self.post("/api/spot-checks", report)
        return answer

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
