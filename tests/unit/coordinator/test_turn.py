import base64
import hashlib
import hmac

from coordinator.hub.signaling import SignalingHub
from coordinator.hub.turn import TurnConfig, turn_credential


def test_credential_is_coturns_rest_scheme() -> None:
    username, password = turn_credential("s3cret", "ab" * 20, ttl_s=600, now=1_000_000)
    assert username == f"1000600:{'ab' * 20}"
    expected = base64.b64encode(hmac.new(b"s3cret", username.encode(), hashlib.sha1).digest()).decode()
    assert password == expected


def test_hub_mints_turn_per_peer() -> None:
    hub = SignalingHub(turn=TurnConfig(urls=("turn:127.0.0.1:3478",), secret="k", ttl_s=60))
    a, b = hub.ice_servers_for("a" * 40), hub.ice_servers_for("b" * 40)
    assert a[-1].urls == ["turn:127.0.0.1:3478"] and a[-1].username.endswith("a" * 40)  # type: ignore[union-attr]
    assert a[-1].credential != b[-1].credential
