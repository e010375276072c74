"""The coordinator's client, what it reads without a network: an assignment's reply, its proofs and
the coordinator's key, and every malformed reply as a ``CoordinatorError`` (``bad_reply``)."""

from __future__ import annotations

import pytest

from engine.account import CoordinatorError
from engine.account.coordinator_api import parse_assignment
from engine.moe import ExpertSpec


def test_assignment_parsing() -> None:
    expert = {"experiment": "ffn", "uid": "ffn.0.1", "spec": {"arch": "ffn", "dim": 16}, "expires_at": 5}
    raw = {
        "experts": [expert],
        "bootstrap": ["ab" * 20],
        "ttl_s": 3600,
    }
    got = parse_assignment(raw)
    assert got.specs == {"ffn.0.1": ExpertSpec("ffn", 16)}
    assert got.bootstrap == ("ab" * 20,)
    with pytest.raises(CoordinatorError, match="bad_reply"):
        parse_assignment({"experts": [{"uid": "x"}]})
    bad_spec = {**expert, "spec": {"arch": "nope", "dim": 1}}
    with pytest.raises(CoordinatorError):
        parse_assignment({"experts": [bad_spec], "bootstrap": [], "ttl_s": 1})
    # The coordinator's assignment proofs and key travel base64; anything else is a bad reply.
    proven = parse_assignment({**raw, "experts": [{**expert, "proof": "AAEC"}], "coordinator_key": "AwQ="})
    assert proven.experts[0].proof == b"\x00\x01\x02" and proven.coordinator_key == b"\x03\x04"
    assert got.experts[0].proof == b"" and got.coordinator_key == b""
    with pytest.raises(CoordinatorError, match="bad_reply"):
        parse_assignment({**raw, "experts": [{**expert, "proof": "not base64!"}]})
