"""The controlling agent gives direct pairs a head start over relayed ones (no sockets)."""

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import aioice.ice as ice
import pytest

from engine.p2p.patches import ice as nom

State = ice.CandidatePair.State


def pair(local: str, remote: str, state: Any = State.WAITING) -> Any:
    return SimpleNamespace(
        component=1,
        local_candidate=SimpleNamespace(type=local),
        remote_candidate=SimpleNamespace(type=remote),
        state=state,
    )


class FakeConnection:
    def __init__(self, controlling: bool, pairs: list[Any]) -> None:
        self.ice_controlling = controlling
        self._check_list = pairs
        self._nominated: dict[int, Any] = {}
        self.completed: list[Any] = []

    def check_state(self, p: Any, state: Any) -> None:
        p.state = state

    def check_complete(self, p: Any) -> None:
        self.completed.append(p)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float]]:
    calls: list[tuple[Any, float]] = []

    async def original(self: Any, p: Any) -> None:
        calls.append((p, time.monotonic()))

    monkeypatch.setattr(nom, "_original_check_start", original)
    return calls


async def test_relayed_check_dropped_when_a_direct_pair_wins(started: list[tuple[Any, float]]) -> None:
    direct, relayed = pair("srflx", "srflx", State.IN_PROGRESS), pair("relay", "srflx")
    conn = FakeConnection(True, [direct, relayed])
    task = asyncio.ensure_future(nom.check_start(conn, relayed))
    await asyncio.sleep(0.1)
    assert relayed.state == State.IN_PROGRESS and not started  # waiting, not yet checked
    conn._nominated[1] = direct
    await asyncio.wait_for(task, 2)
    assert relayed.state == State.FAILED and conn.completed == [relayed] and not started


async def test_relayed_check_starts_after_the_grace(started: list[tuple[Any, float]]) -> None:
    relayed = pair("host", "relay")
    conn = FakeConnection(True, [pair("srflx", "host", State.IN_PROGRESS), relayed])
    t0 = time.monotonic()
    await asyncio.wait_for(nom.check_start(conn, relayed), 3)
    assert started and started[0][1] - t0 >= nom.RELAY_GRACE_S * 0.9


@pytest.mark.parametrize(
    ("controlling", "local", "others"),
    [
        (True, "relay", [State.FAILED]),  # every direct pair failed: no reason to wait
        (False, "relay", [State.IN_PROGRESS]),  # the controlled side never waits
        (True, "srflx", [State.IN_PROGRESS]),  # direct pairs never wait
    ],
)
async def test_no_wait(
    started: list[tuple[Any, float]], controlling: bool, local: str, others: list[Any]
) -> None:
    p = pair(local, "host")
    conn = FakeConnection(controlling, [*(pair("host", "host", s) for s in others), p])
    t0 = time.monotonic()
    await asyncio.wait_for(nom.check_start(conn, p), 1)
    assert started and started[0][1] - t0 < 0.2


async def test_turn_failures_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refused(**kwargs: Any) -> Any:
        raise ConnectionError("STUN transaction failed (401 - Unauthorized)")

    monkeypatch.setattr(nom, "_original_relayed_candidate", refused)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        await nom.relayed_candidate(turn_server=("100.64.0.1", 3478))
    assert nom.recent_turn_failures(t0) == [
        "TURN server ('100.64.0.1', 3478) refused: STUN transaction failed (401 - Unauthorized)"
    ]
    assert nom.recent_turn_failures(time.monotonic() + 1) == []
