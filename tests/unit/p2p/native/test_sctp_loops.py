"""The sender's per-chunk loops: the C twins (engine/p2p/native/sctp_send.c) against the Python ones
(engine/p2p/patches/sctp_loops.py), which are the oracle.

Hypothesis draws a sender's state (queues of chunks of any size, window, peer's window, recovery with
PRR, pacing, the I-bit agreement, messages waiting, TSNs across the 32-bit wrap); two transports are
built from it, each loop runs on one, and every field either may touch must be equal afterwards.
Whole associations with the C loops run in the other sender tests (they are the default).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.p2p import patches
from engine.p2p.patches import sctp_loops
from tests.unit.p2p.sctp_fakes import FakeDtls

try:
    from engine.p2p.native import _records
except ImportError as e:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built ({e}): run make native", pytrace=False)

CHUNK_FIELDS = ("tsn", "flags", "_in_flight", "_sent_count", "_sent_time", "_del", "_del_t", "_first_t",
                "_app_limited", "_acked", "_abandoned", "_book_size")  # fmt: skip
SENDER_FIELDS = (
    "_peer_rwnd", "_flight_size", "_prr_out", "_prr_quota", "_last_progress", "_delivered",
)  # fmt: skip


def _chunk(tsn: int, size: int, **fields: Any) -> Any:
    c = sctp.DataChunk(flags=fields.pop("flags", 0))
    c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn % 2**32, 1, 0, 51, b"x" * size
    c._book_size, c._in_flight, c._sent_count, c._sent_time = size, False, 0, None
    c._acked = c._abandoned = c._retransmit = False
    c._misses, c._expiry, c._max_retransmits = 0, None, None
    for name, value in fields.items():
        setattr(c, name, value)
    return c


_LOOP = asyncio.new_event_loop()  # the transports want one to exist; the loops never run it
patches.install(strict=True)  # the sender's own fields (its __init__), as a node has them


def _sender(state: dict[str, Any]) -> Any:
    asyncio.set_event_loop(_LOOP)
    t: Any = sctp.RTCSctpTransport(FakeDtls("client"))  # type: ignore[arg-type]
    first = state["first_tsn"]
    t._sent_queue = deque(
        _chunk(first + i, size, _in_flight=inf, _acked=ack, _abandoned=ab, _sent_time=sent, _sent_count=1)
        for i, (size, inf, ack, ab, sent) in enumerate(state["sent"])
    )
    t._flight_size = sum(c._book_size for c in t._sent_queue if c._in_flight)
    base = first + len(state["sent"])
    outbound = enumerate(state["outbound"])
    t._outbound_queue = deque(_chunk(base + i, size, flags=f) for i, (size, f) in outbound)
    t._peer_rwnd = state["peer_rwnd"]
    t._cc.cwnd = state["cwnd"]
    t._cc.pacing_rate = state["pacing_rate"]
    t._pace_tokens = state["tokens"]
    t._in_recovery = state["in_recovery"]
    t._prr_out, t._prr_quota = state["prr_out"], state["prr_quota"]
    t._delivered, t._delivered_time, t._first_sent_time = state["delivered"], 12.5, 11.25
    t._app_limited_until = state["app_limited_until"]
    t._lah_mark_waits = state["mark_waits"]
    t._data_channel_queue = deque([("channel", 51, b"x")] * state["messages_waiting"])
    t._flushing = state["flushing"]
    t._last_progress = 1.0
    return t


def _fields(t: Any) -> dict[str, Any]:
    def chunks(q: Any) -> list[tuple[Any, ...]]:
        return [tuple(getattr(c, name, None) for name in CHUNK_FIELDS) for c in q]

    return {
        **{name: getattr(t, name) for name in SENDER_FIELDS},
        "tokens": round(t._pace_tokens, 6),
        "rwnd_limited": t._lah_stats.rwnd_limited,
        "outbound": chunks(t._outbound_queue),
        "sent": chunks(t._sent_queue),
    }


sizes = st.integers(1, 1200)
states = st.fixed_dictionaries(
    {
        "first_tsn": st.sampled_from([1, 2**32 - 5]),
        "sent": st.lists(
            st.tuples(sizes, st.booleans(), st.booleans(), st.booleans(), st.floats(0, 10)), max_size=8
        ),
        "outbound": st.lists(st.tuples(sizes, st.sampled_from([0, 1, 2, 3, 4])), max_size=12),
        "peer_rwnd": st.integers(0, 20_000),
        "cwnd": st.integers(1200, 20_000),
        "pacing_rate": st.sampled_from([None, 0.0, 1e6]),
        "tokens": st.floats(-2000, 20_000),
        "in_recovery": st.booleans(),
        "prr_out": st.integers(0, 5000),
        "prr_quota": st.integers(-1000, 10_000),
        "delivered": st.integers(0, 10**9),
        "app_limited_until": st.integers(0, 10**9),
        "mark_waits": st.booleans(),
        "messages_waiting": st.integers(0, 2),
        "flushing": st.booleans(),
    }
)


@settings(max_examples=200, deadline=None)
@given(states, st.floats(0, 30_000))
def test_take_new_chunks_in_c_does_what_python_does(state: dict[str, Any], budget: float) -> None:
    py, c = _sender(state), _sender(state)
    burst_py: list[Any] = []
    burst_c: list[Any] = []
    got_py = sctp_loops.take_new_chunks(py, budget, 20.0, burst_py)
    got_c = _records.take_new_chunks(c, budget, 20.0, burst_c)
    assert (round(got_c[0], 6), *got_c[1:]) == (round(got_py[0], 6), *got_py[1:])
    assert [x.tsn for x in burst_c] == [x.tsn for x in burst_py]
    assert _fields(c) == _fields(py)


@settings(max_examples=200, deadline=None)
@given(states, st.integers(-3, 12))
def test_ack_cumulative_in_c_does_what_python_does(state: dict[str, Any], ahead: int) -> None:
    py, c = _sender(state), _sender(state)
    cum = (state["first_tsn"] + ahead) % 2**32  # before, inside and past the sent queue
    n_py, newest_py = sctp_loops.ack_cumulative(py, cum)
    n_c, newest_c = _records.ack_cumulative(c, cum)
    assert n_c == n_py
    assert (newest_c is None) == (newest_py is None)
    if newest_py is not None:
        assert newest_c.tsn == newest_py.tsn
    assert _fields(c) == _fields(py)


def test_the_c_loops_refuse_what_is_not_a_sender() -> None:
    with pytest.raises(AttributeError):
        _records.take_new_chunks(object(), 1000.0, 1.0, [])
    with pytest.raises(TypeError):
        _records.take_new_chunks(object(), 1000.0, 1, [])  # now: a float, as time.monotonic() gives
    with pytest.raises(ValueError, match="32 bits"):
        _records.ack_cumulative(object(), 2**32)
    t = _sender({**_EMPTY, "outbound": [(100, 3)]})
    t._outbound_queue[0]._book_size = "big"  # a corrupted chunk: an error, and nothing moved
    with pytest.raises(TypeError):
        _records.take_new_chunks(t, 1000.0, 1.0, [])
    assert len(t._outbound_queue) == 1 and not t._sent_queue


_EMPTY: dict[str, Any] = {
    "first_tsn": 1, "sent": [], "outbound": [], "peer_rwnd": 10_000, "cwnd": 10_000, "pacing_rate": None,
    "tokens": 0.0, "in_recovery": False, "prr_out": 0, "prr_quota": 0, "delivered": 0,
    "app_limited_until": 0, "mark_waits": False, "messages_waiting": 0, "flushing": False,
}  # fmt: skip
