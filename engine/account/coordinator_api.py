"""The coordinator's HTTP API, the engine's one client of it: the node's accounts, host binding, token
refresh, assignments and energy, and the trainer's login, experiment, bootstrap peers, receipts, spot
checks, collaboration status and evaluations (``progress_report`` builds one: the experiment's page).

Every request has a finite timeout. Failures become :class:`CoordinatorUnreachable` (no answer) or
:class:`CoordinatorError` (an answer with an error code). The engine does not import ``coordinator``;
the one piece both must agree on byte for byte, the host-binding message, is in engine/wire/statements.py.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from .errors import CoordinatorError, CoordinatorUnreachable
from .tokens import Credentials

if TYPE_CHECKING:  # the tray app registers through this module without loading torch and aiortc
    from engine.moe import ExpertSpec
    from engine.p2p import Identity


#: The coordinator's limit on an evaluation's sample (``coordinator.swarm.progress.MAX_SAMPLE_BYTES``).
PROGRESS_SAMPLE_BYTES = 4096
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # what the coordinator refuses in a sample


@dataclass(frozen=True)
class AssignedExpert:
    experiment: str
    uid: str
    spec: ExpertSpec
    expires_at: float
    proof: bytes = b""  # the coordinator's signature of the assignment statement (DHT declarations)
    part_of: str = ""  # the language model this grid is a layer of ("" for a classifier's grid)


@dataclass(frozen=True)
class Assignment:
    experts: tuple[AssignedExpert, ...]
    bootstrap: tuple[str, ...]
    ttl_s: float
    coordinator_key: bytes = b""  # what the assignment proofs verify with

    @property
    def specs(self) -> dict[str, ExpertSpec]:
        return {e.uid: e.spec for e in self.experts}


def parse_assignment(raw: Any) -> Assignment:
    from engine.moe import ExpertSpec

    try:
        experts = tuple(
            AssignedExpert(
                str(e["experiment"]),
                str(e["uid"]),
                ExpertSpec.from_fields({"hidden": 0, "heads": 1, "seq_len": 0, **e["spec"]}),
                float(e["expires_at"]),
                base64.b64decode(e.get("proof", ""), validate=True),
                str(e.get("part_of", "")),
            )
            for e in raw["experts"]
        )
        return Assignment(
            experts,
            tuple(str(p) for p in raw["bootstrap"]),
            float(raw["ttl_s"]),
            base64.b64decode(raw.get("coordinator_key", ""), validate=True),
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise CoordinatorError(200, "bad_reply", f"unexpected assignment reply: {e}") from e


def progress_report(
    step: int, train_tokens: int, val_loss: float | None, tokens_per_s: float, sample: str | None = None
) -> dict[str, Any] | None:
    """The body of :meth:`CoordinatorApi.post_progress`, or None for an evaluation with no finite loss
    (every batch of it lost to the swarm): nothing to draw. The sample is made acceptable rather than
    refused: control characters become U+FFFD, and it is cut to ``PROGRESS_SAMPLE_BYTES`` of UTF-8."""
    if val_loss is None or not math.isfinite(val_loss):
        return None
    body: dict[str, Any] = {
        "step": step,
        "train_tokens": train_tokens,
        "val_loss": val_loss,
        "tokens_per_s": tokens_per_s if math.isfinite(tokens_per_s) and tokens_per_s > 0 else 0.0,
    }
    if sample:
        clean = _CONTROL.sub("\ufffd", sample).encode("utf-8", "replace")
        body["sample"] = clean[:PROGRESS_SAMPLE_BYTES].decode("utf-8", "ignore")  # no half character
    return body


class CoordinatorApi:
    """One aiohttp session (connection pool) to ``url``; every call times out after ``timeout`` s."""

    def __init__(self, url: str, *, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None  # one connection pool for the node's life

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def signaling_url(self) -> str:
        from engine.p2p.signaling import signaling_url_of

        return signaling_url_of(self.url)

    async def get(self, path: str, token: str | None = None) -> Any:
        """A GET of the JSON API (``path`` with its query), e.g. ``/api/leaderboard?kind=hosts``."""
        return await self._post(path, None, token, method="GET")

    async def _post(
        self, path: str, body: dict[str, Any] | None, token: str | None = None, method: str = "POST"
    ) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        payload = None if method == "GET" else (body if body is not None else {})
        try:
            async with self._http().request(method, self.url + path, json=payload, headers=headers) as r:
                try:
                    data = await r.json(content_type=None)
                except ValueError:
                    data = {}
                if r.status >= 400:
                    data = data if isinstance(data, dict) else {}
                    raise CoordinatorError(
                        r.status, str(data.get("error", "http_error")), str(data.get("message", r.reason))
                    )
                return data
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise CoordinatorUnreachable(f"{self.url} unreachable: {type(e).__name__}: {e}") from e
        except aiohttp.ClientError as e:
            raise CoordinatorUnreachable(f"coordinator {self.url}: {type(e).__name__}: {e}") from e

    async def report_energy(self, token: str, peer_id: str, kwh_delta: float) -> float:
        """Add ``kwh_delta`` to this host's reported energy; returns the coordinator's total."""
        data = await self._post("/api/hosts/energy", {"peer_id": peer_id, "kwh_delta": kwh_delta}, token)
        return float(data.get("energy_kwh", 0.0))

    async def credit(self, token: str) -> tuple[float, int | None]:
        """This account's total credit, as the coordinator's ledger has it, and its rank (1 = first)."""
        data = await self._post("/api/me", None, token, method="GET")
        credit = data.get("credit", {})
        rank = credit.get("rank")
        return float(credit.get("total", 0.0)), int(rank) if isinstance(rank, int) else None

    async def register(self, name: str, team: str | None = None, invite: str | None = None) -> Credentials:
        """A new account (``invite``: the invitation code, where the coordinator runs an allowlist)."""
        body: dict[str, Any] = {"name": name}
        if team:
            body["team"] = team
        if invite:
            body["invite"] = invite
        data = await self._post("/api/accounts", body)
        return Credentials(int(data["account"]["id"]), str(data["token"]), float(data["expires_at"]))

    async def bind_host(self, credentials: Credentials, identity: Identity) -> bool:
        """Bind ``identity`` to the account; True if newly bound (idempotent)."""
        from engine.wire.statements import bind_message

        body = {
            "public_key": base64.b64encode(identity.public_key).decode(),
            "signature": base64.b64encode(identity.sign(bind_message(credentials.account_id))).decode(),
        }
        data = await self._post("/api/hosts", body, credentials.token)
        return str(data.get("peer_id")) == identity.peer_id

    async def refresh(self, credentials: Credentials) -> Credentials:
        data = await self._post("/api/tokens/refresh", None, credentials.token)
        return Credentials(credentials.account_id, str(data["token"]), float(data["expires_at"]))

    async def assignment(
        self, token: str, peer_id: str, device: str, memory_bytes: int, upload_bytes_per_s: int = 0
    ) -> Assignment:
        body = {
            "peer_id": peer_id,
            "device": device,
            "memory_bytes": memory_bytes,
            "upload_bytes_per_s": upload_bytes_per_s,
        }
        return parse_assignment(await self._post("/api/assignment", body, token))

    async def post_receipts(self, token: str, batch: list[dict[str, Any]]) -> dict[str, Any]:
        """A batch of signed receipts (a trainer account's token): the ledger's answer."""
        answer: dict[str, Any] = await self._post("/api/receipts", {"receipts": batch}, token)
        return answer

    async def trainer_login(self, name: str, code: str) -> Credentials:
        """A trainer token for ``name``, for the operator's single-use login code (``lah train login``)."""
        data = await self._post("/api/trainers/login", {"name": name, "code": code})
        return Credentials(int(data["account"]["id"]), str(data["token"]), float(data["expires_at"]))

    async def experiment(self, token: str, name: str) -> dict[str, Any]:
        """An experiment's config (a trainer account's token); 404 ``unknown_experiment``."""
        from urllib.parse import quote

        data = await self.get(f"/api/experiments/{quote(name, safe='')}", token)
        try:
            return dict(data["experiment"])
        except (KeyError, TypeError, ValueError) as e:
            raise CoordinatorError(200, "bad_reply", f"unexpected experiment reply: {e}") from e

    async def post_spot_check(self, token: str, report: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = await self._post("/api/spot-checks", report, token)
        return answer

    async def post_collab_status(self, token: str, report: dict[str, Any]) -> dict[str, Any]:
        """A collaborative trainer's status report (a trainer account's token): the coordinator's answer."""
        answer: dict[str, Any] = await self._post("/api/collab/status", report, token)
        return answer

    async def post_progress(self, token: str, experiment: str, report: dict[str, Any]) -> dict[str, Any]:
        """One evaluation of ``experiment``'s model (a trainer account's token; ``progress_report``
        builds the body): a point of this trainer's curve on the experiment's page."""
        from urllib.parse import quote

        path = f"/api/experiments/{quote(experiment, safe='')}/progress"
        answer: dict[str, Any] = await self._post(path, report, token)
        return answer
