"""The notifications replicas send each other (coordinator.hub.relay), as pure functions: every kind
survives the round trip whatever its frame holds, and anything else is a typed error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.hub import relay
from coordinator.hub.relay import BadNotification, Deliver, Evict, RelayError, Stored, Sweep
from coordinator.hub.signaling import SignalingHub

PEER = "a" * 40


@pytest.mark.parametrize(
    "n",
    [
        Deliver(PEER, "r1", 7, "b" * 40, '{"signal":1}'),
        Deliver(PEER, "r1", None, "", '{"error":"x"}'),
        Deliver(PEER, "r1", 0, "b" * 40, ""),
        Evict(PEER, "c0ffee"),
        Stored(123456789012),
        Sweep(),
    ],
)
def test_every_kind_round_trips(n: relay.Notification) -> None:
    assert relay.decode(relay.encode(n)) == n


@given(st.text())
def test_any_frame_round_trips(frame: str) -> None:
    n = Deliver(PEER, "r1", 3, "b" * 40, frame)  # tabs, newlines and all: the frame is the tail
    assert relay.decode(relay.encode(n)) == n


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "s\nextra",
        "x\tsomething",
        "d\tto\torigin\t1",  # a field short
        "d\tto\torigin\tone\tsender\n{}",  # ref not a number
        "e\tpeer",
        "e\tpeer\tconn\nframe",
        "f\tnot-a-number",
        "f\t1\t2",
        "f\t1\nframe",
    ],
)
def test_anything_else_is_a_bad_notification(payload: str) -> None:
    with pytest.raises(BadNotification):
        relay.decode(payload)


def test_notify_limit_counts_bytes_not_characters() -> None:
    assert relay.fits_notify("x" * relay.MAX_NOTIFY_BYTES)
    assert not relay.fits_notify("x" * (relay.MAX_NOTIFY_BYTES + 1))
    assert not relay.fits_notify("é" * (relay.MAX_NOTIFY_BYTES // 2 + 1))  # two bytes each


def test_dsn_of_sqlalchemy_urls() -> None:
    assert relay.asyncpg_dsn("postgresql+asyncpg://u:p@h:5/db") == "postgresql://u:p@h:5/db"
    assert relay.asyncpg_dsn("postgresql://u@h/db") == "postgresql://u@h/db"
    for url in ("sqlite+aiosqlite:///x.sqlite3", "not a url"):
        with pytest.raises(RelayError):
            relay.asyncpg_dsn(url)


async def test_a_hub_without_a_group_stays_in_this_process() -> None:
    hub = SignalingHub()
    assert hub.group is None and hub.healthy()
    assert await hub.online_all() == hub.online() == []
    await hub.sweep_everywhere()  # nothing to recheck, nobody to ask
