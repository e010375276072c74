"""Short-lived TURN credentials, as coturn's ``use-auth-secret`` (the TURN REST API draft) checks them.

The coordinator and coturn share a secret. A credential is ``username = "<expiry unix time>:<peer id>"``
and ``password = base64(HMAC-SHA1(secret, username))``; coturn recomputes the HMAC and refuses expired
usernames, so nothing is stored and a leaked credential dies on its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

from engine.p2p.signaling_protocol import IceServer


@dataclass(frozen=True)
class TurnConfig:
    urls: tuple[str, ...]
    secret: str
    ttl_s: int = 3600


def turn_credential(secret: str, peer_id: str, ttl_s: int, now: float | None = None) -> tuple[str, str]:
    expiry = int((time.time() if now is None else now) + ttl_s)
    username = f"{expiry}:{peer_id}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def turn_server(config: TurnConfig, peer_id: str) -> IceServer:
    username, password = turn_credential(config.secret, peer_id, config.ttl_s)
    return IceServer(urls=list(config.urls), username=username, credential=password)
